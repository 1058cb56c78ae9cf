"""Receipts: the general write path, and the reads of receipts and their history.

The proxy's own writes go through its journal writer process (proxy_addon/journal/), which runs the same
decision and the same writes as plain SQL; this is the general path everything else uses (the CLI, the
reconciler, recovery, tests), and the reference that the writer's statements are tested equal to.

The write a newcomer looks for, top to bottom in this file:
1. `record_and_submit` decides and records in one transaction: `_find_blocker` looks for an earlier receipt
   of the same intent in the way (an open one, a recent success, an Idempotency-Key used for another
   request); if there is one, DuplicateIntentError carries it to the caller, which answers from it
   (rules/duplicates.py). Otherwise the receipt is inserted as `submitted` with its creation row (`planned`) and
   its `planned -> submitted` row, and committed: only then may the request go upstream. The partial unique
   index over open receipts is the last word: of two writers that decide at once, the second insert fails
   there and is refused like any duplicate.
2. `transition` records every later step (the verdict, recovery, the reconciler, a person): a
   compare-and-set of the state with its history row, in one commit.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, and_, bindparam, case, exists, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from proxy_addon import metrics
from proxy_addon.config import AfterSuccess
from proxy_addon.exceptions import (
    DuplicateIntentError,
    IllegalTransitionError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    StaleStateError,
)
from proxy_addon.rules.duplicates import INVALIDATING_METHODS, NOT_HAPPENED_STATES
from proxy_addon.rules.records import (
    INTENT_FIELDS,
    Blocker,
    BlockKind,
    Intent,
    ReceiptRecord,
    TransitionRecord,
    utcnow,
)
from proxy_addon.rules.states import OPEN_STATES, TERMINAL_STATES, State, is_allowed
from proxy_addon.store.database import Database
from proxy_addon.store.tables import Receipt, ReceiptTransition

receipts: Table = Receipt.__table__  # type: ignore[assignment]
transitions: Table = ReceiptTransition.__table__  # type: ignore[assignment]

# what `transition` may change besides the state (everything else is fixed once the receipt is recorded)
UPDATABLE = frozenset(
    {
        "status_code",
        "external_id",
        "error_code",
        "error_message",
        "submitted_at",
        "completed_at",
        "response_headers",
        "response_body",
        "response_body_truncated",
        "response_body_redacted",
        "reconcile_attempts",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
    }
)
RECORD_ATTEMPTS = 3  # decide-and-insert rounds lost to a concurrent writer before giving up

# Statements built once: each execution skips statement construction and hits SQLAlchemy's compiled cache.
_OPEN = [s.value for s in OPEN_STATES]
_IS_OPEN = receipts.c.state.in_(_OPEN)
_SAME_INTENT = (receipts.c.account == bindparam("b_account"), receipts.c.intent_fingerprint == bindparam("b_fp"))
_INSERT_RECEIPT = insert(receipts)
_INSERT_TRANSITION = insert(transitions)
_Q_STATE = select(receipts.c.state).where(receipts.c.operation_id == bindparam("b_op"))
_Q_KEY_MISMATCH = (
    select(receipts)
    .where(
        receipts.c.account == bindparam("b_account"),
        receipts.c.idempotency_key == bindparam("b_key"),
        receipts.c.intent_fingerprint != bindparam("b_fp"),
    )
    .limit(1)
)
_Q_OPEN = select(receipts).where(*_SAME_INTENT, _IS_OPEN).limit(1)
# A success's replay window ends with a later write to its target (rules/duplicates.py says which). "Later" is by the
# order the receipts were journaled in: their creation rows' history ids, one sequence for every replica,
# which the replicas' clocks cannot reorder.
_later, _later_created, _own_created = receipts.alias("later"), transitions.alias("later_created"), transitions.alias("own_created")
_LATER_WRITE_TO_TARGET = (
    exists()
    .where(
        _later.c.account == receipts.c.account,
        _later.c.host == receipts.c.host,
        _later.c.port == receipts.c.port,
        _later.c.path == receipts.c.path,
        _later.c.scheme == receipts.c.scheme,
        _later.c.method.in_(INVALIDATING_METHODS),
        _later.c.state.not_in([s.value for s in NOT_HAPPENED_STATES]),
        _later_created.c.operation_id == _later.c.operation_id,
        _later_created.c.from_state.is_(None),
        _own_created.c.operation_id == receipts.c.operation_id,
        _own_created.c.from_state.is_(None),
        _later_created.c.id > _own_created.c.id,
    )
    .correlate(receipts)
)
_STILL_BLOCKING_SUCCESS = and_(
    receipts.c.state == State.SUCCEEDED.value,
    receipts.c.completed_at >= bindparam("b_since"),
    ~_LATER_WRITE_TO_TARGET,
)
_Q_OPEN_OR_SUCCEEDED = (  # an open receipt wins over a success; the latest success over older ones
    select(receipts)
    .where(*_SAME_INTENT, or_(_IS_OPEN, _STILL_BLOCKING_SUCCESS))
    .order_by(case((_IS_OPEN, 0), else_=1), receipts.c.completed_at.desc())
    .limit(1)
)
_CAS_GUARD = (receipts.c.operation_id == bindparam("b_op"), receipts.c.state == bindparam("b_from"))
_CAS = update(receipts).where(*_CAS_GUARD)  # SET comes from the execution's parameters
_CAS_OWNED = update(receipts).where(*_CAS_GUARD, receipts.c.lease_owner == bindparam("b_owner"))


class Receipts:
    def __init__(self, db: Database):
        self.db = db

    # -- the write path ---------------------------------------------------------------------------------------

    def record_and_submit(self, intent: Intent, after_success: AfterSuccess | None, who: str) -> None:
        """Decide and commit the receipt as `submitted`, its creation row and its `planned -> submitted` row
        together: one durable commit before the request may go upstream (docs/architecture.md, "States").

        Raises DuplicateIntentError or JournalUnavailableError; either way nothing was recorded.
        """
        with self.db.storage_errors():
            self._record(intent, after_success or AfterSuccess(), submitted_by=who)
        metrics.transitioned(State.SUBMITTED)

    def record(self, intent: Intent, after_success: AfterSuccess | None = None) -> None:
        """Decide and commit a `planned` receipt (for tests and tools: the proxy records `submitted` at once)."""
        with self.db.storage_errors():
            self._record(intent, after_success or AfterSuccess(), submitted_by=None)

    def _record(self, intent: Intent, after_success: AfterSuccess, submitted_by: str | None) -> None:
        now = utcnow()
        row = {name: getattr(intent, name) for name in INTENT_FIELDS}
        row.update(state=State.PLANNED.value, created_at=now, updated_at=now, authentication_recorded=False)
        history: list[dict[str, Any]] = [
            {
                "operation_id": intent.operation_id,
                "from_state": None,
                "to_state": State.PLANNED.value,
                "recorded_at": now,
                "detail": {"who": intent.proxy_instance or "store", "fingerprint": intent.intent_fingerprint},
            }
        ]
        if submitted_by is not None:
            row.update(state=State.SUBMITTED.value, submitted_at=now)
            step = {"from_state": State.PLANNED.value, "to_state": State.SUBMITTED.value, "detail": {"who": submitted_by}}
            history.append({**history[0], **step})

        def decide_and_insert(c: Connection) -> None:
            blocker = _find_blocker(c, intent, after_success)
            if blocker is not None:
                raise DuplicateIntentError.of(blocker, intent)
            c.execute(_INSERT_RECEIPT, row)
            c.execute(_INSERT_TRANSITION, history)

        for _attempt in range(RECORD_ATTEMPTS):
            try:
                self.db.write(decide_and_insert)
            except IntegrityError:  # another writer's open receipt of this intent won the unique index
                with self.db.reading() as rc:
                    open_row = rc.execute(_Q_OPEN, _intent_params(intent)).first()
                if open_row is not None:
                    raise DuplicateIntentError.of(Blocker(BlockKind.OPEN, ReceiptRecord.from_row(open_row)), intent) from None
                continue
            metrics.transitioned(State.PLANNED)
            return
        raise JournalUnavailableError("could not record the intent: the open-intent index kept changing")

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
        expected_from, to = State(expected_from), State(to)
        if not is_allowed(expected_from, to):
            raise IllegalTransitionError(f"{expected_from.value} -> {to.value} is not an allowed transition")
        unknown = set(updates) - UPDATABLE
        if unknown:
            raise ValueError(f"transition cannot set {', '.join(sorted(unknown))}")
        now = utcnow()
        if to == State.SUBMITTED:
            updates.setdefault("submitted_at", now)
        if to in TERMINAL_STATES:
            updates.setdefault("completed_at", now)
        step = _Step(operation_id, expected_from, to, detail or {}, owned_by, updates, now)
        with self.db.storage_errors():
            self.db.write(step.apply)
        metrics.transitioned(to)

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
            return _find_blocker(conn, again, after_success)

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
    ) -> list[ReceiptRecord]:
        """Newest first; `host` with `port` (when given) is the target as `receipts ls --host host:port` names it."""
        q = select(receipts).order_by(receipts.c.created_at.desc(), receipts.c.operation_id.desc())
        if states:
            q = q.where(receipts.c.state.in_([State(s).value for s in states]))
        if host:
            q = q.where(receipts.c.host == host.lower())
        if port is not None:
            q = q.where(receipts.c.port == port)
        if older_than is not None:
            q = q.where(receipts.c.created_at <= utcnow() - older_than)
        if limit is not None:
            q = q.limit(limit)
        with self.db.storage_errors(), self.db.reading() as conn:
            return [ReceiptRecord.from_row(r) for r in conn.execute(q)]


def _intent_params(intent: Intent) -> dict[str, Any]:
    return {"b_account": intent.account, "b_fp": intent.intent_fingerprint}


def _find_blocker(conn: Connection, intent: Intent, after_success: AfterSuccess) -> Blocker | None:
    """At most two indexed queries: a reused Idempotency-Key (skipped for the key the proxy injects, a fresh
    operation id), then the open receipt or, under an after-success policy, the recent success of the same
    intent that no later write to its target has invalidated, in one query (an open one wins)."""
    if intent.idempotency_key is not None and intent.idempotency_key != intent.operation_id:
        other = conn.execute(_Q_KEY_MISMATCH, {**_intent_params(intent), "b_key": intent.idempotency_key}).first()
        if other is not None:
            return Blocker(BlockKind.KEY_MISMATCH, ReceiptRecord.from_row(other))
    if after_success.policy != "allow" and after_success.window > 0:
        since = utcnow() - timedelta(seconds=after_success.window)
        row = conn.execute(_Q_OPEN_OR_SUCCEEDED, {**_intent_params(intent), "b_since": since}).first()
    else:
        row = conn.execute(_Q_OPEN, _intent_params(intent)).first()
    if row is None:
        return None
    kind = BlockKind.SUCCEEDED if row.state == State.SUCCEEDED.value else BlockKind.OPEN
    return Blocker(kind, ReceiptRecord.from_row(row))


@dataclass(frozen=True, slots=True)
class _Step:
    """One compare-and-set with its history row: the unit of work a transaction (or a batch) runs."""

    operation_id: str
    expected_from: State
    to: State
    detail: dict[str, Any]
    owned_by: str | None
    updates: dict[str, Any]
    now: datetime

    def apply(self, conn: Connection) -> None:
        params = {"b_op": self.operation_id, "b_from": self.expected_from.value, "state": self.to.value, "updated_at": self.now}
        params.update(self.updates)
        if self.owned_by is not None:
            params["b_owner"] = self.owned_by
        result = conn.execute(_CAS if self.owned_by is None else _CAS_OWNED, params)
        if result.rowcount != 1:
            actual = conn.execute(_Q_STATE, {"b_op": self.operation_id}).scalar()
            if actual is None:
                raise ReceiptNotFoundError(f"no receipt {self.operation_id}")
            raise StaleStateError(self.operation_id, self.expected_from.value, actual)
        conn.execute(
            _INSERT_TRANSITION,
            {
                "operation_id": self.operation_id,
                "from_state": self.expected_from.value,
                "to_state": self.to.value,
                "recorded_at": self.now,
                "detail": self.detail,
            },
        )
