"""The audit trail's reads and writes: the chains as `receipts verify` walks them, the heads a checkpoint signs,
the checkpoints themselves, the audit events (pruned, chained again, migrated), and chaining a history again
after `receipts scrub` rewrote one of its rows.

The hashes are computed in audit/chain.py; what is checked, in audit/verify.py.
"""

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlalchemy import Connection, Table, insert, literal, select, update

from proxy_addon.audit.chain import Chain, Identity, chained, genesis
from proxy_addon.journal.tables import AuditCheckpoint, AuditEvent
from proxy_addon.rules.records import AuditEventRecord, CheckpointRecord, utcnow
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import receipts, transitions

MakeCheckpoint = Callable[[list[list[str]], str | None, str | None], dict[str, Any]]
"""(heads, the latest checkpoint's signed document or None, a note) -> a new checkpoint's row."""
checkpoints: Table = AuditCheckpoint.__table__  # type: ignore[assignment]
events: Table = AuditEvent.__table__  # type: ignore[assignment]
BATCH = 500
_IDENTITY = [receipts.c[name] for name in Identity.__slots__]


class AuditTrail:
    def __init__(self, db: Database):
        self.db = db

    def chains(self) -> Iterator[Chain]:
        """Every receipt's chain, by operation id, read BATCH receipts at a time, each batch from one snapshot
        (REPEATABLE READ on PostgreSQL, a read transaction on SQLite's WAL): a step committed between reading a
        receipt and reading its history would otherwise look like a row inserted after its head."""
        after = ""
        while True:
            with self.db.storage_errors(), self._snapshot() as conn:
                batch = _chains(conn, receipts.c.operation_id > after, BATCH)
            yield from batch
            if len(batch) < BATCH:
                return
            after = batch[-1].identity.operation_id

    def _snapshot(self) -> Connection:
        conn = self.db.reading()
        return conn.execution_options(isolation_level="REPEATABLE READ") if self.db.dialect == "postgresql" else conn

    def heads(self, conn: Connection) -> list[list[str]]:
        """[operation_id, head] of every receipt with a history, sorted by operation id (what a checkpoint signs)."""
        query = select(receipts.c.operation_id, receipts.c.history_head).where(receipts.c.history_head.is_not(None))
        return [[r.operation_id, r.history_head] for r in conn.execute(query.order_by(receipts.c.operation_id))]

    def checkpoints(self) -> list[CheckpointRecord]:
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(select(checkpoints).order_by(checkpoints.c.id)).all()
        return [CheckpointRecord(**r._mapping) for r in rows]

    def events(self) -> list[AuditEventRecord]:
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(select(events).order_by(events.c.id)).all()
        return [AuditEventRecord(**{k: v for k, v in r._mapping.items() if k != "id"}) for r in rows]

    def add_checkpoint(self, make: "MakeCheckpoint") -> CheckpointRecord:
        """Read every head (from one snapshot, without holding SQLite's write lock through it), then, in one
        write transaction, the latest checkpoint and, for the first one, the migration's note; have `make` sign
        them (audit/checkpoint.py) and store the result. One checkpoint at a time (PostgreSQL: the table locked
        against another `receipts checkpoint`), so that each names the one before."""
        with self.db.storage_errors(), self._snapshot() as conn:
            heads = self.heads(conn)
        with self.db.writing() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("LOCK TABLE audit_checkpoints IN SHARE ROW EXCLUSIVE MODE")
            latest = conn.execute(select(checkpoints.c.signed).order_by(checkpoints.c.id.desc()).limit(1)).scalar()
            note = None
            if latest is None:
                notes = conn.execute(select(events.c.note).where(events.c.kind == "migrated").order_by(events.c.id)).scalars()
                note = "; ".join(n for n in notes if n) or None
            values = make(heads, latest, note)
            new_id = conn.execute(insert(checkpoints).values(**values).returning(checkpoints.c.id)).scalar_one()
        return CheckpointRecord(id=int(new_id), **values)


def _chains(conn: Connection, which: Any, limit: int | None = None, lock: bool = False) -> list[Chain]:
    """The chains of the receipts `which` selects, by operation id (at most `limit`; locked when `lock`, on
    PostgreSQL: SQLite's write transaction already is)."""
    query = select(*_IDENTITY, receipts.c.history_head).where(which).order_by(receipts.c.operation_id).limit(limit)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    found = conn.execute(query).all()
    history: dict[str, list[dict[str, Any]]] = {r.operation_id: [] for r in found}
    if history:
        rows = select(transitions).where(transitions.c.operation_id.in_(list(history))).order_by(transitions.c.id)
        for row in conn.execute(rows):
            history[row.operation_id].append(dict(row._mapping))
    return [Chain(Identity.of(r._mapping), r.history_head, history[r.operation_id]) for r in found]


def record_pruned(conn: Connection, which: Any) -> None:
    """Note the receipts `which` selects (a condition on `receipts`) as pruned, with their heads, before they
    are deleted in the same transaction: verify then tells them from receipts deleted by someone else."""
    now = literal(utcnow(), events.c.recorded_at.type)
    selected = select(receipts.c.operation_id, literal("pruned"), receipts.c.history_head, now).where(which)
    conn.execute(insert(events).from_select(["operation_id", "kind", "head_before", "recorded_at"], selected))


def rechain(conn: Connection, details_before: Mapping[str, Mapping[int, Any]]) -> list[str]:
    """Compute these receipts' chains again from their rows as they are now (after `receipts scrub` rewrote a
    detail: `details_before` gives, per receipt, each rewritten row's detail before), store the hashes and
    heads, and note each as `rechained` with its head before and after. Only a chain that held before the
    rewrite is computed again, so that a scrub never hides tampering; the others are returned, left as they
    are for `receipts verify` to name. The caller's transaction holds the rows (locked on PostgreSQL)."""
    broken = []
    for chain in _chains(conn, receipts.c.operation_id.in_(list(details_before)), lock=True):
        start = genesis(chain.identity)
        before = details_before[chain.identity.operation_id]
        was = chained(start, [{**row, "detail": before.get(row["id"], row["detail"])} for row in chain.rows])
        if was != [row["hash"] for row in chain.rows] or (was[-1] if was else None) != chain.head:
            broken.append(chain.identity.operation_id)
            continue
        hashes = chained(start, chain.rows)
        for row, new_hash in zip(chain.rows, hashes, strict=True):
            if row["hash"] != new_hash:
                conn.execute(update(transitions).where(transitions.c.id == row["id"]).values(hash=new_hash))
        head = hashes[-1] if hashes else None
        if head == chain.head:
            continue
        operation_id = chain.identity.operation_id
        conn.execute(update(receipts).where(receipts.c.operation_id == operation_id).values(history_head=head))
        record = {"operation_id": operation_id, "kind": "rechained", "head_before": chain.head, "head_after": head}
        conn.execute(insert(events).values(**record, recorded_at=utcnow()))
    return broken
