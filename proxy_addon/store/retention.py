"""What the journal holds as a whole: counts for `receipts stats` and the metrics, and pruning old receipts."""

from datetime import UTC, timedelta

from sqlalchemy import and_, delete, func, select

from proxy_addon.rules.records import JournalStats, utcnow
from proxy_addon.rules.states import OPEN_STATES, TERMINAL_STATES, State
from proxy_addon.store.audit import record_pruned
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import receipts, transitions


class Retention:
    def __init__(self, db: Database):
        self.db = db

    def stats(self) -> JournalStats:
        """Counts per state and per host and state, and the age of the oldest open receipt."""
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(
                select(receipts.c.host, receipts.c.state, func.count()).group_by(receipts.c.host, receipts.c.state)
            ).all()
            oldest = conn.execute(
                select(func.min(receipts.c.created_at)).where(receipts.c.state.in_([s.value for s in OPEN_STATES]))
            ).scalar()
        by_state: dict[str, int] = {s.value: 0 for s in State}
        by_host: dict[str, dict[str, int]] = {}
        for host, state, count in rows:
            by_state[state] += count
            by_host.setdefault(host, {})[state] = count
        if oldest is not None and oldest.tzinfo is None:
            oldest = oldest.replace(tzinfo=UTC)
        age = (utcnow() - oldest).total_seconds() if oldest is not None else None
        return JournalStats(by_state, by_host, age)

    def prune(self, older_than: timedelta) -> int:
        """Delete terminal receipts completed before `now - older_than`, with their history. Never an open one.
        Each is recorded as pruned, with its history head, in the same transaction (store/audit.py)."""
        cutoff = utcnow() - older_than
        old_terminal = and_(receipts.c.state.in_([s.value for s in TERMINAL_STATES]), receipts.c.completed_at < cutoff)
        with self.db.writing() as conn:
            record_pruned(conn, old_terminal)
            conn.execute(delete(transitions).where(transitions.c.operation_id.in_(select(receipts.c.operation_id).where(old_terminal))))
            return conn.execute(delete(receipts).where(old_terminal)).rowcount or 0
