"""A year of an agent's history, fast: the journal bench's seeded receipts (bench/growth/journal.py).

The shape of issue 35's operator journal: N receipts, three history rows each, most of them on one account and
one target (an agent writing to one endpoint: nine PUTs to one POST there, the writes that may end a replay
window), 5,000 open `outcome_unknown` receipts spread through the history, the newest 20,000 `succeeded` within
the replay window, a tenth `rejected`; the oldest ~ a year old.

At ten million receipts, inserting into a table with its dozen indexes costs most of the seeding's time. The
indexes (all but the journal order's, which the history rows are copied by) are dropped first and built again
afterwards, from the models' own definitions (proxy_addon/journal/tables.py), as a restore would; then the kept
counts (receipt_counts, which the triggers kept row by row) are folded, and PostgreSQL is `VACUUM ANALYZE`d
as autovacuum would have done (this machine's server runs with autovacuum off). SQLite gets no ANALYZE: a
deployed journal has none unless someone runs it.
"""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Index, and_, insert, text

from bench.core.seeding import RESPONSE_HEADERS, history_of, seeding_engine
from proxy_addon.journal.tables import Receipt, ReceiptTransition
from proxy_addon.store import ReceiptStore

BATCH = 20_000
OPEN_UNKNOWNS = 5_000
RECENT_SUCCESSES = 20_000
SKEWED_PATH = "/skewed"  # the agent's one target
YEAR_S = 365 * 86_400
RECENT_S = 600  # the recent successes: the last ten minutes (the replay window is 15)

Row = dict[str, Any]


def seed_history(url: str, n: int, upstream_port: int) -> dict[str, Any]:
    """Seed `n` receipts of the shape above into a migrated, empty journal; what it took."""
    started = time.monotonic()
    engine = seeding_engine(url)
    try:
        dropped = _drop_indexes(engine)
        now = datetime.now(UTC)
        for lo in range(0, n, BATCH):
            rows = [_row(i, n, upstream_port, now) for i in range(lo, min(n, lo + BATCH))]
            with engine.begin() as conn:
                conn.execute(insert(Receipt.__table__), rows)
                conn.execute(_history_of(lo + 1, lo + len(rows)))
        inserted = time.monotonic()
        with engine.begin() as conn:
            for index in dropped:
                index.create(conn)
        ReceiptStore(engine).retention.fold_counts()
        _as_autovacuum_would(engine)
    finally:
        engine.dispose()
    return {"seeded": n, "insert_s": round(inserted - started, 1), "seconds": round(time.monotonic() - started, 1)}


def _drop_indexes(engine: Engine) -> list[Index]:
    kept = {"ix_receipts_seq"}
    dropped = [i for t in (Receipt.__table__, ReceiptTransition.__table__) for i in t.indexes if i.name not in kept]
    with engine.begin() as conn:
        for index in dropped:
            index.drop(conn)
    return dropped


def _row(i: int, n: int, upstream_port: int, now: datetime) -> Row:
    """Receipt i of n (0 the oldest): its place in time and its state decide the rest."""
    recent = i >= n - RECENT_SUCCESSES
    age_s = (n - i) * RECENT_S / RECENT_SUCCESSES if recent else RECENT_S + (n - i) * YEAR_S / n
    created = now - timedelta(seconds=age_s)
    unknown = not recent and i % max(1, n // OPEN_UNKNOWNS) == 7 % max(1, n // OPEN_UNKNOWNS)
    rejected = not recent and not unknown and i % 10 == 3
    state = "outcome_unknown" if unknown else "rejected" if rejected else "succeeded"
    skewed = i % 10 != 9
    body = b'{"seq":%d,"title":"seeded item %d"}' % (i, i)
    done = state != "outcome_unknown"
    return {
        "operation_id": f"op_seed{i:012d}",
        "operation": "PUT /skewed" if skewed else "POST /other",
        "method": "POST" if not skewed or i % 10 == 0 else "PUT",
        "scheme": "http", "host": "127.0.0.1", "port": upstream_port,
        "path": SKEWED_PATH if skewed else f"/other/{i % 1000}",
        "intent_fingerprint": f"sha256:seed{i:060d}",
        "account": "anonymous" if skewed else f"acct:other-{i % 500}",
        "state": state,
        "created_at": created, "updated_at": created + timedelta(milliseconds=40),
        "submitted_at": created + timedelta(milliseconds=5),
        "completed_at": created + timedelta(milliseconds=40) if done else None,
        "status_code": (400 if rejected else 201) if done else None,
        "external_id": str(i) if state == "succeeded" else None,
        "error_code": "upstream_status" if rejected else "upstream_timeout" if unknown else None,
        "proxy_instance": "bench-seed",
        "request_headers": {"host": f"127.0.0.1:{upstream_port}", "content-type": "application/json"},
        "request_body": body, "request_body_size": len(body),
        "response_headers": RESPONSE_HEADERS if done else None,
        "response_body": b'{"id":%d}' % i if done else None,
        "seq": i + 1,
    }  # fmt: skip


def _history_of(first_seq: int, last_seq: int) -> Any:
    """Planned, submitted and the state it is in, for each receipt of that journal order range."""
    receipts = Receipt.__table__.c
    return history_of(and_(receipts.seq >= first_seq, receipts.seq <= last_seq), receipts.updated_at)


def _as_autovacuum_would(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # The seeding's triggers wrote a count row per receipt, folded into a few rows at the end: the table is
        # left the size of ten million rows, mostly empty pages that every read of the counts scans (265 ms at
        # 10M). A journal that grew for a year never held more than a heartbeat's count rows, which autovacuum
        # reclaimed as it went; rewritten, the table is the size that leaves.
        conn.execute(text("VACUUM FULL receipt_counts"))
        conn.execute(text("VACUUM ANALYZE"))
        conn.execute(text("SELECT setval('receipts_seq', (SELECT MAX(seq) FROM receipts))"))
