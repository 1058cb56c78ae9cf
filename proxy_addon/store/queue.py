"""The reconcile queue: outcome_unknown receipts leased to workers (outcome_unknown -> reconciling) and taken
back when a worker's lease runs out."""

from datetime import datetime, timedelta

from sqlalchemy import Connection, select

from proxy_addon import metrics
from proxy_addon.exceptions import StaleStateError
from proxy_addon.journal.rows import Step
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.states import State
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import StoredReceipts, receipts


class ReconcileQueue:
    def __init__(self, db: Database, receipts_: StoredReceipts):
        self.db = db
        self.receipts = receipts_

    def claim(self, worker: str, lease_seconds: float, limit: int, due_by: datetime | None = None) -> list[ReceiptRecord]:
        """Lease up to `limit` due outcome_unknown receipts to `worker` (outcome_unknown -> reconciling).

        Due: no `next_attempt_at`, or one not later than now (and not later than `due_by`, so that a
        reconcile pass never takes back a receipt it put back itself).
        PostgreSQL: FOR UPDATE SKIP LOCKED, so concurrent workers take disjoint rows. SQLite: the write
        transaction (BEGIN IMMEDIATE) already serialises claimers, and each claim is a compare-and-set.
        """
        with self.db.writing() as conn:
            now = self.db.clock(conn)
            cutoff = now if due_by is None else min(now, due_by)
            due = (
                select(receipts.c.operation_id)
                .where(
                    receipts.c.state == State.OUTCOME_UNKNOWN.value,
                    (receipts.c.next_attempt_at.is_(None)) | (receipts.c.next_attempt_at <= cutoff),
                )
                .order_by(receipts.c.next_attempt_at.is_not(None), receipts.c.next_attempt_at, receipts.c.created_at)
                .limit(limit)
            )
            if self.db.dialect == "postgresql":
                due = due.with_for_update(skip_locked=True)
            ids = [r.operation_id for r in conn.execute(due)]
            if not ids:
                return []
            expires = now + timedelta(seconds=lease_seconds)
            self._lease(conn, ids, worker, expires)
            leased = {r.operation_id: r for r in conn.execute(select(receipts).where(receipts.c.operation_id.in_(ids)))}
            rows = [leased[i] for i in ids]  # in the order they were due
        for _ in rows:
            metrics.transitioned(State.RECONCILING)
        return [ReceiptRecord.from_row(r) for r in rows]

    def _lease(self, conn: Connection, ids: list[str], worker: str, expires: datetime) -> None:
        """Each `outcome_unknown -> reconciling` through the one definition of a step (journal/writes.py), so its
        history row is chained like every other; the rows are locked (or the database is), so none fails."""
        writes = self.receipts.writes(conn)
        detail = {"who": worker, "lease_expires_at": expires.isoformat()}
        for operation_id in ids:
            updates = {"lease_owner": worker, "lease_expires_at": expires}
            writes.advance(Step(operation_id, State.OUTCOME_UNKNOWN.value, State.RECONCILING.value, detail, updates))

    def release_expired(self, by: str) -> list[str]:
        """Receipts whose worker's lease ran out go back to outcome_unknown, to be claimed again."""
        with self.db.storage_errors(), self.db.reading() as conn:
            now = self.db.clock(conn)
            rows = conn.execute(
                select(receipts.c.operation_id, receipts.c.lease_owner).where(
                    receipts.c.state == State.RECONCILING.value, receipts.c.lease_expires_at < now
                )
            ).all()
        released = []
        for row in rows:
            try:
                self.receipts.transition(
                    row.operation_id,
                    State.RECONCILING,
                    State.OUTCOME_UNKNOWN,
                    {"who": by, "reason": "lease expired", "lease_owner": row.lease_owner},
                    owned_by=row.lease_owner,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            except StaleStateError:
                continue
            released.append(row.operation_id)
        return released
