"""A journal after a year of history: the write path and what operators run, beside an empty journal.

    .venv/bin/python bench/growth/journal.py --sizes 0,1000000 [--databases sqlite,postgres] [--out DIR]

For each database and history size: a fresh migrated journal seeded with that many receipts (bench/growth/
history.py: most on one account and target, 5,000 open unknowns, 20,000 recent successes; PostgreSQL
VACUUM ANALYZEd, as its autovacuum would), one `receipts proxy` on it with the admin server, and:
- writes: new intents at c=1 (p50) and c=32 (req/s), and repeats of recent successes on the skewed target (each
  asks whether a later write ended its replay window: the case that read the history) at c=1 (p50);
- what operators run: a `/metrics` scrape, the review page `/`, `receipts stats` and `receipts ls --state
  unknown` (each the median of --reads, the commands with their start);
- prune of 90 % of the history while a load client writes at c=4: writes refused, p99 and max latency, against
  the same load alone; a prune still running after --prune-budget seconds is stopped, and the rows it pruned by
  then and its rate are reported.
Writes `journal.json` into --out and prints the Markdown table of docs/performance.md.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

import httpx

from bench.core.databases import Db, migrate, pg_url_for
from bench.core.processes import (
    LoadSpec,
    Processes,
    bench_env,
    free_port,
    receipts_cmd,
    run_loadgens,
    start_receipts_proxy,
    start_upstream,
    wait_port,
)
from bench.growth.history import RECENT_S, SKEWED_PATH, YEAR_S, seed_history

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
Row = dict[str, Any]


class Journal:
    """One database at one history size: its processes and what was measured on it."""

    def __init__(self, kind: str, size: int, tmp: Path, args: argparse.Namespace):
        self.kind, self.size, self.tmp, self.args = kind, size, tmp, args
        self.procs = Processes()
        self.run_id = uuid.uuid4().hex[:8]
        name = f"receipts_bench_journal_{size}"
        self.reused = bool(size) and kind == "postgres" and args.reuse_seeded
        if self.reused:  # seeded by an earlier run, which left the database behind
            self.db = Db("postgres", pg_url_for(args.pg_admin_url, name))
        elif kind == "postgres":
            self.db = Db.fresh_postgres(args.pg_admin_url, name)
        else:
            self.db = Db.fresh_sqlite(tmp / f"journal-{size}.db")
        self.admin_port = free_port()
        self.config = tmp / f"config-{kind}-{size}.yaml"
        self.config.write_text(
            f"database:\n  url: {json.dumps(self.db.url)}\nsecret_file: {json.dumps(str(tmp / 'secret'))}\n"
            f"admin:\n  enabled: true\n  listen_port: {self.admin_port}\nlogging:\n  level: warning\n"
        )
        self.row: Row = {"database": kind, "receipts": size}

    def start(self) -> None:
        migrate(self.config, self.db.url)
        self.upstream = start_upstream(self.procs, self.tmp, 7200, self.seeded_port() if self.reused else 0)
        if self.size and not self.reused:
            self.row["seeding"] = seed_history(self.db.url, self.size, self.upstream)
            print(f"  seeded {self.size} in {self.row['seeding']['seconds']} s", flush=True)
        self.row["db_bytes"] = self.db.size_bytes()
        proc, self.port = start_receipts_proxy(self.procs, self.tmp / f"proxy-{self.kind}-{self.size}.log",
                                               self.tmp / "confdir", self.config, self.db.url)  # fmt: skip
        wait_port(self.admin_port, proc, 60, None)
        self.load(200, 4, "warm-up")  # the writer's start, the first connections: unmeasured

    def seeded_port(self) -> int:
        """The upstream port the reused history was seeded for: the repeats' target must be its target."""
        with self.db.connect() as conn:
            return int(conn.execute("SELECT port FROM receipts WHERE proxy_instance = 'bench-seed' LIMIT 1").fetchone()[0])

    def load(self, requests: int, concurrency: int, phase: str, latencies: bool = False) -> Row:
        spec = LoadSpec(self.port, requests, concurrency, f"/bench/{self.run_id}/{phase}/{uuid.uuid4().hex[:6]}")
        return run_loadgens([spec], run_id=self.run_id, upstream_port=self.upstream, expect_receipt=True, latencies=latencies)[0]

    def writes(self) -> None:
        self.row["c1_p50_ms"] = self.load(self.args.requests, 1, "c1")["p50_ms"]
        self.row["c32_rps"] = self.load(self.args.requests * 3, 32, "c32")["rps"]
        self.row["repeat_p50_ms"] = self.repeats()

    def repeats(self) -> float:
        """POSTs to the skewed target, then each again: the second is a replay (the window's question asked)."""
        url = f"http://127.0.0.1:{self.upstream}{SKEWED_PATH}"
        bodies = [{"repeat": self.run_id, "n": i} for i in range(self.args.repeats)]
        took = []
        with httpx.Client(proxy=f"http://127.0.0.1:{self.port}", trust_env=False, timeout=30) as client:
            for body in bodies:
                client.post(url, json=body).raise_for_status()
            for body in bodies:
                started = time.perf_counter()
                answer = client.post(url, json=body)
                took.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 201 or answer.headers.get("x-receipt-replayed") != "true":
                    raise RuntimeError(f"a repeat was not replayed: {answer.status_code} {dict(answer.headers)}")
        return round(statistics.median(took), 2)

    def reads(self) -> None:
        admin = f"http://127.0.0.1:{self.admin_port}"
        with httpx.Client(base_url=admin, trust_env=False, timeout=120) as client:
            self.row["scrape_ms"] = self.timed(lambda: client.get("/metrics").raise_for_status())
            self.row["page_ms"] = self.timed(lambda: client.get("/").raise_for_status())
        for name, cmd in (("stats_ms", ["stats"]), ("ls_unknown_ms", ["ls", "--state", "unknown", "--limit", "50"])):
            self.row[name] = self.timed(lambda cmd=cmd: self.receipts(*cmd))

    def timed(self, call: Any) -> float:
        took = []
        for _ in range(self.args.reads):
            started = time.perf_counter()
            call()
            took.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(took), 1)

    def receipts(self, *args: str) -> None:
        subprocess.run([*receipts_cmd(), *args, "--config", str(self.config)], check=True, capture_output=True,
                       env=bench_env(self.db.url), timeout=600)  # fmt: skip

    def prune_under_load(self) -> None:
        alones = [self.load(self.args.prune_requests, 4, "alone", latencies=True) for _ in range(self.args.alone_rounds)]
        prune = subprocess.Popen(
            [*receipts_cmd(), "prune", "--older-than", f"{self.prune_age_s()}s", "--json", "--config", str(self.config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=bench_env(self.db.url), text=True,
        )  # fmt: skip
        started, rounds = time.monotonic(), []
        while prune.poll() is None and time.monotonic() - started < self.args.prune_budget:
            rounds.append(self.load(self.args.prune_requests, 4, "during", latencies=True))
        stopped = prune.poll() is None
        if stopped:
            prune.terminate()
        out, err = prune.communicate(timeout=120)
        self.row["prune"] = {
            "seconds": round(time.monotonic() - started, 1), "stopped_at_budget": stopped, "code": prune.returncode,
            "result": _json_or(out, err), "alone": _latencies(*alones), "during": _latencies(*rounds) if rounds else None,
        }  # fmt: skip
        limit = self.row["prune"]["alone"]["p99_ms"] + 100
        for phase, measured in (("alone", alones), ("during", rounds)):
            if self.row["prune"][phase] is not None:
                self.row["prune"][phase]["over_p99_plus_100"] = sum(v > limit for r in measured for v in r["latencies_ms"])
        if stopped:
            self.row["prune"]["receipts_left"] = self.count_receipts()

    def prune_age_s(self) -> int:
        """The age of the newest tenth of the seeded history: older than that is 90 % of it."""
        return int(RECENT_S + YEAR_S / 10)

    def count_receipts(self) -> int:
        with self.db.connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM receipts").fetchone()[0])

    def stop(self) -> None:
        self.procs.stop_all()


def _json_or(out: str, err: str) -> Any:
    try:
        return json.loads(out)
    except ValueError:
        return {"stdout": out[-300:], "stderr": err[-300:]}


def _latencies(*rounds: Row) -> Row:
    lat = sorted(v for r in rounds for v in r["latencies_ms"])
    return {
        "answered": len(lat), "refused": sum(r["errors"] for r in rounds),
        "p50_ms": lat[len(lat) // 2] if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None, "max_ms": lat[-1] if lat else None,
    }  # fmt: skip


def measure(kind: str, size: int, args: argparse.Namespace, tmp: Path) -> Row:
    print(f"{kind} at {size} receipts", flush=True)
    journal = Journal(kind, size, tmp, args)
    try:
        journal.start()
        journal.writes()
        journal.reads()
        if size and args.prune_budget > 0:
            journal.prune_under_load()
    finally:
        journal.stop()
    return journal.row


def table(rows: list[Row]) -> str:
    lines = [
        "| database | receipts | write p50 c=1 | req/s c=32 | repeat p50 c=1 | scrape | page | `stats` | `ls --state unknown` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['database']} | {r['receipts']:,} | {r['c1_p50_ms']} ms | {r['c32_rps']} | {r['repeat_p50_ms']} ms "
            f"| {r['scrape_ms']} ms | {r['page_ms']} ms | {r['stats_ms']} ms | {r['ls_unknown_ms']} ms |"
        )
    lines += ["", "| database | receipts | prune | writes alone: answered, p99 / max, over p99 + 100 ms "
              "| during prune: answered, refused, p99 / max, over alone's p99 + 100 ms |", "|---|---:|---|---|---|"]  # fmt: skip
    for r in (r for r in rows if "prune" in r):
        p, a, d = r["prune"], r["prune"]["alone"], r["prune"]["during"] or {}
        how = f"{p['seconds']} s" + (f", stopped at the budget, {p.get('receipts_left'):,} left" if p["stopped_at_budget"] else "")
        lines.append(f"| {r['database']} | {r['receipts']:,} | {how} | {a['answered']}, {a['p99_ms']} / {a['max_ms']} ms, "
                     f"{a.get('over_p99_plus_100')} | {d.get('answered')}, {d.get('refused')}, {d.get('p99_ms')} / "
                     f"{d.get('max_ms')} ms, {d.get('over_p99_plus_100')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1_000_000])
    p.add_argument("--databases", type=lambda s: s.split(","), default=["sqlite", "postgres"])
    p.add_argument("--requests", type=int, default=1000, help="writes at c=1 (three times as many at c=32)")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--reads", type=int, default=5, help="times each read is timed (the median is reported)")
    p.add_argument("--prune-requests", type=int, default=1000, help="writes per round of the c=4 load")
    p.add_argument("--alone-rounds", type=int, default=5, help="rounds of the c=4 load without the prune (its baseline)")
    p.add_argument("--prune-budget", type=float, default=900.0, help="seconds a prune may run before it is stopped (0: no prune)")
    p.add_argument("--pg-admin-url", default=PG_ADMIN)
    p.add_argument("--reuse-seeded", action="store_true",
                   help="PostgreSQL: measure the journal an earlier run seeded and left (its size unchanged: no prune since)")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-journal"))
    p.add_argument("--tmp", type=Path, default=None, help="where the SQLite files go (default: a temporary directory)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="receipts-journal-", dir=args.tmp) as tmp:
        for kind in args.databases:
            for size in args.sizes:
                rows.append(measure(kind, size, args, Path(tmp)))
                (args.out / "journal.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
