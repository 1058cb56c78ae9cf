"""The receipts benchmark: what journaling costs, side by side with plain mitmproxy and no proxy at all.

One command (loopback only; every process it starts is stopped in a finally block):

    .venv/bin/python bench/loopback/run.py [--requests 3000] [--concurrency 1,32] [--rounds 3] [--growth 0,100000,1000000]
                                  [--targets direct,mitmdump,sqlite,postgres,postgres-2] [--profile 15] [--out bench/results]
    .venv/bin/python bench/loopback/run.py --smoke --out /tmp/x      # tiny: 200 requests, c=1,8, 1 round, SQLite + mitmdump

It starts a raw-asyncio HTTP/1.1 keep-alive upstream (bench/core/upstream.py, its own process), then drives the
same bounded load of POSTs with small unique JSON bodies with a raw-asyncio keep-alive client
(bench/core/loadgen.py, its own process) at each concurrency level against
  (a) direct     the upstream itself,
  (b) mitmdump   plain `mitmdump` with no addon,
  (c) sqlite     `receipts proxy` on a fresh, migrated SQLite file (WAL, synchronous=FULL),
  (d) postgres   `receipts proxy` on a fresh, migrated PostgreSQL database,
  (e) postgres-2 two `receipts proxy` processes on another fresh PostgreSQL database, the load split across them.
Every target's processes are started once; then, for each concurrency level, --rounds times each target in
turn (interleaved, so that the machine's noise falls on all of them alike); the report gives each target and
level the median of its rounds. Each level is preceded by an unmeasured warm-up. For the proxies it samples
the process's RSS and peak RSS (/proc/PID/status VmRSS, VmHWM) and CPU time (/proc/PID/stat), and the same for
the proxy's journal writer child if it runs one, and the PostgreSQL server's CPU for the bench database. After
each level on (c)-(e) it checks in the database that exactly N receipts with that level and round's path prefix
exist, all `succeeded`, with 3N transitions. The growth scenario (--growth) repeats (c) and (d), one round per
level, with that many synthetic terminal receipts (and their transitions) bulk-inserted first. --profile S
records the receipts proxy on SQLite with py-spy for S seconds under concurrency-32 load and summarises where
the time goes.

Writes OUT/results.json, OUT/chart.png (not in --smoke), OUT/logs/, OUT/profile-*.txt|.md; prints a
Markdown report. Exits 1 if any request failed or a receipt count is wrong, 2 on bad usage.
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.databases import pg_drop
from bench.core.processes import REPO, BenchError, start_upstream
from bench.loopback.chart import chart
from bench.loopback.levels import run_target
from bench.loopback.report import document, markdown
from bench.loopback.rounds import run_interleaved
from bench.loopback.session import Row, Session
from bench.loopback.targets import TARGETS, Target

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
PG_DATABASE_DEFAULT = "receipts_bench"


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="receipts-bench-"))
    session = Session(args, run_id=uuid.uuid4().hex[:10], out=out, logs=out / "logs", tmp=tmp)
    out.mkdir(parents=True, exist_ok=True)
    session.logs.mkdir(parents=True, exist_ok=True)
    for old in session.logs.glob("*.log"):
        old.unlink()
    started = time.time()
    try:
        run_targets(session)
    finally:
        clean_up(session)
    doc = document(session, time.time() - started)
    write_results(session, doc)
    print()
    print(markdown(doc))
    print(f"results: {out / 'results.json'}")
    return 0 if not session.failures else 1


def run_targets(session: Session) -> None:
    """Every target on an empty history (interleaved rounds), then (c) and (d) on each --growth history."""
    args = session.args
    session.upstream_port = start_upstream(session.procs, session.logs, args.max_runtime)
    print(
        f"upstream on 127.0.0.1:{session.upstream_port}; {args.requests} requests per level, "
        f"concurrency {args.concurrency}, {args.rounds} round(s), warm-up {args.warmup}",
        flush=True,
    )
    run_interleaved(session)
    for growth in args.growth:
        for target in (TARGETS[key] for key in args.targets if TARGETS[key].growth):
            if growth == 0:
                rows = [r for r in session.runs if r["target"] == target.key]
                session.growth += [{**r, "reused_main_run": True} for r in rows]
                continue
            print(f"growth {growth}: {target.label}", flush=True)
            run_guarded(session, target, growth, session.growth, f"{target.label} growth {growth}")


def run_guarded(session: Session, target: Target, growth: int, rows: list[Row], what: str) -> None:
    """A failure is recorded, and the run goes on with the next target (the growth scenario)."""
    try:
        run_target(session, target, growth, rows)
    except BenchError as e:
        session.failures.append(f"{what}: {e}")
        print(f"  {what}: FAILED: {e}", flush=True)
    except Exception as e:  # a driver or OS error: record it, stop this target, go on with the next
        session.failures.append(f"{what}: {type(e).__name__}: {e}")
        print(f"  {what}: FAILED: {type(e).__name__}: {e}", flush=True)


def clean_up(session: Session) -> None:
    args = session.args
    session.procs.stop_all()
    if not args.keep:
        for database in sorted(session.pg_databases):
            with contextlib.suppress(Exception):
                pg_drop(args.pg_admin_url, database)
    if not args.keep:
        shutil.rmtree(session.tmp, ignore_errors=True)


def write_results(session: Session, doc: dict[str, Any]) -> None:
    """results.json, then the chart; a missing matplotlib fails a full run, not a smoke run."""
    results = session.out / "results.json"
    results.write_text(json.dumps(doc, indent=2))
    if session.args.no_chart:
        return
    try:
        chart(doc, session.out / "chart.png")
        doc["chart"] = str(session.out / "chart.png")
    except ImportError as e:
        message = f"no chart: {e} (pip install -e '.[bench]')"
        if session.args.smoke:
            print(message)
        else:
            session.failures.append(message)
            doc["failures"] = session.failures
            doc["ok"] = False
    results.write_text(json.dumps(doc, indent=2))


def int_list(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("values must not be negative")
    return values


def target_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in TARGETS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown target(s) {', '.join(bad)} (known: {', '.join(TARGETS)})")
    return names


def argument_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--requests", type=int, default=None, help="measured POSTs per target and concurrency (default 3000; smoke 200)"
    )
    p.add_argument("--concurrency", type=int_list, default=None, help="levels, e.g. 1,32 (default; smoke 1,8)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured requests before each level (default 200; smoke 20)")
    p.add_argument(
        "--targets",
        type=target_list,
        default=None,
        help="subset of direct,mitmdump,sqlite,postgres,postgres-2 (default all; smoke without the PostgreSQL ones)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="measurements of each target at each level, interleaved across the targets; the report gives their median "
        "(default 3; smoke 1)",
    )
    p.add_argument("--growth", type=int_list, default=[], help="history sizes for the growth scenario, e.g. 0,100000,1000000")
    p.add_argument(
        "--seed-budget",
        type=float,
        default=300.0,
        help="seconds allowed to seed one growth database; over it, that level is skipped",
    )
    p.add_argument("--profile", type=int, default=0, help="py-spy the receipts proxy for this many seconds under c=32 load")
    p.add_argument(
        "--profile-targets", type=target_list, default=["sqlite"], help="which receipts targets to profile (default sqlite)"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny and quick (< 60 s): 200 requests, c=1,8, 1 round, direct+mitmdump+sqlite, no growth, no chart",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--no-chart", action="store_true")
    p.add_argument(
        "--commit-first",
        action="store_true",
        help="run the receipts proxies with proxy.answer_first: false (every verdict commits before its answer)",
    )
    p.add_argument(
        "--pg-admin-url",
        default=os.environ.get("RECEIPTS_BENCH_PG_ADMIN_URL", PG_ADMIN_DEFAULT),
        help="a database on the server to connect to for CREATE/DROP DATABASE",
    )
    p.add_argument(
        "--pg-database",
        default=PG_DATABASE_DEFAULT,
        help="the database created afresh for (d) (default receipts_bench); (e) uses NAME_postgres_2",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and the PostgreSQL database")
    p.add_argument("--max-runtime", type=float, default=5400.0, help="the upstream stops by itself after this many seconds")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with the defaults that depend on --smoke filled in."""
    p = argument_parser()
    args = p.parse_args(argv)
    if args.smoke:
        args.requests = 200 if args.requests is None else args.requests
        args.concurrency = args.concurrency or [1, 8]
        args.warmup = 20 if args.warmup is None else args.warmup
        args.rounds = 1 if args.rounds is None else args.rounds
        args.targets = args.targets or ["direct", "mitmdump", "sqlite"]
        if args.growth:
            p.error("--smoke runs no growth scenario")
        args.no_chart = True
    args.requests = 3000 if args.requests is None else args.requests
    args.concurrency = args.concurrency or [1, 32]
    args.warmup = 200 if args.warmup is None else args.warmup
    args.rounds = 3 if args.rounds is None else args.rounds
    args.targets = args.targets or list(TARGETS)
    if args.requests < 1 or not args.concurrency or min(args.concurrency) < 1 or args.rounds < 1:
        p.error("--requests, --rounds and every --concurrency level must be >= 1")
    if args.growth and not any(TARGETS[t].growth for t in args.targets):
        p.error("--growth needs the sqlite or postgres target")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
