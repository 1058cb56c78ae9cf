"""The growth scenario's history: synthetic terminal receipts, bulk-inserted before the proxy starts.

The inserts are built from the models' tables, so the receipt's shape is defined once (proxy_addon/journal/tables.py)
and the columns not named here get the models' defaults. Receipts go in with executemany; their three
transitions each are copied from the inserted receipts by one INSERT ... SELECT per batch, because three
more Python rows per receipt made seeding take about 1.5 times as long.
"""

import hashlib
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Insert, event, insert, literal, null, select, union_all

from proxy_addon.db import make_engine
from proxy_addon.journal.tables import Receipt, ReceiptTransition

BATCH_ROWS = 10_000
SEED_DETAIL = {"who": "bench-seed"}
RESPONSE_HEADERS = {"content-type": "application/json"}
# A crash while seeding only means seeding again; the proxy opens its own connections durably.
UNDURABLE_SESSION = {
    "sqlite": ("PRAGMA synchronous=OFF", "PRAGMA cache_size=-262144"),
    "postgresql": ("SET synchronous_commit = off",),
}
# What autovacuum would have done on a database with that history.
AFTER_SEEDING = {
    "sqlite": (),
    # the proxy's own receipts are numbered after the seeded ones (journal/statements.py, NEXT_SEQ)
    "postgresql": ("ANALYZE receipts", "ANALYZE receipt_transitions", "SELECT setval('receipts_seq', (SELECT MAX(seq) FROM receipts))"),
}

Row = dict[str, Any]


def seed(url: str, n: int, upstream_port: int, budget_s: float) -> dict[str, Any]:
    """Insert `n` terminal receipts (90 % succeeded, 10 % rejected), 3 transitions each, within `budget_s`."""
    started = time.monotonic()
    if n <= 0:
        return {"seeded": 0, "seconds": 0.0}
    engine = seeding_engine(url)
    try:
        seeded = insert_batches(engine, n, upstream_port, started + budget_s)
        if seeded == n:
            run_statements(engine, AFTER_SEEDING[engine.dialect.name])
    finally:
        engine.dispose()
    result: dict[str, Any] = {"seeded": seeded, "seconds": round(time.monotonic() - started, 1)}
    if seeded < n:
        result["skipped"] = f"seeding {n} rows did not finish within {budget_s:.0f}s"
    return result


def seeding_engine(url: str) -> Engine:
    engine = make_engine(url)
    statements = UNDURABLE_SESSION[engine.dialect.name]

    @event.listens_for(engine, "connect")
    def _undurable(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()
        dbapi_conn.commit()

    return engine


def insert_batches(engine: Engine, n: int, upstream_port: int, deadline: float) -> int:
    """Insert in batches of BATCH_ROWS, one transaction each, until done or past `deadline`; returns the rows inserted."""
    insert_receipts = insert(Receipt.__table__)
    now = datetime.now(UTC)
    seeded = 0
    while seeded < n and time.monotonic() <= deadline:
        receipts = seed_rows(range(seeded, min(n, seeded + BATCH_ROWS)), n, upstream_port, now)
        with engine.begin() as conn:
            conn.execute(insert_receipts, receipts)
            conn.execute(transitions_of_batch(receipts[0]["created_at"], receipts[-1]["created_at"]))
        seeded += len(receipts)
    return seeded


def seed_rows(numbers: range, n: int, upstream_port: int, now: datetime) -> list[Row]:
    """Receipt number g of n was created 2 * (n - g) seconds before `now` and settled 40 ms later."""
    request_headers = {"host": f"127.0.0.1:{upstream_port}", "content-type": "application/json"}
    receipts: list[Row] = []
    for g in numbers:
        operation_id = "op_" + uuid.uuid4().hex
        created = now - timedelta(seconds=2 * (n - g))
        submitted = created + timedelta(milliseconds=5)
        completed = created + timedelta(milliseconds=40)
        rejected = g % 10 == 0
        state = "rejected" if rejected else "succeeded"
        body = b'{"seq":%d,"title":"seeded item %d"}' % (g, g)
        receipts.append(
            {
                "operation_id": operation_id,
                "operation": "POST 127.0.0.1 /seed/{id}",
                "method": "POST",
                "scheme": "http",
                "host": "127.0.0.1",
                "port": upstream_port,
                "path": f"/seed/{g}",
                "intent_fingerprint": "sha256:" + hashlib.sha256(b"seed%d" % g).hexdigest(),
                "account": "anonymous",
                "state": state,
                "created_at": created,
                "updated_at": completed,
                "submitted_at": submitted,
                "completed_at": completed,
                "status_code": 400 if rejected else 201,
                "external_id": None if rejected else str(g),
                "error_code": "upstream_status" if rejected else None,
                "proxy_instance": "bench-seed",
                "request_headers": request_headers,
                "request_body": body,
                "request_body_size": len(body),
                "response_headers": RESPONSE_HEADERS,
                "response_body": b'{"id":%d}' % g,
                "seq": g + 1,  # the journal's order (journal/tables.py): the oldest first
            }
        )
    return receipts


def transitions_of_batch(first_created: datetime, last_created: datetime) -> Insert:
    """Planned, submitted and the terminal state, for each receipt created in that interval."""
    receipts = Receipt.__table__.c
    return history_of(receipts.created_at.between(first_created, last_created), receipts.completed_at)


def history_of(in_batch: Any, last_at: Any) -> Insert:
    """Planned, submitted and the state each receipt `in_batch` selects is in (at `last_at`), as history rows."""
    receipts = Receipt.__table__.c
    transitions = ReceiptTransition.__table__
    detail = literal(SEED_DETAIL, transitions.c.detail.type)
    steps = (
        (null(), literal("planned"), receipts.created_at),
        (literal("planned"), literal("submitted"), receipts.submitted_at),
        (literal("submitted"), receipts.state, last_at),
    )
    rows = union_all(*(select(receipts.operation_id, *step, detail).where(in_batch) for step in steps))
    return insert(transitions).from_select(["operation_id", "from_state", "to_state", "recorded_at", "detail"], rows)


def run_statements(engine: Engine, statements: tuple[str, ...]) -> None:
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
