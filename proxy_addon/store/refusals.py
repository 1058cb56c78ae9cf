"""Refused duplicates: a row per request answered from an earlier receipt (refused or replayed), identity only."""

from datetime import datetime

from sqlalchemy import Table, insert, select

from proxy_addon.journal.tables import DuplicateRefusal
from proxy_addon.rules.records import Intent, RefusalRecord, utcnow
from proxy_addon.rules.states import RefusalReason
from proxy_addon.store.database import Database

refusals: Table = DuplicateRefusal.__table__  # type: ignore[assignment]


class Refusals:
    def __init__(self, db: Database):
        self.db = db

    def record(
        self, reason: RefusalReason | str, blocking_operation_id: str, intent: Intent, proxy_instance: str | None = None
    ) -> RefusalRecord:
        """Note a refused or replayed request: no headers, no body (`account` is the keyed hash)."""
        values = {
            "refused_at": utcnow(),
            "reason": RefusalReason(reason).value,
            "blocking_operation_id": blocking_operation_id,
            "account": intent.account,
            "intent_fingerprint": intent.intent_fingerprint,
            "method": intent.method,
            "host": intent.host,
            "path": intent.path,
            "proxy_instance": proxy_instance,
            "agent": intent.agent,
        }
        with self.db.writing() as conn:
            row = conn.execute(insert(refusals).values(**values).returning(*refusals.c)).one()
        return RefusalRecord(**row._mapping)

    def list(
        self,
        since: datetime | None = None,
        reason: RefusalReason | str | None = None,
        blocking_operation_id: str | None = None,
        limit: int | None = 100,
    ) -> list[RefusalRecord]:
        """Newest first."""
        q = select(refusals).order_by(refusals.c.refused_at.desc(), refusals.c.id.desc())
        if since is not None:
            q = q.where(refusals.c.refused_at >= since)
        if reason is not None:
            q = q.where(refusals.c.reason == RefusalReason(reason).value)
        if blocking_operation_id is not None:
            q = q.where(refusals.c.blocking_operation_id == blocking_operation_id)
        if limit is not None:
            q = q.limit(limit)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [RefusalRecord(**r._mapping) for r in conn.execute(q)]
