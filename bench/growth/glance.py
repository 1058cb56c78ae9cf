"""What reading the journal at a glance costs on a large history: the review page (`GET /`), a Prometheus scrape
(`GET /metrics`) and each read they make (store/retention.py `stats`, store/overview.py), on SQLite or PostgreSQL.

The database is seeded once with --seed terminal receipts (bench/core/seeding.py: one every 2 s back from now),
when it holds fewer; then, each run, a pile-up on top (removed and made again, marked `bench-glance`): --open
receipts in open states over the last day (a reconciler that fell behind), --recent writes in the last hour (more
than the chart counts), --approvals pending approvals and --instances proxy instances. Each read is timed --runs
times after two warm-ups, through the admin app in this process (no HTTP server, no network); the plans of the
glance's queries are printed, and any scan of `receipts` is flagged. On PostgreSQL the pile-up ends with what
autovacuum would have done over the months such a history takes (receipt_counts rewritten to its few live rows,
receipts vacuumed and analysed). Prints one Markdown table (milliseconds).

    .venv/bin/python bench/growth/glance.py --database sqlite:////tmp/glance.db --seed 10000000
    .venv/bin/python bench/growth/glance.py --database postgresql+psycopg://postgres@127.0.0.1/glance --seed 10000000
"""

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from sqlalchemy import delete, func, insert, select, text

from bench.core.seeding import seed, seed_rows
from proxy_addon.admin.app import create_app
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.journal.tables import Approval, ProxyInstance, Receipt
from proxy_addon.store import ReceiptStore
from proxy_addon.store.overview import RECENT_ROWS, edges_statement, recent_statement
from proxy_addon.store.retention import oldest_statement

MARK = "bench-glance"
OPEN_MIX = (("outcome_unknown", 6), ("manual_review", 3), ("submitted", 1))  # of every 10 open receipts
RECENT_MIX = (("succeeded", 8), ("rejected", 1), ("outcome_unknown", 1))


def pile_up(store: ReceiptStore, open_n: int, recent_n: int, approvals_n: int, instances_n: int) -> None:
    """The pile-up on top of the seeded history, made anew (the previous run's removed first)."""
    receipts, approvals, instances = Receipt.__table__, Approval.__table__, ProxyInstance.__table__
    now = datetime.now(UTC)
    with store.engine.begin() as conn:
        conn.execute(delete(receipts).where(receipts.c.proxy_instance == MARK))
        conn.execute(delete(approvals).where(approvals.c.proxy_instance == MARK))
        conn.execute(delete(instances).where(instances.c.hostname == MARK))
        seq = int(conn.execute(select(func.coalesce(func.max(receipts.c.seq), 0))).scalar_one())
        rows = _rows(open_n, OPEN_MIX, timedelta(days=1), now, seq) + _rows(recent_n, RECENT_MIX, timedelta(hours=1), now, seq + open_n)
        for start in range(0, len(rows), 10_000):
            conn.execute(insert(receipts), rows[start:start + 10_000])
        if approvals_n:
            conn.execute(insert(approvals), [_approval(i, now) for i in range(approvals_n)])
        if instances_n:
            conn.execute(insert(instances), [
                {"instance_id": f"{MARK}-{i}", "hostname": MARK, "pid": i, "started_at": now - timedelta(days=i),
                 "heartbeat_at": now - timedelta(seconds=3 if i < 2 else 600 + i), "stopped_at": None if i % 3 else now}
                for i in range(instances_n)
            ])  # fmt: skip
    store.retention.fold_counts()
    if store.db.dialect == "postgresql":  # the tables as a journal grown over months with autovacuum has them
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # the counts: a few live rows; the seeding's millions of trigger rows, folded at once, left their pages
            # behind (autovacuum, running as they churn, keeps the table a few pages)
            conn.exec_driver_sql("VACUUM FULL ANALYZE receipt_counts")
            conn.exec_driver_sql("VACUUM ANALYZE receipts")  # the visibility map set: index-only scans


def _rows(n: int, mix: tuple[tuple[str, int], ...], span: timedelta, now: datetime, seq: int) -> list[dict[str, Any]]:
    states = [state for state, weight in mix for _ in range(weight)]
    rows = seed_rows(range(n), max(n, 1), 9, now)
    for i, row in enumerate(rows):
        state = states[i % len(states)]
        created = now - span * (1 - (i + 1) / (n + 1))
        terminal = state in ("succeeded", "rejected")
        row.update(state=state, created_at=created, updated_at=created, completed_at=created if terminal else None,
                   proxy_instance=MARK, seq=seq + i + 1, intent_fingerprint=f"sha256:{MARK}-{uuid.uuid4().hex}")  # fmt: skip
    return rows


def _approval(i: int, now: datetime) -> dict[str, Any]:
    requested = now - timedelta(minutes=i % 90)
    return {"approval_id": f"ap_{uuid.uuid4().hex}", "account": "a", "intent_fingerprint": uuid.uuid4().hex, "operation": "op",
            "method": "POST", "scheme": "https", "host": "h", "port": 443, "path": "/", "state": "pending",
            "requested_at": requested, "expires_at": requested + timedelta(hours=1), "expires_seconds": 3600.0,
            "last_asked_at": requested, "proxy_instance": MARK}  # fmt: skip


def timed(work: Callable[[], Any], runs: int) -> dict[str, float]:
    for _ in range(2):
        work()
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return {"median": statistics.median(took), "p95": took[min(len(took) - 1, int(len(took) * 0.95))], "max": took[-1]}


def plans(store: ReceiptStore) -> list[tuple[str, str]]:
    """(query, plan) of the glance's statements on `receipts`, as the database runs them."""
    since = datetime.now(UTC) - timedelta(hours=1)
    with store.engine.connect() as conn:
        *firsts, newest = conn.execute(edges_statement(since, timedelta(minutes=5), 12)).one()
    edges = [newest + 1 if first is None else first for first in firsts]
    statements = {
        "oldest of each open state": oldest_statement(),
        "the chart's edges": edges_statement(since, timedelta(minutes=5), 12),
        "last hour's writes": recent_statement(edges, max(edges[0], newest - RECENT_ROWS + 1)),
    }
    found = []
    with store.engine.connect() as conn:
        for name, statement in statements.items():
            sql = str(statement.compile(conn, compile_kwargs={"literal_binds": True}))
            explain = "EXPLAIN QUERY PLAN " if store.db.dialect == "sqlite" else "EXPLAIN "
            rows = conn.execute(text(explain + sql)).all()
            found.append((name, "\n".join(str(r[-1]) for r in rows)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True)
    parser.add_argument("--seed", type=int, default=0, help="seed terminal receipts up to this many first")
    parser.add_argument("--seed-budget", type=float, default=7200)
    parser.add_argument("--open", type=int, default=10_000)
    parser.add_argument("--recent", type=int, default=30_000)
    parser.add_argument("--approvals", type=int, default=200)
    parser.add_argument("--instances", type=int, default=50)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    engine = make_engine(args.database)
    store = ReceiptStore(engine)
    held = sum(store.retention.stats().by_state.values())
    if args.seed > held:
        print(f"seeding {args.seed} receipts ...", file=sys.stderr)
        print(seed(args.database, args.seed, 9, args.seed_budget), file=sys.stderr)
        store.retention.fold_counts()
    pile_up(store, args.open, args.recent, args.approvals, args.instances)
    stats = store.retention.stats()
    app = create_app(parse_config("secret_file: /tmp/bench-glance-secret\n"), store)
    client = app.test_client()

    def get(path: str) -> None:
        answer = client.get(path)
        assert answer.status_code == 200, answer.status_code

    reads: dict[str, Callable[[], Any]] = {
        "stats (counts, oldest of each open state)": store.retention.stats,
        "last hour's writes (the chart)": store.overview.recent_writes,
        "approvals' longest wait": store.overview.approval_wait_ratio,
        "proxy instances": lambda: store.overview.instances(15),
        "GET /metrics (a whole scrape)": lambda: get("/metrics"),
        "GET / (the review page)": lambda: get("/"),
    }
    print(f"\n{engine.dialect.name}: {sum(stats.by_state.values()):,} receipts ({stats.by_state}), "
          f"{args.open:,} open and {args.recent:,} in the last hour added, {args.runs} runs\n")  # fmt: skip
    print("| read | median ms | p95 ms | max ms |\n|---|---:|---:|---:|")
    for name, work in reads.items():
        t = timed(work, args.runs)
        print(f"| {name} | {t['median']:.1f} | {t['p95']:.1f} | {t['max']:.1f} |")
    print()
    scans = 0
    for name, plan in plans(store):
        print(f"{name}:\n```\n{plan}\n```")
        scans += bool(re_scan(plan))
    engine.dispose()
    return 1 if scans else 0


def re_scan(plan: str) -> bool:
    """A plan that reads the whole receipts table."""
    return any(line.strip().startswith(("SCAN receipts", "Seq Scan on receipts")) or "Seq Scan on receipts" in line for line in plan.splitlines())


if __name__ == "__main__":
    sys.exit(main())
