"""StoredReceipts: the general write path, and the reads of receipts and their history.

The proxy's own writes go through its journal writer process (proxy_addon/journal/); this is the path
everything else takes (the CLI, the reconciler, recovery, a person's review, the proxy's fallbacks, tests).
Both run the same writes, defined once in journal/writes.py: here each runs on the driver under a
SQLAlchemy transaction of `Database.write` (statements sent with exec_driver_sql, so that SQLAlchemy still
wraps their errors and replaces a connection the server dropped), there on the writer's own connection.

The write a newcomer looks for, top to bottom in this file:
1. `record_and_submit` decides and records in one transaction (writes.py, `record`): an earlier receipt of
   the same intent in the way (an open one, a recent success, an Idempotency-Key used for another request)
   is raised as DuplicateIntentError, which carries it to the caller, which answers from it (rules/duplicates.py).
   Otherwise the receipt is inserted as `submitted` with its creation row (`planned`) and its
   `planned -> submitted` row, and committed: only then may the request go upstream. The partial unique
   index over open receipts is the last word: of two writers that decide at once, the second inserts
   nothing there and is refused like any duplicate.
2. `transition` records every later step (the verdict, recovery, the reconciler, a person): a
   compare-and-set of the state with its history row, in one commit (writes.py, `advance`).
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, select

from proxy_addon import metrics
from proxy_addon.exceptions import ApprovalNeededError, DuplicateIntentError, ReceiptNotFoundError
from proxy_addon.journal.driver import Cursor
from proxy_addon.journal.rows import Foreseen, NewReceipt, Step
from proxy_addon.journal.statements import DriverStatements
from proxy_addon.journal.tables import Receipt, ReceiptTransition
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import (
    ANY_AGENT,
    AgentFilter,
    ApprovalRecord,
    Blocker,
    Intent,
    ReceiptRecord,
    TransitionRecord,
    utcnow,
)
from proxy_addon.rules.states import State
from proxy_addon.store.database import Database

receipts: Table = Receipt.__table__  # type: ignore[assignment]
transitions: Table = ReceiptTransition.__table__  # type: ignore[assignment]


class StoredReceipts:
    def __init__(self, db: Database):
        self.db = db
        self.statements = DriverStatements(db.engine.dialect)

    # -- the write path ---------------------------------------------------------------------------------------

    def record_and_submit(
        self, intent: Intent, after_success: AfterSuccess | None, who: str, approval: ApprovalAsk | None = None
    ) -> None:
        """Decide and commit the receipt as `submitted`, its creation row and its `planned -> submitted` row
        together: one durable commit before the request may go upstream (docs/architecture.md, "States").

        Raises DuplicateIntentError, ApprovalNeededError (`approval`: a person must approve first; its pending
        approval may have been written, no receipt was) or JournalUnavailableError.
        """
        with self.db.storage_errors():
            self._record(intent, after_success or AfterSuccess(), submitted_by=who, approval=approval)
        metrics.transitioned(State.SUBMITTED)

    def record(self, intent: Intent, after_success: AfterSuccess | None = None) -> None:
        """Decide and commit a `planned` receipt (for tests and tools: the proxy records `submitted` at once)."""
        with self.db.storage_errors():
            self._record(intent, after_success or AfterSuccess(), submitted_by=None)

    def _record(
        self, intent: Intent, after_success: AfterSuccess, submitted_by: str | None, approval: ApprovalAsk | None = None
    ) -> None:
        new = NewReceipt(intent, successes_block_for(after_success), submitted_by, at=utcnow(), approval=approval)
        recorded = self.db.write(lambda conn: self.writes(conn).record(new))
        if isinstance(recorded, ApprovalRecord):
            raise ApprovalNeededError(recorded, intent)
        if not isinstance(recorded, str):
            raise DuplicateIntentError.of(recorded, intent)
        metrics.transitioned(State.PLANNED)

    def transition(
        self,
        operation_id: str,
        expected_from: State | str,
        to: State | str,
        detail: dict[str, Any] | None = None,
        owned_by: str | None = None,
        **updates: Any,
    ) -> None:
        """Compare-and-set `expected_from -> to`, with column updates, and its history row, in one commit.

        Raises StaleStateError when the receipt is in another state (someone else moved it first).
        `owned_by` adds the lease holder to the compare: a worker whose lease expired and was taken over
        cannot write a verdict over its successor's.
        """
        step = Step(operation_id, expected_from, to, detail or {}, updates, owned_by, at=utcnow())
        with self.db.storage_errors():
            self.db.write(lambda conn: self.writes(conn).advance(step))
        metrics.transitioned(step.to)

    def writes(self, conn: Connection) -> JournalWrites:
        """The writes (journal/writes.py) inside `conn`'s transaction: for a part of the store that moves several
        receipts in one transaction (the reconcile queue's claim)."""
        return JournalWrites.on(_OnSQLAlchemy(conn), self.statements)

    # -- the duplicate decision, read only --------------------------------------------------------------------

    def blocker_of(self, receipt: ReceiptRecord, after_success: AfterSuccess) -> Blocker | None:
        """What stands in the way, now, of the same request again (no Idempotency-Key): what `record` would
        refuse it with, or None when it would record a new receipt."""
        again = Intent(
            operation=receipt.operation,
            method=receipt.method,
            scheme=receipt.scheme,
            host=receipt.host,
            port=receipt.port,
            path=receipt.path,
            intent_fingerprint=receipt.intent_fingerprint,
            account=receipt.account,
        )
        with self.db.storage_errors(), self.db.reading() as conn:
            return self.writes(conn).blocker(again, successes_block_for(after_success))

    def foresee(self, intent: Intent, after_success: AfterSuccess, approval: ApprovalAsk | None = None) -> Foreseen:
        """What `record_and_submit` would decide for this intent now, in a read-only transaction: nothing is
        recorded and no approval is asked for (writes.py, `foresee`)."""
        new = NewReceipt(intent, successes_block_for(after_success), intent.proxy_instance, at=utcnow(), approval=approval)
        with self.db.storage_errors(), self.db.reading() as conn:
            return self.writes(conn).foresee(new)

    # -- reads ------------------------------------------------------------------------------------------------

    def states(self, operation_ids: Sequence[str]) -> dict[str, str]:
        """The current state of each of these receipts (one query; the missing ones are left out)."""
        query = select(receipts.c.operation_id, receipts.c.state).where(receipts.c.operation_id.in_(list(operation_ids)))
        with self.db.storage_errors(), self.db.reading() as conn:
            return dict(conn.execute(query).tuples().all())

    def get(self, operation_id: str) -> ReceiptRecord:
        with self.db.storage_errors(), self.db.reading() as conn:
            row = conn.execute(select(receipts).where(receipts.c.operation_id == operation_id)).first()
        if row is None:
            raise ReceiptNotFoundError(f"no receipt {operation_id}")
        return ReceiptRecord.from_row(row)

    def history(self, operation_id: str) -> list[TransitionRecord]:
        query = select(transitions).where(transitions.c.operation_id == operation_id).order_by(transitions.c.id)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [TransitionRecord(**r._mapping) for r in conn.execute(query)]

    def list(
        self,
        states: Sequence[str] | None = None,
        host: str | None = None,
        older_than: timedelta | None = None,
        limit: int | None = 100,
        port: int | None = None,
        after: str | None = None,
        operation: str | None = None,
        since: datetime | None = None,
        agent: AgentFilter = ANY_AGENT,
    ) -> list[ReceiptRecord]:
        """Newest first (journal order); `host` with `port` (when given) is the target as `receipts ls --host
        host:port` names it. `after` pages by key: the receipts journaled before that one (ReceiptNotFoundError
        when there is none), so a page costs its own rows however deep it is, where an OFFSET reads every row
        before it. `agent`: everyone's (ANY_AGENT), one agent's (its name), or the anonymous ones' (None)
        (rules/records.py, AgentFilter); ix_receipts_agent_seq serves the last two. `operation` and `since`
        (created at or after) have no index of their own: they narrow what the index read from the cursor on
        gives, row by row."""
        q = select(receipts).order_by(receipts.c.seq.desc())
        if after is not None:
            q = q.where(receipts.c.seq < self._seq_of(after))
        if agent is None:
            q = q.where(receipts.c.agent.is_(None))
        elif agent is not ANY_AGENT:
            q = q.where(receipts.c.agent == agent)
        if states:
            q = q.where(receipts.c.state.in_([State(s).value for s in states]))
        if host:
            q = q.where(receipts.c.host == host.lower())
        if port is not None:
            q = q.where(receipts.c.port == port)
        if older_than is not None:
            q = q.where(receipts.c.created_at <= utcnow() - older_than)
        if operation is not None:
            q = q.where(receipts.c.operation == operation)
        if since is not None:
            q = q.where(receipts.c.created_at >= since)
        if limit is not None:
            q = q.limit(limit)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [ReceiptRecord.from_row(r) for r in conn.execute(q)]

    def _seq_of(self, operation_id: str) -> int:
        with self.db.storage_errors(), self.db.reading() as conn:
            seq = conn.execute(select(receipts.c.seq).where(receipts.c.operation_id == operation_id)).scalar()
        if seq is None:
            raise ReceiptNotFoundError(f"no receipt {operation_id}")
        return int(seq)


class _OnSQLAlchemy:
    """The writes' Connection (journal/writes.py) on a SQLAlchemy connection: each statement, already in the
    driver's parameter style with its values converted, goes to the driver through exec_driver_sql, within the
    connection's transaction; SQLAlchemy wraps its errors and invalidates a connection the server dropped."""

    __slots__ = ("conn",)

    def __init__(self, conn: Connection):
        self.conn = conn

    def execute(self, statement: str, params: dict[str, Any]) -> Cursor:
        return self.conn.exec_driver_sql(statement, params)

    def pipeline(self) -> AbstractContextManager[Any]:
        return nullcontext()  # one statement at a time: the general path writes one receipt per transaction
