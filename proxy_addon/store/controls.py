"""Verifier control runs: each read rule's positive and negative controls as they ran, kept with their history,
and the succeeded receipts a positive control is run on."""

from datetime import datetime

from sqlalchemy import Table, func, insert, select

from proxy_addon.journal.tables import Receipt, VerifierControl
from proxy_addon.rules.records import ControlRunRecord, ReceiptRecord
from proxy_addon.rules.states import State
from proxy_addon.store.database import Database

controls: Table = VerifierControl.__table__  # type: ignore[assignment]
receipts: Table = Receipt.__table__  # type: ignore[assignment]
_COLUMNS = ("checked_at", "host", "port", "operation", "account", "rule", "control", "result", "known_operation_id", "evidence")


class ControlRuns:
    def __init__(self, db: Database):
        self.db = db

    def record(self, runs: list[ControlRunRecord]) -> None:
        """Append runs to the history (never updated: a later run is a new row)."""
        if not runs:
            return
        with self.db.writing() as conn:
            conn.execute(insert(controls), [{c: getattr(run, c) for c in _COLUMNS} for run in runs])

    def latest(self, host: str, port: int, operation: str, account: str, rule: str, control: str) -> ControlRunRecord | None:
        """The newest run of one control for one rule (as written now), host and account, whatever its result."""
        q = (
            select(controls)
            .where(
                controls.c.host == host,
                controls.c.port == port,
                controls.c.operation == operation,
                controls.c.account == account,
                controls.c.rule == rule,
                controls.c.control == control,
            )
            .order_by(controls.c.checked_at.desc(), controls.c.id.desc())
            .limit(1)
        )
        with self.db.storage_errors(), self.db.reading() as conn:
            row = conn.execute(q).first()
        return None if row is None else ControlRunRecord(**row._mapping)

    def latest_of_each(self) -> list[ControlRunRecord]:
        """The newest run of every control of every rule, host and account: the rules' health."""
        newest = (
            select(func.max(controls.c.id).label("id"))
            .group_by(
                controls.c.host, controls.c.port, controls.c.operation, controls.c.account, controls.c.rule, controls.c.control
            )
            .subquery()
        )
        q = select(controls).where(controls.c.id.in_(select(newest.c.id))).order_by(controls.c.host, controls.c.operation)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [ControlRunRecord(**r._mapping) for r in conn.execute(q)]

    def history(self, since: datetime | None = None, limit: int = 200) -> list[ControlRunRecord]:
        """Runs, newest first."""
        q = select(controls).order_by(controls.c.checked_at.desc(), controls.c.id.desc()).limit(limit)
        if since is not None:
            q = q.where(controls.c.checked_at >= since)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [ControlRunRecord(**r._mapping) for r in conn.execute(q)]

    def known_success(
        self, host: str, port: int, operation: str, account: str, with_external_id: bool = True
    ) -> ReceiptRecord | None:
        """The most recent succeeded receipt of this operation and account on this target: a known effect."""
        q = select(receipts).where(
            receipts.c.state == State.SUCCEEDED.value,
            receipts.c.host == host,
            receipts.c.port == port,
            receipts.c.operation == operation,
            receipts.c.account == account,
        )
        if with_external_id:
            q = q.where(receipts.c.external_id.is_not(None))
        q = q.order_by(receipts.c.completed_at.desc(), receipts.c.operation_id.desc()).limit(1)
        with self.db.storage_errors(), self.db.reading() as conn:
            row = conn.execute(q).first()
        return None if row is None else ReceiptRecord.from_row(row)
