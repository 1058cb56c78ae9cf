"""Approvals as people see and decide them: list, show, approve, deny; and what has expired, marked so.

The write path's side (asking for an approval, using one up with a receipt's creation) is journal/writes.py,
`_record_approved`: it runs in the same transaction as the receipt. A person's decision is a compare-and-set
from `pending`, so that two people (or a person and the expiry) cannot both decide one approval.
"""

from datetime import datetime, timedelta

from sqlalchemy import Table, func, select, update

from proxy_addon import metrics
from proxy_addon.exceptions import ApprovalNotFoundError, NotDecidableError
from proxy_addon.journal.tables import Approval
from proxy_addon.rules.records import ApprovalRecord, utcnow
from proxy_addon.rules.states import ApprovalState
from proxy_addon.store.database import Database

approvals: Table = Approval.__table__  # type: ignore[assignment]
DECISIONS = {"approve": ApprovalState.APPROVED, "deny": ApprovalState.DENIED}
UNDECIDED = (ApprovalState.PENDING.value, ApprovalState.APPROVED.value)


class Approvals:
    def __init__(self, db: Database):
        self.db = db

    def expire_due(self, now: datetime | None = None) -> int:
        """Mark pending requests nobody decided in time, and approvals nobody used in time, `expired`."""
        due = update(approvals).where(approvals.c.state.in_(UNDECIDED), approvals.c.expires_at <= (now or utcnow()))
        with self.db.storage_errors(), self.db.writing() as conn:
            return conn.execute(due.values(state=ApprovalState.EXPIRED.value)).rowcount

    def list(self, state: ApprovalState | str | None = None, limit: int | None = 200) -> list[ApprovalRecord]:
        """Newest request first; expired ones marked so first, so that the list never shows a stale `pending`."""
        self.expire_due()
        q = select(approvals).order_by(approvals.c.requested_at.desc(), approvals.c.approval_id)
        if state is not None:
            q = q.where(approvals.c.state == ApprovalState(state).value)
        if limit is not None:
            q = q.limit(limit)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [ApprovalRecord(**r._mapping) for r in conn.execute(q)]

    def get(self, approval_id: str) -> ApprovalRecord:
        self.expire_due()
        with self.db.storage_errors(), self.db.reading() as conn:
            row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).first()
        if row is None:
            raise ApprovalNotFoundError(f"no approval {approval_id}")
        return ApprovalRecord(**row._mapping)

    def pending_count(self) -> int:
        """Pending and not yet expired (the metric's gauge, read at scrape time)."""
        q = select(func.count()).where(approvals.c.state == ApprovalState.PENDING.value, approvals.c.expires_at > utcnow())
        with self.db.storage_errors(), self.db.reading() as conn:
            return int(conn.execute(q).scalar_one())

    def decide(self, approval_id: str, decision: str, note: str, who: str) -> ApprovalRecord:
        """`approve` or `deny` a pending approval, with the person's note; its use (or the denial) then stands
        for its `expires` from now. NotDecidableError when it is not pending (any more)."""
        to = DECISIONS[decision]
        if not note.strip():
            raise NotDecidableError("a decision needs a note (--note TEXT): who reads it later needs to know why")
        current = self.get(approval_id)
        if current.state != ApprovalState.PENDING.value:
            raise NotDecidableError(f"approval {approval_id} is {current.state}, not pending: it cannot be decided")
        now = utcnow()
        values = {"state": to.value, "decided_at": now, "decided_by": who, "note": note}
        values["expires_at"] = now + timedelta(seconds=current.expires_seconds)
        cas = update(approvals).where(
            approvals.c.approval_id == approval_id,
            approvals.c.state == ApprovalState.PENDING.value,
            approvals.c.expires_at > now,
        )
        with self.db.storage_errors(), self.db.writing() as conn:
            moved = conn.execute(cas.values(**values)).rowcount
        if moved != 1:
            raise NotDecidableError(f"approval {approval_id} is {self.get(approval_id).state}, not pending: it cannot be decided")
        metrics.approval_decided(to.value)
        return self.get(approval_id)
