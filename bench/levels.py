"""One target at each concurrency level: warm-up, measured load, the proxy's usage, the receipts check."""

import contextlib
import os
from pathlib import Path
from typing import Any

import seeding
from databases import Db, migrate, pg_unavailable
from processes import BenchError, Process, start_mitmdump, start_receipts_proxy, write_proxy_config
from profiling import profile
from session import Row, Session
from targets import Target
from usage import PgServerUsage, ProxyLevelUsage, mib, proc_status

LOAD_RESULT_KEYS = ("requests", "ok", "errors", "rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "elapsed_s")


def run_target(session: Session, target: Target, growth: int, rows: list[Row]) -> None:
    """Every level of one target; each row goes into `rows` as soon as it is measured."""
    TargetRun(session, target, growth).run(rows)


class TargetRun:
    """One target on a database holding `growth` seeded receipts: its database, its process, its levels."""

    def __init__(self, session: Session, target: Target, growth: int) -> None:
        self.session, self.args = session, session.args
        self.target, self.growth = target, growth
        self.db: Db | None = None
        self.config: Path | None = None
        self.proc: Process | None = None
        self.port = session.upstream_port
        self.sent = 0
        self.info: Row = {"target": target.key, "label": target.label, "growth": growth}

    def run(self, rows: list[Row]) -> None:
        try:
            if self.target.kind == "receipts" and not self.prepare_database():
                return
            if self.target.kind != "direct":
                self.start_proxy()
            for concurrency in self.args.concurrency:
                row = self.level(concurrency)
                rows.append(row)
                print(f"  {progress_line(row)}", flush=True)
            if self.proc is not None and self.profiled():
                self.sent += profile(self.session, self.target, self.proc.pid, self.port)
            if self.db is not None:
                self.check_all_receipts(self.db)
            if self.proc is not None:
                status = proc_status(self.proc.pid)
                self.info["peak_rss_mib"] = mib(status.get("VmHWM", 0))
                self.info["rss_end_mib"] = mib(status.get("VmRSS", 0))
            self.info["requests_sent"] = self.sent
        finally:
            if self.proc is not None:
                self.session.procs.stop(self.proc)
            self.session.targets_info[f"{self.target.key}/g{self.growth}"] = self.info

    def prepare_database(self) -> bool:
        """A fresh, migrated, seeded database; False if seeding did not finish in time."""
        if self.target.db == "sqlite":
            self.db = Db.fresh_sqlite(self.session.tmp / f"receipts-g{self.growth}.db")
        else:
            problem = pg_unavailable(self.args.pg_admin_url)
            if problem:
                raise BenchError(f"PostgreSQL at {self.args.pg_admin_url} is not reachable: {problem}")
            self.session.pg_used = True
            self.db = Db.fresh_postgres(self.args.pg_admin_url, self.args.pg_database)
        self.config = write_proxy_config(self.session.tmp, self.target.key, self.db.url)
        migrate(self.config, self.db.url)
        seed = self.seed(self.db)
        seed["db_bytes"] = self.db.size_bytes()
        self.info["seed"] = seed
        if seed.get("skipped"):
            self.info["skipped"] = seed["skipped"]
            print(f"  {self.target.label} growth {self.growth}: skipped, {seed['skipped']}", flush=True)
            return False
        return True

    def seed(self, db: Db) -> dict[str, Any]:
        if not self.growth:
            return {"seeded": 0, "seconds": 0.0}
        return seeding.seed(db.url, self.growth, self.session.upstream_port, self.args.seed_budget)

    def start_proxy(self) -> None:
        log = self.session.logs / f"{self.target.key}-g{self.growth}.log"
        confdir = self.session.tmp / f"mitm-{self.target.key}"
        if self.target.kind == "mitmdump":
            self.proc, self.port = start_mitmdump(self.session.procs, log, confdir)
        else:
            assert self.db is not None and self.config is not None
            self.proc, self.port = start_receipts_proxy(self.session.procs, log, confdir, self.config, self.db.url)
        self.info["rss_idle_mib"] = mib(proc_status(self.proc.pid).get("VmRSS", 0))

    def level(self, concurrency: int) -> Row:
        prefix = f"/bench/{self.session.run_id}/{self.target.key}/g{self.growth}/c{concurrency}"
        warm = None
        if self.args.warmup:
            warm = self.load(self.args.warmup, concurrency, prefix + "/w")
            self.sent += self.args.warmup
        row: Row = {
            "target": self.target.key,
            "label": self.target.label,
            "concurrency": concurrency,
            "growth": self.growth,
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        usage = ProxyLevelUsage(self.proc.pid, self.target.kind == "receipts") if self.proc is not None else None
        server = PgServerUsage(self.db.name) if self.db is not None and self.db.kind == "postgres" else None
        with usage or contextlib.nullcontext():
            result = self.load(self.args.requests, concurrency, prefix + "/m")
        self.sent += self.args.requests
        row.update({k: result[k] for k in LOAD_RESULT_KEYS})
        row["error_kinds"] = result["error_kinds"]
        if warm and warm["errors"]:
            row["errors"] += warm["errors"]
            row["error_kinds"] = {**row["error_kinds"], **{f"warmup {k}": v for k, v in warm["error_kinds"].items()}}
        if usage is not None:
            row.update(usage.summary(result["ok"], result["elapsed_s"]))
        if server is not None:
            row["postgres_server"] = server.summary(result["ok"])
        if self.db is not None:
            row["verify"] = self.verify_level(self.db, concurrency, prefix + "/m")
        if row["errors"]:
            self.fail(f"c{concurrency}: {row['errors']} errors {row['error_kinds']}")
        return row

    def load(self, requests: int, concurrency: int, prefix: str) -> Row:
        proxied = self.target.kind != "direct"
        journaled = self.target.kind == "receipts"
        return self.session.load(self.port, proxied, requests, concurrency, prefix, journaled)

    def verify_level(self, db: Db, concurrency: int, prefix: str) -> Row:
        """Exactly N receipts under the level's prefix, all succeeded, with 3N transitions."""
        states, transitions = db.states_under(prefix)
        expected = self.args.requests
        good = states == {"succeeded": expected} and transitions == 3 * expected
        if not good:
            self.fail(
                f"c{concurrency}: receipts {states}, transitions {transitions}; "
                f"expected {expected} succeeded, {3 * expected} transitions"
            )
        return {"states": states, "transitions": transitions, "expected_succeeded": expected, "ok": good}

    def check_all_receipts(self, db: Db) -> None:
        """Every request this target was sent left one succeeded receipt."""
        overall = db.states_not_seeded()
        self.info["receipts_after"] = overall
        if overall != {"succeeded": self.sent}:
            self.session.failures.append(
                f"{self.target.label} g{self.growth}: receipts table holds {overall}, expected {self.sent} succeeded"
            )
        self.info["db_bytes_after"] = db.size_bytes()

    def profiled(self) -> bool:
        args = self.args
        return self.growth == 0 and self.target.key in args.profile_targets and args.profile > 0

    def fail(self, what: str) -> None:
        self.session.failures.append(f"{self.target.label} g{self.growth} {what}")


def progress_line(row: Row) -> str:
    proxy, writer = row.get("proxy"), row.get("writer")
    usage = f", proxy peak {proxy['peak_rss_mib']} MiB, {proxy['cpu_ms_per_request']} ms CPU/req" if proxy else ""
    if writer:
        usage += f", writer {writer['cpu_ms_per_request']} ms CPU/req"
    return (
        f"{row['label']:<24} g={row['growth']:<8} c={row['concurrency']:<3} {row['rps']:>9.1f} req/s  "
        f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  errors {row['errors']}{usage}"
    )
