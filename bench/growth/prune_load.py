"""`receipts prune` of most of a large history while agents write: does it refuse or stall a write?

A fresh database (SQLite, or PostgreSQL with --postgres) seeded with --history terminal receipts (bench/core/seeding.py:
receipt g of n completed 2 * (n - g) seconds ago), a `receipts proxy` on it, and a load client at --concurrency
sending journaled POSTs through it: once alone (the baseline), then again while `receipts prune` deletes 90 % of
the history (`--older-than` the newest 10 %'s age). PostgreSQL's autovacuum is off on this machine: the seeding
ends with ANALYZE, as autovacuum would. Prints one Markdown table: writes answered, refused (any non-201), p50,
p99 and max latency, for the baseline and during the prune, and the prune's own time and batches.

    .venv/bin/python bench/growth/prune_load.py --history 1000000 --concurrency 4 --requests 4000 [--postgres]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.databases import Db, migrate
from bench.core.processes import (
    LoadSpec,
    Processes,
    bench_env,
    receipts_cmd,
    run_loadgens,
    start_receipts_proxy,
    start_upstream,
    write_proxy_config,
)
from bench.core.seeding import seed


def prune_in_background(config: Path, db: Db, older_than_s: int, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        result = subprocess.run(
            [*receipts_cmd(), "prune", "--config", str(config), "--older-than", f"{older_than_s}s", "--json"],
            capture_output=True, text=True, env=bench_env(db.url), timeout=3600,
        )  # fmt: skip
        out.update(seconds=round(time.monotonic() - started, 1), code=result.returncode, **(json.loads(result.stdout or "{}")))
        if result.returncode != 0:
            out["error"] = result.stderr.strip()[-500:]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def load_during(port: int, upstream_port: int, run_id: str, args: argparse.Namespace, prefix: str, until: threading.Thread | None) -> dict[str, Any]:
    """Load in rounds of --requests until `until` ends, or --alone-rounds of them without it; every round's
    answers together."""
    rounds = []
    while True:
        spec = LoadSpec(port, args.requests, args.concurrency, f"/bench/{run_id}/{prefix}/{len(rounds)}")
        rounds.append(run_loadgens([spec], run_id=run_id, upstream_port=upstream_port, expect_receipt=True, latencies=True)[0])
        if (until is None and len(rounds) >= args.alone_rounds) or (until is not None and not until.is_alive()):
            break
    latencies = sorted(v for r in rounds for v in r["latencies_ms"])
    return {
        "latencies": latencies,
        "ok": len(latencies),
        "refused": sum(r["errors"] for r in rounds),
        "kinds": {k: v for r in rounds for k, v in r["error_kinds"].items()},
        "p50": latencies[len(latencies) // 2] if latencies else None,
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
        "max": latencies[-1] if latencies else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=2000, help="POSTs per round of load")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--alone-rounds", type=int, default=5, help="rounds of load without the prune (the baseline)")
    p.add_argument("--postgres", default=None, help="an admin URL (CREATE/DROP DATABASE): PostgreSQL instead of SQLite")
    args = p.parse_args()
    run_id = uuid.uuid4().hex[:10]
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="receipts-prune-") as tmp_dir:
        tmp = Path(tmp_dir)
        db = Db.fresh_postgres(args.postgres, "receipts_bench_prune") if args.postgres else Db.fresh_sqlite(tmp / "receipts.db")
        config = write_proxy_config(tmp, "prune", db.url)
        migrate(config, db.url)
        try:
            upstream_port = start_upstream(procs, tmp, 3600)
            seeded = seed(db.url, args.history, upstream_port, 3600)
            _proc, port = start_receipts_proxy(procs, tmp / "proxy.log", tmp / "confdir", config, db.url)
            run_loadgens([LoadSpec(port, 200, args.concurrency, f"/bench/{run_id}/warm-up")], run_id=run_id,
                         upstream_port=upstream_port, expect_receipt=True)  # unmeasured: the writer's start, first connections
            baseline = load_during(port, upstream_port, run_id, args, "baseline", None)
            pruned: dict[str, Any] = {}
            pruning = prune_in_background(config, db, 2 * args.history // 10, pruned)
            during = load_during(port, upstream_port, run_id, args, "during", pruning)
            pruning.join(3600)
        finally:
            procs.stop_all()
    print(f"history {seeded['seeded']} receipts ({db.kind}), seeded in {seeded['seconds']} s; load c={args.concurrency}")
    limit = baseline["p99"] + 100
    print(f"| phase | writes answered 201 | refused | p50 ms | p99 ms | max ms | over {limit:.0f} ms (alone's p99 + 100) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in (("alone", baseline), ("during prune", during)):
        over = sum(1 for v in r["latencies"] if v > limit)
        print(f"| {name} | {r['ok']} | {r['refused']} {r['kinds'] or ''} | {r['p50']} | {r['p99']} | {r['max']} | {over} |")
    print(f"prune: {json.dumps(pruned)}")
    return 0 if not during["refused"] and pruned.get("code") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
