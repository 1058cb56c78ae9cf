"""The receipt store: the one place that writes receipts, their history and the proxy instances.

Every state change is one transaction that updates the receipt only if it is still in the expected state
(compare-and-set), appends its history row, and commits durably before returning. Storage errors are
wrapped at this boundary as JournalUnavailableError, so callers can fail closed on one exception type.
"""

import queue
import threading
import uuid
from concurrent.futures import Future
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, and_, bindparam, case, delete, func, insert, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from proxy_addon import metrics
from proxy_addon.config import AfterSuccess
from proxy_addon.exceptions import (
    DuplicateIntentError,
    DuplicateOpenError,
    DuplicateSucceededError,
    IdempotencyKeyMismatchError,
    IllegalTransitionError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    StaleStateError,
    SubmitNotRecordedError,
)
from proxy_addon.models import DuplicateRefusal, ProxyInstance, Receipt, ReceiptTransition
from proxy_addon.states import OPEN_STATES, TERMINAL_STATES, RefusalReason, State, is_allowed

receipts = Receipt.__table__
transitions = ReceiptTransition.__table__
instances = ProxyInstance.__table__
refusals = DuplicateRefusal.__table__

_OPEN = [s.value for s in OPEN_STATES]
T = TypeVar("T")
_UPDATABLE = {
    "status_code",
    "external_id",
    "error_code",
    "error_message",
    "submitted_at",
    "completed_at",
    "response_headers",
    "response_body",
    "response_body_truncated",
    "reconcile_attempts",
    "next_attempt_at",
    "lease_owner",
    "lease_expires_at",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_operation_id() -> str:
    return "op_" + uuid.uuid4().hex


@dataclass(frozen=True)
class NewIntent:
    """What the proxy knows about a write before it is sent; secrets already removed."""

    operation: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    intent_fingerprint: str
    account: str
    query: str | None = None
    idempotency_key: str | None = None
    request_headers: dict[str, str] | None = None
    request_body: bytes | None = None
    request_body_size: int = 0
    request_body_truncated: bool = False
    body_note: str | None = None
    proxy_instance: str | None = None
    operation_id: str = field(default_factory=new_operation_id)


@dataclass(frozen=True)
class ReceiptRecord:
    operation_id: str
    operation: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str | None
    intent_fingerprint: str
    account: str
    idempotency_key: str | None
    state: str
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    completed_at: datetime | None
    status_code: int | None
    external_id: str | None
    error_code: str | None
    error_message: str | None
    authentication_recorded: bool
    proxy_instance: str | None
    request_headers: dict[str, Any] | None
    request_body: bytes | None
    request_body_size: int
    request_body_truncated: bool
    body_note: str | None
    response_headers: dict[str, Any] | None
    response_body: bytes | None
    response_body_truncated: bool
    reconcile_attempts: int
    next_attempt_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> "ReceiptRecord":
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls)})

    @property
    def is_open(self) -> bool:
        return State(self.state) in OPEN_STATES


@dataclass(frozen=True)
class TransitionRecord:
    id: int
    operation_id: str
    from_state: str | None
    to_state: str
    recorded_at: datetime
    detail: dict[str, Any]


@dataclass(frozen=True)
class RefusalRecord:
    id: int
    refused_at: datetime
    reason: str
    blocking_operation_id: str
    account: str
    intent_fingerprint: str
    method: str
    host: str
    path: str
    proxy_instance: str | None


@dataclass(frozen=True)
class Recovered:
    operation_id: str
    instance_id: str
    from_state: str
    to_state: str


# Pre-built statements for the hot path: built once, so each execution skips statement construction,
# and SQLAlchemy's compiled cache is hit by the statement's memoized cache key.
_INTENT_FIELDS = tuple(f.name for f in fields(NewIntent))
_INSERT_RECEIPT = insert(receipts)
_INSERT_TRANSITION = insert(transitions)
_Q_STATE = select(receipts.c.state).where(receipts.c.operation_id == bindparam("b_op"))
_Q_KEY_MISMATCH = (
    select(receipts.c.operation_id, receipts.c.state)
    .where(
        receipts.c.account == bindparam("b_account"),
        receipts.c.idempotency_key == bindparam("b_key"),
        receipts.c.intent_fingerprint != bindparam("b_fp"),
    )
    .limit(1)
)
_SAME_INTENT = (receipts.c.account == bindparam("b_account"), receipts.c.intent_fingerprint == bindparam("b_fp"))
_IS_OPEN = receipts.c.state.in_(_OPEN)
_Q_OPEN = select(receipts.c.operation_id, receipts.c.state).where(*_SAME_INTENT, _IS_OPEN).limit(1)
_Q_OPEN_OR_SUCCEEDED = (
    select(receipts.c.operation_id, receipts.c.state)
    .where(
        *_SAME_INTENT,
        or_(
            _IS_OPEN,
            and_(receipts.c.state == State.SUCCEEDED.value, receipts.c.completed_at >= bindparam("b_since")),
        ),
    )
    .order_by(case((_IS_OPEN, 0), else_=1), receipts.c.completed_at.desc())
    .limit(1)
)
_CAS_GUARD = (receipts.c.operation_id == bindparam("b_op"), receipts.c.state == bindparam("b_from"))
_CAS_OWNED_GUARD = (*_CAS_GUARD, receipts.c.lease_owner == bindparam("b_owner"))
_CAS = {  # (owned_by given, RETURNING wanted) -> UPDATE whose SET comes from the execution's parameters
    (False, False): update(receipts).where(*_CAS_GUARD),
    (True, False): update(receipts).where(*_CAS_OWNED_GUARD),
    (False, True): update(receipts).where(*_CAS_GUARD).returning(*receipts.c),
    (True, True): update(receipts).where(*_CAS_OWNED_GUARD).returning(*receipts.c),
}


class ReceiptStore:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self._committer: GroupCommitter | None = None

    # -- plumbing ---------------------------------------------------------------------------------------

    @contextmanager
    def _journal(self) -> Iterator[None]:
        """Turn any storage failure into JournalUnavailableError, naming the cause in one line."""
        try:
            yield
        except SQLAlchemyError as e:
            cause = str(getattr(e, "orig", None) or e).strip().splitlines()
            raise JournalUnavailableError(f"cannot write the journal: {cause[0] if cause else type(e).__name__}") from e

    def _db_now(self, conn: Connection) -> datetime:
        """The database's clock on PostgreSQL (replicas may disagree; the database is the reference)."""
        if self.dialect == "postgresql":
            return conn.execute(select(func.now())).scalar_one().astimezone(UTC)
        return utcnow()

    def db_now(self) -> datetime:
        """The reference clock that leases, due times and heartbeats are compared with (see _db_now)."""
        with self._journal(), self._read() as conn:
            return self._db_now(conn)

    def _read(self) -> Any:
        conn = self.engine.connect()
        return conn.execution_options(sqlite_begin="DEFERRED") if self.dialect == "sqlite" else conn

    # -- writes -----------------------------------------------------------------------------------------

    def record_intent(self, intent: NewIntent, after_success: AfterSuccess | None = None) -> ReceiptRecord:
        """Decide and record in one transaction: refuse a duplicate, or commit a new `planned` receipt.

        The partial unique index on (account, fingerprint) for open states is the last word: if two
        writers pass the checks at once, the second insert fails there and is reported as a duplicate.
        """
        try:
            with self._journal():
                self._plan(None, intent, after_success or AfterSuccess())
        except DuplicateIntentError as e:
            e.intent = intent  # what the caller needs to record the refusal (record_refusal)
            raise
        return self.get(intent.operation_id)

    def record_and_submit(self, intent: NewIntent, after_success: AfterSuccess | None, who: str) -> None:
        """The proxy's hot path: `record_intent` (decide, commit `planned`), then `planned -> submitted`
        in a second commit, both on one connection checkout, with pre-built statements and no RETURNING.

        Raises what record_intent raises; SubmitNotRecordedError when `planned` was committed but
        `submitted` could not be (the caller must not send, and closes the planned receipt).
        """
        try:
            with self._journal(), self._hot_connection() as conn:
                self._plan(conn, intent, after_success or AfterSuccess())
                now = utcnow()
                try:
                    with self._journal():
                        self._write(
                            lambda c: self._cas(
                                c, intent.operation_id, State.PLANNED, State.SUBMITTED, {"who": who}, None,
                                {"submitted_at": now}, now, returning=False,
                            ),
                            conn,
                        )
                except JournalUnavailableError as e:
                    raise SubmitNotRecordedError(intent.operation_id, str(e)) from e
                except StaleStateError as e:  # another instance settled it first (it took this one for dead)
                    raise SubmitNotRecordedError(intent.operation_id, f"cannot mark it submitted: {e}") from e
        except DuplicateIntentError as e:
            e.intent = intent
            raise
        metrics.transitioned(State.SUBMITTED)

    def enable_group_commit(self, max_batch: int = 64) -> None:
        """Send every hot-path write (record_and_submit, advance, transition) through one writer thread
        that commits what is queued together (SQLite: one writer at a time anyway, one fsync per batch)."""
        if self._committer is None:
            self._committer = GroupCommitter(self.engine, max_batch)

    def close(self) -> None:
        if self._committer is not None:
            self._committer.stop()
            self._committer = None

    @contextmanager
    def _hot_connection(self) -> Iterator[Connection | None]:
        """The connection the hot path's transactions share; none under group commit (the writer has its own)."""
        if self._committer is not None:
            yield None
            return
        with self.engine.connect() as conn:
            yield conn

    def _write(self, work: Callable[[Connection], T], conn: Connection | None = None) -> T:
        """Run `work` in one committed transaction: the group committer's, or one on `conn` (or a fresh checkout)."""
        if self._committer is not None:
            return self._committer.run(work)
        if conn is not None:
            return self._in_transaction(conn, work)
        with self.engine.connect() as fresh:
            return self._in_transaction(fresh, work)

    def _in_transaction(self, conn: Connection, work: Callable[[Connection], T]) -> T:
        """Run `work` in one transaction on `conn` and commit it.

        There is no pool_pre_ping (it cost a round trip per checkout). A pooled connection that the
        database dropped while idle (a restarted PostgreSQL) fails at the transaction's first statement;
        SQLAlchemy then invalidates it and the pool's older connections. Such an attempt committed
        nothing, so it runs once more, on a fresh connection. A failure at COMMIT is never retried:
        the commit may have happened.
        """
        for attempt in (1, 2):
            trans = conn.begin()
            try:
                out = work(conn)
            except DBAPIError as e:
                trans.rollback()
                if attempt == 1 and e.connection_invalidated:
                    continue
                raise
            except BaseException:
                trans.rollback()
                raise
            trans.commit()
            return out
        raise AssertionError("unreachable")

    def _plan(self, conn: Connection | None, intent: NewIntent, after_success: AfterSuccess) -> None:
        """The decision and the `planned` insert, one transaction, committed (on `conn` if given)."""
        now = utcnow()
        values = {name: getattr(intent, name) for name in _INTENT_FIELDS}
        values.update(state=State.PLANNED.value, created_at=now, updated_at=now, authentication_recorded=False)
        history = {
            "operation_id": intent.operation_id,
            "from_state": None,
            "to_state": State.PLANNED.value,
            "recorded_at": now,
            "detail": {"who": intent.proxy_instance or "store", "fingerprint": intent.intent_fingerprint},
        }

        def decide_and_insert(c: Connection) -> None:
            self._refuse_duplicates(c, intent, after_success)
            c.execute(_INSERT_RECEIPT, values)
            c.execute(_INSERT_TRANSITION, history)

        for _attempt in range(3):
            try:
                self._write(decide_and_insert, conn)
                metrics.transitioned(State.PLANNED)
                return
            except IntegrityError:
                with self._read() as rc:
                    blocking = self._open_for(rc, intent)
                if blocking is not None:
                    raise _duplicate_open(blocking) from None
        raise JournalUnavailableError("could not record the intent: the open-intent index kept changing")

    def _refuse_duplicates(self, conn: Connection, intent: NewIntent, after_success: AfterSuccess) -> None:
        """At most two indexed queries: a reused Idempotency-Key (skipped for the key the proxy injects,
        a fresh operation id), then the open receipt or, under an after-success policy, the recent
        success of the same intent, in one query (an open one wins)."""
        if intent.idempotency_key is not None and intent.idempotency_key != intent.operation_id:
            other = conn.execute(
                _Q_KEY_MISMATCH,
                {"b_account": intent.account, "b_key": intent.idempotency_key, "b_fp": intent.intent_fingerprint},
            ).first()
            if other is not None:
                raise IdempotencyKeyMismatchError(
                    other.operation_id,
                    other.state,
                    f"Idempotency-Key {intent.idempotency_key!r} was used by {other.operation_id} for a different request",
                )
        params: dict[str, Any] = {"b_account": intent.account, "b_fp": intent.intent_fingerprint}
        if after_success.policy != "allow" and after_success.window > 0:
            params["b_since"] = utcnow() - timedelta(seconds=after_success.window)
            row = conn.execute(_Q_OPEN_OR_SUCCEEDED, params).first()
        else:
            row = conn.execute(_Q_OPEN, params).first()
        if row is None:
            return
        if row.state != State.SUCCEEDED.value:
            raise _duplicate_open(row)
        full = conn.execute(select(receipts).where(receipts.c.operation_id == row.operation_id)).one()
        raise DuplicateSucceededError(
            row.operation_id,
            row.state,
            f"the same request succeeded as {row.operation_id} at {full.completed_at:%Y-%m-%dT%H:%M:%SZ}",
            receipt=ReceiptRecord.from_row(full),
            policy=after_success.policy,
        )

    def _open_for(self, conn: Connection, intent: NewIntent) -> Any:
        return conn.execute(_Q_OPEN, {"b_account": intent.account, "b_fp": intent.intent_fingerprint}).first()

    def transition(
        self,
        operation_id: str,
        expected_from: State | str,
        to: State | str,
        detail: dict[str, Any] | None = None,
        owned_by: str | None = None,
        **updates: Any,
    ) -> ReceiptRecord:
        """Compare-and-set `expected_from -> to`, with column updates, and its history row, in one commit.

        `owned_by` adds the lease holder to the compare: a worker whose lease expired and was taken over
        cannot write a verdict over its successor's.
        """
        row = self._transition(operation_id, expected_from, to, detail, owned_by, updates, returning=True)
        return ReceiptRecord.from_row(row)

    def advance(
        self,
        operation_id: str,
        expected_from: State | str,
        to: State | str,
        detail: dict[str, Any] | None = None,
        **updates: Any,
    ) -> None:
        """`transition` for the proxy's hot path: the same compare-and-set and commit, nothing read back."""
        self._transition(operation_id, expected_from, to, detail, None, updates, returning=False)

    def _transition(
        self,
        operation_id: str,
        expected_from: State | str,
        to: State | str,
        detail: dict[str, Any] | None,
        owned_by: str | None,
        updates: dict[str, Any],
        returning: bool,
    ) -> Any:
        expected_from, to = State(expected_from), State(to)
        if not is_allowed(expected_from, to):
            raise IllegalTransitionError(f"{expected_from.value} -> {to.value} is not an allowed transition")
        unknown = set(updates) - _UPDATABLE
        if unknown:
            raise ValueError(f"transition cannot set {', '.join(sorted(unknown))}")
        now = utcnow()
        if to == State.SUBMITTED:
            updates.setdefault("submitted_at", now)
        if to in TERMINAL_STATES:
            updates.setdefault("completed_at", now)
        with self._journal():
            row = self._write(
                lambda c: self._cas(c, operation_id, expected_from, to, detail, owned_by, updates, now, returning)
            )
        metrics.transitioned(to)
        return row

    def _cas(
        self,
        conn: Connection,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any] | None,
        owned_by: str | None,
        updates: dict[str, Any],
        now: datetime,
        returning: bool,
    ) -> Any:
        params = {"b_op": operation_id, "b_from": expected_from.value, "state": to.value, "updated_at": now, **updates}
        if owned_by is not None:
            params["b_owner"] = owned_by
        stmt = _CAS[(owned_by is not None, returning)]
        result = conn.execute(stmt, params)
        row = result.first() if returning else None
        if (row is None) if returning else (result.rowcount != 1):
            actual = conn.execute(_Q_STATE, {"b_op": operation_id}).scalar()
            if actual is None:
                raise ReceiptNotFoundError(f"no receipt {operation_id}")
            raise StaleStateError(operation_id, expected_from.value, actual)
        conn.execute(
            _INSERT_TRANSITION,
            {
                "operation_id": operation_id,
                "from_state": expected_from.value,
                "to_state": to.value,
                "recorded_at": now,
                "detail": detail or {},
            },
        )
        return row

    # -- reads ------------------------------------------------------------------------------------------

    def get(self, operation_id: str) -> ReceiptRecord:
        with self._journal(), self._read() as conn:
            row = conn.execute(select(receipts).where(receipts.c.operation_id == operation_id)).first()
        if row is None:
            raise ReceiptNotFoundError(f"no receipt {operation_id}")
        return ReceiptRecord.from_row(row)

    def history(self, operation_id: str) -> list[TransitionRecord]:
        with self._journal(), self._read() as conn:
            rows = conn.execute(
                select(transitions).where(transitions.c.operation_id == operation_id).order_by(transitions.c.id)
            ).all()
        return [TransitionRecord(**r._mapping) for r in rows]

    def list_receipts(
        self,
        states: Sequence[str] | None = None,
        host: str | None = None,
        older_than: timedelta | None = None,
        limit: int | None = 100,
    ) -> list[ReceiptRecord]:
        """Newest first."""
        q = select(receipts).order_by(receipts.c.created_at.desc(), receipts.c.operation_id.desc())
        if states:
            q = q.where(receipts.c.state.in_([State(s).value for s in states]))
        if host:
            q = q.where(receipts.c.host == host.lower())
        if older_than is not None:
            q = q.where(receipts.c.created_at <= utcnow() - older_than)
        if limit is not None:
            q = q.limit(limit)
        with self._journal(), self._read() as conn:
            return [ReceiptRecord.from_row(r) for r in conn.execute(q)]

    def duplicate_of(self, receipt: ReceiptRecord, after_success: AfterSuccess) -> DuplicateIntentError | None:
        """What `record_intent` would answer, now, to the same request again (without an Idempotency-Key):
        the refusal it would raise, or None when it would record a new receipt (and the proxy forward it)."""
        again = NewIntent(
            operation=receipt.operation,
            method=receipt.method,
            scheme=receipt.scheme,
            host=receipt.host,
            port=receipt.port,
            path=receipt.path,
            intent_fingerprint=receipt.intent_fingerprint,
            account=receipt.account,
        )
        with self._journal(), self._read() as conn:
            try:
                self._refuse_duplicates(conn, again, after_success)
            except DuplicateIntentError as e:
                return e
        return None

    # -- refused duplicates -----------------------------------------------------------------------------

    def record_refusal(
        self,
        reason: RefusalReason | str,
        blocking_operation_id: str,
        *,
        account: str,
        intent_fingerprint: str,
        method: str,
        host: str,
        path: str,
        proxy_instance: str | None = None,
    ) -> RefusalRecord:
        """Note a request answered from an earlier receipt (refused or replayed). Identity only: no headers, no body."""
        values = {
            "refused_at": utcnow(),
            "reason": RefusalReason(reason).value,
            "blocking_operation_id": blocking_operation_id,
            "account": account,
            "intent_fingerprint": intent_fingerprint,
            "method": method,
            "host": host,
            "path": path,
            "proxy_instance": proxy_instance,
        }
        with self._journal(), self.engine.begin() as conn:
            row = conn.execute(insert(refusals).values(**values).returning(*refusals.c)).one()
        return RefusalRecord(**row._mapping)

    def list_refusals(
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
        with self._journal(), self._read() as conn:
            return [RefusalRecord(**r._mapping) for r in conn.execute(q)]

    # -- proxy instances and crash recovery -------------------------------------------------------------

    def register_instance(self, instance_id: str, hostname: str, pid: int) -> None:
        with self._journal(), self.engine.begin() as conn:
            now = self._db_now(conn)
            conn.execute(
                insert(instances).values(
                    instance_id=instance_id, hostname=hostname, pid=pid, started_at=now, heartbeat_at=now
                )
            )

    def heartbeat(self, instance_id: str) -> None:
        """Also clears `recovered_at`: an instance once taken for dead (frozen, or cut off from the database
        longer than instance_dead_after) that beats again is alive, and is recovered again when it dies."""
        with self._journal(), self.engine.begin() as conn:
            now = self._db_now(conn)
            conn.execute(
                update(instances).where(instances.c.instance_id == instance_id).values(heartbeat_at=now, recovered_at=None)
            )

    def stop_instance(self, instance_id: str) -> None:
        with self._journal(), self.engine.begin() as conn:
            now = self._db_now(conn)
            conn.execute(
                update(instances).where(instances.c.instance_id == instance_id).values(stopped_at=now, heartbeat_at=now)
            )

    def dead_instances(self, me: str | None, dead_after: float, known_dead: Sequence[str] = ()) -> list[str]:
        """Instances not yet recovered that stopped, stopped heartbeating, or that the caller knows died."""
        with self._journal(), self._read() as conn:
            cutoff = self._db_now(conn) - timedelta(seconds=dead_after)
            rows = conn.execute(
                select(instances.c.instance_id).where(
                    instances.c.recovered_at.is_(None),
                    instances.c.instance_id != (me or ""),
                    (instances.c.stopped_at.is_not(None))
                    | (instances.c.heartbeat_at < cutoff)
                    | (instances.c.instance_id.in_(list(known_dead))),
                )
            ).all()
        return [r.instance_id for r in rows]

    def instances_on_host(self, hostname: str) -> list[tuple[str, int]]:
        with self._journal(), self._read() as conn:
            rows = conn.execute(
                select(instances.c.instance_id, instances.c.pid).where(
                    instances.c.hostname == hostname, instances.c.recovered_at.is_(None), instances.c.stopped_at.is_(None)
                )
            ).all()
        return [(r.instance_id, r.pid) for r in rows]

    def recover_instance(self, dead_instance: str, by: str | None) -> list[Recovered]:
        """A dead instance's `submitted` receipts become outcome_unknown, its `planned` ones rejected/not_sent."""
        recovered = self._settle_abandoned(
            dead_instance,
            self.unsettled_of(dead_instance),
            by,
            note={"dead_instance": dead_instance},
            code="proxy_interrupted",
            message="the proxy stopped while the request was in flight; the upstream may have acted",
        )
        with self._journal(), self.engine.begin() as conn:
            still = conn.execute(
                select(func.count()).select_from(receipts).where(
                    receipts.c.proxy_instance == dead_instance,
                    receipts.c.state.in_([State.PLANNED.value, State.SUBMITTED.value]),
                )
            ).scalar_one()
            if still == 0:
                conn.execute(
                    update(instances)
                    .where(instances.c.instance_id == dead_instance)
                    .values(recovered_at=self._db_now(conn))
                )
        return recovered

    def unsettled_of(self, instance_id: str) -> list[tuple[str, str]]:
        """(operation_id, state) of an instance's receipts still planned or submitted."""
        with self._journal(), self._read() as conn:
            rows = conn.execute(
                select(receipts.c.operation_id, receipts.c.state).where(
                    receipts.c.proxy_instance == instance_id,
                    receipts.c.state.in_([State.PLANNED.value, State.SUBMITTED.value]),
                )
            ).all()
        return [(r.operation_id, r.state) for r in rows]

    def settle_orphans(self, instance_id: str, orphans: Sequence[tuple[str, str]]) -> list[Recovered]:
        """A live instance's receipts that no request works on any more (their verdict could not be written):
        settled as if the instance had died, so they do not block retries for as long as it lives.
        The caller lists them from `unsettled_of` minus what it still has in flight."""
        return self._settle_abandoned(
            instance_id,
            orphans,
            instance_id,
            note={"orphaned_by": instance_id},
            code="verdict_not_recorded",
            message="the upstream's answer could not be journaled; the upstream may have acted",
        )

    def _settle_abandoned(
        self, instance_id: str, rows: Sequence[tuple[str, str]], by: str | None, note: dict[str, str], code: str, message: str
    ) -> list[Recovered]:
        recovered: list[Recovered] = []
        for operation_id, state in rows:
            if state == State.SUBMITTED.value:
                to, error_code, error_message = State.OUTCOME_UNKNOWN, code, message
            else:
                to, error_code, error_message = State.REJECTED, "not_sent", "the request was never sent"
            try:
                self.transition(
                    operation_id,
                    state,
                    to,
                    {"who": by or "recovery", "error": error_code, **note},
                    error_code=error_code,
                    error_message=error_message,
                )
            except StaleStateError:
                continue
            recovered.append(Recovered(operation_id, instance_id, state, to.value))
        return recovered

    def stats(self) -> dict[str, Any]:
        """Counts per state and per host and state, and the age of the oldest open receipt."""
        with self._journal(), self._read() as conn:
            rows = conn.execute(
                select(receipts.c.host, receipts.c.state, func.count()).group_by(receipts.c.host, receipts.c.state)
            ).all()
            oldest = conn.execute(
                select(func.min(receipts.c.created_at)).where(receipts.c.state.in_(_OPEN))
            ).scalar()
        by_state: dict[str, int] = {s.value: 0 for s in State}
        by_host: dict[str, dict[str, int]] = {}
        for host, state, count in rows:
            by_state[state] += count
            by_host.setdefault(host, {})[state] = count
        if oldest is not None and oldest.tzinfo is None:
            oldest = oldest.replace(tzinfo=UTC)
        age = (utcnow() - oldest).total_seconds() if oldest is not None else None
        return {"by_state": by_state, "by_host": by_host, "oldest_open_age_seconds": age}

    # -- reconciliation queue ---------------------------------------------------------------------------

    def claim_unknown(
        self, worker: str, lease_seconds: float, limit: int, due_by: datetime | None = None
    ) -> list[ReceiptRecord]:
        """Lease up to `limit` due outcome_unknown receipts to `worker` (outcome_unknown -> reconciling).

        Due: no `next_attempt_at`, or one not later than now (and not later than `due_by`, so that a
        reconcile pass never takes back a receipt it put back itself).
        PostgreSQL: FOR UPDATE SKIP LOCKED, so concurrent workers take disjoint rows. SQLite: the write
        transaction (BEGIN IMMEDIATE) already serialises claimers, and each claim is a compare-and-set.
        """
        with self._journal(), self.engine.begin() as conn:
            now = self._db_now(conn)
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
            if self.dialect == "postgresql":
                due = due.with_for_update(skip_locked=True)
            ids = [r.operation_id for r in conn.execute(due)]
            if not ids:
                return []
            expires = now + timedelta(seconds=lease_seconds)
            rows = conn.execute(
                update(receipts)
                .where(receipts.c.operation_id.in_(ids), receipts.c.state == State.OUTCOME_UNKNOWN.value)
                .values(
                    state=State.RECONCILING.value, lease_owner=worker, lease_expires_at=expires, updated_at=utcnow()
                )
                .returning(*receipts.c)
            ).all()
            if rows:
                conn.execute(
                    insert(transitions),
                    [
                        {
                            "operation_id": r.operation_id,
                            "from_state": State.OUTCOME_UNKNOWN.value,
                            "to_state": State.RECONCILING.value,
                            "recorded_at": utcnow(),
                            "detail": {"who": worker, "lease_expires_at": expires.isoformat()},
                        }
                        for r in rows
                    ],
                )
        for _ in rows:
            metrics.transitioned(State.RECONCILING)
        return [ReceiptRecord.from_row(r) for r in rows]

    def release_expired_leases(self, by: str) -> list[str]:
        """Receipts whose worker's lease ran out go back to outcome_unknown, to be claimed again."""
        with self._journal(), self._read() as conn:
            now = self._db_now(conn)
            rows = conn.execute(
                select(receipts.c.operation_id, receipts.c.lease_owner).where(
                    receipts.c.state == State.RECONCILING.value, receipts.c.lease_expires_at < now
                )
            ).all()
        released = []
        for row in rows:
            try:
                self.transition(
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

    # -- retention --------------------------------------------------------------------------------------

    def prune(self, older_than: timedelta) -> int:
        """Delete terminal receipts completed before `now - older_than`, with their history. Never an open one."""
        cutoff = utcnow() - older_than
        terminal = [s.value for s in TERMINAL_STATES]
        with self._journal(), self.engine.begin() as conn:
            doomed = select(receipts.c.operation_id).where(
                and_(receipts.c.state.in_(terminal), receipts.c.completed_at < cutoff)
            )
            conn.execute(delete(transitions).where(transitions.c.operation_id.in_(doomed)))
            result = conn.execute(
                delete(receipts).where(receipts.c.state.in_(terminal), receipts.c.completed_at < cutoff)
            )
            return result.rowcount or 0


def _duplicate_open(row: Any) -> DuplicateOpenError:
    return DuplicateOpenError(
        row.operation_id,
        row.state,
        f"a receipt for the same request is still open: {row.operation_id} is {row.state}",
    )


# One savepoint at a time, by a fixed name: SQLAlchemy's begin_nested() names each anew, so every one is
# compiled again (a sixth of the group-commit thread's time under load, by py-spy).
_SAVEPOINT = "SAVEPOINT receipt_work"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT receipt_work"
_RELEASE_SAVEPOINT = "RELEASE SAVEPOINT receipt_work"


class GroupCommitter:
    """One writer thread that commits every queued write transaction together: one BEGIN IMMEDIATE and
    one fsync for a batch, instead of one each (and no writers fighting over SQLite's lock).

    Each piece of work runs in its own SAVEPOINT inside the batch's transaction: one that fails (a
    duplicate caught by the open-intent index, a compare-and-set that finds another state) is rolled
    back alone and its caller gets its exception at once; the others are unaffected. A caller whose work
    succeeded gets its result only after the batch's COMMIT returned, so "committed before anything is
    sent" holds as before; if the COMMIT fails, every such caller gets that failure (nothing committed).
    A batch holds the work queued while the previous one committed, at most `max_batch`; alone in the
    queue, a write is committed at once, without waiting for company.
    """

    def __init__(self, engine: Engine, max_batch: int = 64):
        self.engine = engine
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[tuple[Callable[[Connection], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="receipts-group-commit", daemon=True)
        self._thread.start()

    def run(self, work: Callable[[Connection], T]) -> T:
        """Blocks the calling thread (never the event loop) until `work` is committed or failed."""
        if not self._thread.is_alive():
            raise JournalUnavailableError("cannot write the journal: the group-commit writer stopped")
        future: Future[T] = Future()
        self._queue.put((work, future))
        return future.result()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                batch.append(more)
            self._commit(batch)

    def _commit(self, batch: list[tuple[Callable[[Connection], Any], Future[Any]]]) -> None:
        pending = [(work, f) for work, f in batch if f.set_running_or_notify_cancel()]
        done: list[tuple[Future[Any], Any]] = []
        try:
            with self.engine.connect() as conn:
                trans = conn.begin()
                try:
                    while pending:
                        work, future = pending.pop(0)
                        try:
                            conn.exec_driver_sql(_SAVEPOINT)
                            try:
                                out = work(conn)
                            except Exception as e:  # this work only: roll it back, tell its caller now
                                conn.exec_driver_sql(_ROLLBACK_TO_SAVEPOINT)
                                conn.exec_driver_sql(_RELEASE_SAVEPOINT)
                                future.set_exception(e)
                                continue
                            conn.exec_driver_sql(_RELEASE_SAVEPOINT)
                        except BaseException:
                            pending.insert(0, (work, future))  # failed with the batch, told below
                            raise
                        done.append((future, out))
                except BaseException:
                    trans.rollback()
                    raise
                trans.commit()
        except BaseException as e:  # the batch did not commit: nothing of it holds
            for future, _ in done:
                future.set_exception(e)
            for _, future in pending:
                future.set_exception(e)
            return
        for future, out in done:
            future.set_result(out)
