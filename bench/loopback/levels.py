"""One target: its database and processes, started once; then its levels, each as often as the caller asks
(warm-up, measured load, the proxies' usage, the receipts check); then its final checks."""

import contextlib
import os
from pathlib import Path
from typing import Any

from bench.core import seeding
from bench.core.databases import Db, migrate, pg_unavailable, settled
from bench.core.loadgen import percentile
from bench.core.processes import BenchError, LoadSpec, Process, start_mitmdump, start_receipts_proxy, write_proxy_config
from bench.core.usage import PgServerUsage, ProxyLevelUsage, mib, proc_status
from bench.loopback.profiling import profile
from bench.loopback.session import Row, Session
from bench.loopback.targets import Target

LOAD_RESULT_KEYS = ("requests", "ok", "errors", "rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "elapsed_s")


def run_target(session: Session, target: Target, growth: int, rows: list[Row]) -> None:
    """Every level of one target, once; each row goes into `rows` as soon as it is measured (the growth scenario)."""
    run = TargetRun(session, target, growth)
    try:
        if not run.start():
            return
        for concurrency in session.args.concurrency:
            row = run.level(concurrency, 0)
            rows.append(row)
            print(f"  {progress_line(row)}", flush=True)
        run.finish()
    finally:
        run.stop()


class TargetRun:
    """One target on a database holding `growth` seeded receipts: its database, its processes, its levels."""

    def __init__(self, session: Session, target: Target, growth: int) -> None:
        self.session, self.args = session, session.args
        self.target, self.growth = target, growth
        self.db: Db | None = None
        self.config: Path | None = None
        self.procs: list[Process] = []
        self.ports = [session.upstream_port]  # where the load goes: the upstream for (a), else one port per proxy
        self.sent = 0
        self.info: Row = {"target": target.key, "label": target.label, "growth": growth}

    def start(self) -> bool:
        """The database and the proxies; False if the growth seeding did not finish in time (nothing to measure)."""
        if self.target.kind == "receipts" and not self.prepare_database():
            return False
        if self.target.kind != "direct":
            self.start_proxies()
        return True

    def finish(self) -> None:
        """After the last level: the --profile recording, every receipt the target was sent, the proxies' memory."""
        if self.procs and self.profiled():
            self.sent += profile(self.session, self.target, self.procs[0].pid, self.ports[0])
        if self.db is not None:
            self.check_all_receipts(self.db)
        if self.procs:
            memory = [proc_status(proc.pid) for proc in self.procs]
            self.info["peak_rss_mib"] = max(mib(status.get("VmHWM", 0)) for status in memory)
            self.info["rss_end_mib"] = max(mib(status.get("VmRSS", 0)) for status in memory)
            for proxy, status in zip(self.info.get("proxies", []), memory):
                proxy["peak_rss_mib"] = mib(status.get("VmHWM", 0))
                proxy["rss_end_mib"] = mib(status.get("VmRSS", 0))
        self.info["requests_sent"] = self.sent

    def stop(self) -> None:
        for proc in self.procs:
            self.session.procs.stop(proc)
        self.procs = []
        self.session.targets_info[f"{self.target.key}/g{self.growth}"] = self.info

    def prepare_database(self) -> bool:
        """A fresh, migrated, seeded database; False if seeding did not finish in time."""
        if self.target.db == "sqlite":
            self.db = Db.fresh_sqlite(self.session.tmp / f"receipts-{self.target.key}-g{self.growth}.db")
        else:
            problem = pg_unavailable(self.args.pg_admin_url)
            if problem:
                raise BenchError(f"PostgreSQL at {self.args.pg_admin_url} is not reachable: {problem}")
            database = self.pg_database()
            self.session.pg_databases.add(database)
            self.db = Db.fresh_postgres(self.args.pg_admin_url, database)
        self.config = write_proxy_config(self.session.tmp, self.target.key, self.db.url, not self.args.commit_first)
        migrate(self.config, self.db.url)
        seed = self.seed(self.db)
        seed["db_bytes"] = self.db.size_bytes()
        self.info["seed"] = seed
        if seed.get("skipped"):
            self.info["skipped"] = seed["skipped"]
            print(f"  {self.target.label} growth {self.growth}: skipped, {seed['skipped']}", flush=True)
            return False
        return True

    def pg_database(self) -> str:
        """--pg-database for (d); another one for (e), since both targets' proxies run at the same time."""
        if self.target.key == "postgres":
            return self.args.pg_database
        return f"{self.args.pg_database}_{self.target.key.replace('-', '_')}"

    def seed(self, db: Db) -> dict[str, Any]:
        if not self.growth:
            return {"seeded": 0, "seconds": 0.0}
        return seeding.seed(db.url, self.growth, self.session.upstream_port, self.args.seed_budget)

    def start_proxies(self) -> None:
        self.ports = []
        proxies: list[Row] = []
        for i in range(self.target.proxies):
            suffix = f"-p{i + 1}" if i else ""
            log = self.session.logs / f"{self.target.key}-g{self.growth}{suffix}.log"
            confdir = self.session.tmp / f"mitm-{self.target.key}{suffix}"
            if self.target.kind == "mitmdump":
                proc, port = start_mitmdump(self.session.procs, log, confdir)
            else:
                assert self.db is not None and self.config is not None
                proc, port = start_receipts_proxy(self.session.procs, log, confdir, self.config, self.db.url)
            self.procs.append(proc)
            self.ports.append(port)
            proxies.append({"pid": proc.pid, "rss_idle_mib": mib(proc_status(proc.pid).get("VmRSS", 0))})
        self.info["rss_idle_mib"] = max(p["rss_idle_mib"] for p in proxies)
        if len(proxies) > 1:
            self.info["proxies"] = proxies

    def level(self, concurrency: int, round_no: int) -> Row:
        """One measured level (after its warm-up) under a path prefix of its own, so each round is checked alone."""
        prefix = f"/bench/{self.session.run_id}/{self.target.key}/g{self.growth}/c{concurrency}/r{round_no}"
        warm = None
        if self.args.warmup:
            warm = self.load(self.args.warmup, concurrency, prefix + "/w")
            self.sent += self.args.warmup
        if self.db is not None and self.db.kind == "postgres":
            # What autovacuum does within a minute on a default server. The local one may run with autovacuum
            # off (`SHOW autovacuum`): then a fresh database's tables never get statistics, the plans chosen while
            # they were empty stay, and its server CPU per write is many times that on an analysed one (bench/README.md).
            self.db.analyze()
        row: Row = {
            "target": self.target.key,
            "label": self.target.label,
            "concurrency": concurrency,
            "growth": self.growth,
            "round": round_no,
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        journaled = self.target.kind == "receipts"
        usages = [ProxyLevelUsage(proc.pid, journaled) for proc in self.procs]
        server = PgServerUsage(self.db.name) if self.db is not None and self.db.kind == "postgres" else None
        with contextlib.ExitStack() as stack:
            for usage in usages:
                stack.enter_context(usage)
            result = self.load(self.args.requests, concurrency, prefix + "/m")
        self.sent += self.args.requests
        row.update({k: result[k] for k in LOAD_RESULT_KEYS})
        row["error_kinds"] = result["error_kinds"]
        if "clients" in result:
            row["clients"] = result["clients"]
        if warm and warm["errors"]:
            row["errors"] += warm["errors"]
            row["error_kinds"] = {**row["error_kinds"], **{f"warmup {k}": v for k, v in warm["error_kinds"].items()}}
        if usages:
            row.update(proxies_usage(usages, result, self.ports))
        if server is not None:
            row["postgres_server"] = server.summary(result["ok"])
        if self.db is not None:
            row["verify"] = self.verify_level(self.db, concurrency, prefix + "/m")
        if row["errors"]:
            self.fail(f"c{concurrency} round {round_no}: {row['errors']} errors {row['error_kinds']}")
        return row

    def load(self, requests: int, concurrency: int, prefix: str) -> Row:
        """`requests` POSTs at `concurrency`, split across the target's ports (one load client each, at once)."""
        proxied = self.target.kind != "direct"
        journaled = self.target.kind == "receipts"
        if len(self.ports) == 1:
            return self.session.load(self.ports[0], proxied, requests, concurrency, prefix, journaled)
        specs = split_load(self.ports, requests, concurrency, prefix)
        results = self.session.load_many(specs, proxied, journaled)
        return merge_results(specs, results)

    def verify_level(self, db: Db, concurrency: int, prefix: str) -> Row:
        """Exactly N receipts under the level's prefix, all succeeded, with 3N transitions."""
        states, transitions = settled(lambda: db.states_under(prefix), lambda read: read[0])
        expected = self.args.requests
        good = states == {"succeeded": expected} and transitions == 3 * expected
        if not good:
            self.fail(
                f"{prefix}: receipts {states}, transitions {transitions}; "
                f"expected {expected} succeeded, {3 * expected} transitions"
            )
        return {"states": states, "transitions": transitions, "expected_succeeded": expected, "ok": good}

    def check_all_receipts(self, db: Db) -> None:
        """Every request this target was sent left one succeeded receipt."""
        overall = settled(db.states_not_seeded, lambda states: states)
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


def split(total: int, weights: list[int]) -> list[int]:
    """`total` in parts proportional to `weights`, the remainder going to the first parts."""
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    for i in range(total - sum(parts)):
        parts[i % len(parts)] += 1
    return parts


def split_load(ports: list[int], requests: int, concurrency: int, prefix: str) -> list[LoadSpec]:
    """One load client per port, the concurrency split evenly (the first ones get the remainder) and the requests
    in proportion to it; a port whose share of the concurrency is 0 (c=1 across two proxies) gets no client."""
    workers = split(concurrency, [1] * len(ports))
    counts = split(requests, workers)
    return [
        LoadSpec(port, n, c, f"{prefix}/p{i + 1}")
        for i, (port, n, c) in enumerate(zip(ports, counts, workers, strict=True))
        if c > 0 and n > 0
    ]


def merge_results(specs: list[LoadSpec], results: list[Row]) -> Row:
    """Several load clients' measured phases as one: their requests summed, req/s = all successes over the
    longest client's elapsed time, the percentiles over all their latencies together."""
    latencies = sorted(v for r in results for v in r.pop("latencies_ms"))
    elapsed = max(r["elapsed_s"] for r in results)
    ok = sum(r["ok"] for r in results)
    error_kinds: dict[str, int] = {}
    for r in results:
        for kind, count in r["error_kinds"].items():
            error_kinds[kind] = error_kinds.get(kind, 0) + count
    return {
        "requests": sum(r["requests"] for r in results),
        "ok": ok,
        "errors": sum(r["errors"] for r in results),
        "error_kinds": error_kinds,
        "elapsed_s": elapsed,
        "rps": round(ok / elapsed, 2) if elapsed > 0 else 0.0,
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1] if latencies else None,
        "mean_ms": round(sum(latencies) / len(latencies), 3) if latencies else None,
        "clients": [
            {"port": spec.port, "concurrency": spec.concurrency} | {k: r[k] for k in LOAD_RESULT_KEYS}
            for spec, r in zip(specs, results, strict=True)
        ],
    }


def proxies_usage(usages: list[ProxyLevelUsage], result: Row, ports: list[int]) -> Row:
    """The usage fields of a level's row: one proxy's as they are; for several, per proxy (each per its own
    requests) under "proxies", and together (CPU summed over all requests, the highest peak RSS) as for one."""
    if len(usages) == 1:
        return usages[0].summary(result["ok"], result["elapsed_s"])
    ok_by_port = {c["port"]: c["ok"] for c in result.get("clients", [])}
    each = [
        usage.summary(ok_by_port.get(port, 0), result["elapsed_s"]) | {"port": port, "ok": ok_by_port.get(port, 0)}
        for usage, port in zip(usages, ports, strict=True)
    ]
    ok = result["ok"]
    proxy = combined([e["proxy"] for e in each], ok)
    writers = [e["writer"] for e in each if e["writer"] is not None]
    writer = combined(writers, ok) if writers else None
    both = None
    if (
        writer is not None
        and len(writers) == len(each)
        and None not in (proxy["cpu_ms_per_request"], writer["cpu_ms_per_request"])
    ):
        both = round(proxy["cpu_ms_per_request"] + writer["cpu_ms_per_request"], 3)
    return {"proxy": proxy, "writer": writer, "proxy_writer_cpu_ms_per_request": both, "proxies": each}


def combined(summaries: list[Row], ok: int) -> Row:
    """Several processes' level usage as one: CPU summed (per request of all of them), the highest peak RSS."""
    if any(s["cpu_ms"] is None for s in summaries):
        return {"cpu_ms": None, "cpu_ms_per_request": None, "peak_rss_mib": None, "combined": len(summaries)}
    cpu_ms = sum(s["cpu_ms"] for s in summaries)
    growths = [s["rss_growth_in_level_mib"] for s in summaries if s.get("rss_growth_in_level_mib") is not None]
    return {
        "cpu_ms": round(cpu_ms, 1),
        "cpu_ms_per_request": round(cpu_ms / ok, 3) if ok else None,
        "peak_rss_mib": max(s["peak_rss_mib"] for s in summaries),
        "rss_growth_in_level_mib": max(growths) if growths else None,
        "combined": len(summaries),
    }


def progress_line(row: Row) -> str:
    proxy, writer = row.get("proxy"), row.get("writer")
    usage = f", proxy peak {proxy['peak_rss_mib']} MiB, {proxy['cpu_ms_per_request']} ms CPU/req" if proxy else ""
    if writer:
        usage += f", writer {writer['cpu_ms_per_request']} ms CPU/req"
    rounds = f" r{row['round']}" if "round" in row else f" x{row['rounds']}"
    return (
        f"{row['label']:<28} g={row['growth']:<8} c={row['concurrency']:<3}{rounds:<4} {row['rps']:>9.1f} req/s  "
        f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  errors {row['errors']}{usage}"
    )
