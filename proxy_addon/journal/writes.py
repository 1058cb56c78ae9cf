"""The journal's writes, each defined once: record an intent, advance a receipt, and the duplicate decision.

Why one definition: the proxy's own writes go through its journal writer process (writer.py), everything
else (the CLI, the reconciler, recovery, a person's review, the proxy's fallbacks when its writer is lost)
through the store's general path (store/receipts.py). Both run the code below, so a new state, column or rule
is written once, and the two cannot decide or write differently. In the spirit of a persistence layer behind
an idempotency check, the interface is a few storage primitives:
- `record`: decide, then record the intent as a new receipt with its history rows (`planned`, and
  `planned -> submitted` when it is recorded as submitted), or answer the receipt in its way;
- `advance`: a compare-and-set of a receipt's state (and history head) with column updates, and its history row;
- `blocker`: the duplicate decision alone, read only: what stands in the way of an intent now.
A write whose rule asks for a person's approval (`NewReceipt.approval`) is recorded only with an approved,
unexpired approval of its intent, used up (a compare-and-set) in the same transaction as its receipt's
creation; without one it records no receipt, and asks for (or finds) the intent's one pending approval, or its
denial. Every other write runs exactly the statements it ran before approvals existed.
None of them commits: each runs inside a transaction its caller opens and commits (the writer's group commit,
or the store's SQLAlchemy transaction).

Every history row carries its hash in the audit chain (audit/chain.py), computed with its row (rows.py), in the
same statement or transaction as the row. The receipt keeps its chain's head (`history_head`): `record` returns it, and a
caller that knows it (the proxy, from its record to its verdict) passes it to `advance`, whose compare-and-set
includes it, so the hot path reads nothing more; a caller that does not (`Step.head` None) has it read first,
in the same transaction.

They run over a DBAPI connection, below SQLAlchemy, for speed (statements.py says why): the writer runs them
on its own driver connection (`OnDriver`, driver.py), the store on the driver under its SQLAlchemy connection
(see store/receipts.py), so that SQLAlchemy still sees their errors (a connection the server dropped is replaced,
a storage error is wrapped) and its transaction holds them.

Where the databases differ, one implementation each, behind the same primitives:
- PostgreSQL (`PostgresWrites`): each write is one statement (a data-modifying CTE: the decision and the
  receipt's rows; the compare-and-set and its history row), since each statement is a round trip and some of
  the server's CPU; a writer's batch sends them all at once (psycopg's pipeline mode: `pipelined`).
- SQLite (`SQLiteWrites`): the statements one by one, in the calling process, where each costs less than one
  round trip would; its write lock (BEGIN IMMEDIATE) keeps another writer out between the decision and the
  insert.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from proxy_addon.audit.chain import Identity, genesis
from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError, StaleStateError
from proxy_addon.journal import statements as sql
from proxy_addon.journal.driver import Connection, Cursor, Sent
from proxy_addon.journal.rows import Foreseen, Head, NewReceipt, Step, decision_params, new_rows, step_params
from proxy_addon.journal.statements import DriverStatements
from proxy_addon.rules.records import (
    ApprovalRecord,
    Blocker,
    BlockKind,
    Intent,
    ReceiptRecord,
    new_approval_id,
    utcnow,
)
from proxy_addon.rules.states import ApprovalState, State

RECORD_ATTEMPTS = 3  # decisions lost to a concurrent writer's insert (another proxy) before giving up
ADVANCE_ATTEMPTS = 3  # compare-and-sets lost to another writer's step that left the same state (a read head)


class JournalWrites(ABC):
    """The primitives (module docstring) on one connection, inside its caller's transaction."""

    def __init__(self, connection: Connection, statements: DriverStatements):
        self.connection = connection
        self.sql = statements

    @staticmethod
    def on(connection: Connection, statements: DriverStatements) -> "JournalWrites":
        """The implementation for the statements' database."""
        return (PostgresWrites if statements.name == "postgresql" else SQLiteWrites)(connection, statements)

    # -- the primitives ---------------------------------------------------------------------------------------

    def record(self, new: NewReceipt, sent: Sent | None = None) -> Blocker | ApprovalRecord | str:
        """The receipt in the way, or, once the intent is written with its history rows, its history head; for a
        write that needs approval and has none usable, its pending (or denied) approval, and no receipt.
        `sent`: its first statement, already sent by `pipelined`. Of two writers that decide at once (two
        proxies on one PostgreSQL), the second's insert finds the first's open receipt in the partial unique
        index and writes nothing: it is refused by that receipt, or decides again if it closed meanwhile."""
        for _attempt in range(RECORD_ATTEMPTS):
            outcome = self._record_once(new, sent) if new.approval is None else self._record_approved(new)
            sent = None
            if outcome is not None:
                return outcome
        raise JournalUnavailableError("could not record the intent: the open-intent index kept changing")

    def advance(self, step: Step, sent: Sent | None = None) -> str:
        """Compare-and-set with its history row, and the new history head; StaleStateError or
        ReceiptNotFoundError (nothing written) if the receipt is in another state (or leased by another) or
        missing. `sent`: as for `record`. A head that moved on while the state stayed as expected (another
        writer's steps that came back to it, or `receipts scrub` chaining a history again) is read again."""
        head = None if step.head is None else Head.known(step.head)
        for _attempt in range(ADVANCE_ATTEMPTS):
            if head is None:
                head = self._head_of(step.operation_id)
            moved = self._moved(step, head, sent)
            sent = None
            if moved is not None:
                return moved
            row = self._execute(sql.STATE_OF, {"operation_id": step.operation_id}).fetchone()
            if row is None:
                raise ReceiptNotFoundError(f"no receipt {step.operation_id}")
            if row[0] != step.expected_from or row[1] == head.stored:
                raise StaleStateError(step.operation_id, step.expected_from, row[0])
            head = None
        raise StaleStateError(step.operation_id, step.expected_from, step.expected_from)

    def blocker(self, intent: Intent, successes_block_for: float | None) -> Blocker | None:
        """What stands in the way of this intent now: a reused Idempotency-Key (not the one the proxy injects,
        a fresh operation id), then the open receipt of the same intent or, when successes block, its latest
        success within `successes_block_for` that no later write to its target has invalidated (an open one
        wins). At most two indexed queries."""
        return self._blocker(decision_params(intent, successes_block_for))

    def foresee(self, new: NewReceipt) -> Foreseen:
        """What `record` would do with this write now, writing nothing: the receipt in its way (the blocker
        queries `record` runs), else, for a write that needs approval, the approval it would use, the denial or
        the pending approval it would answer with (the conditions of `record`'s own approval statements), or
        that it would ask for a new one. The agent API's `POST /check` (agent_api/check.py)."""
        blocker = self._blocker(decision_params(new.intent, new.successes_block_for))
        if blocker is not None or new.approval is None:
            return Foreseen(blocker)
        intent = {"account": new.intent.account, "fingerprint": new.intent.intent_fingerprint, "now": new.at or utcnow()}
        for statement in (sql.USABLE_APPROVAL, sql.DENIAL, sql.PENDING_APPROVAL):  # `_record_approved`'s order
            row = self._execute(statement, intent).fetchone()
            if row is not None:
                return Foreseen(approval=ApprovalRecord(**self.sql.approval(tuple(row))))
        return Foreseen(asks_approval=True)

    def pipelined(self, writes: Sequence[NewReceipt | Step]) -> list[Sent | None]:
        """The first statement of each write sent ahead, for `record` and `advance` to read (None: not sent)."""
        return [None] * len(writes)

    # -- for the implementations -------------------------------------------------------------------------------

    @abstractmethod
    def _record_once(self, new: NewReceipt, sent: Sent | None) -> Blocker | str | None:
        """One decision: the history head written, the Blocker in the way, or None (lost to a concurrent
        writer: decide again)."""

    @abstractmethod
    def _moved(self, step: Step, head: Head, sent: Sent | None) -> str | None:
        """The compare-and-set and its history row, and the new head; None (nothing written) when the compare
        failed."""

    def _head_of(self, operation_id: str) -> Head:
        row = self._execute(sql.HEAD_OF, {"operation_id": operation_id}).fetchone()
        if row is None:
            raise ReceiptNotFoundError(f"no receipt {operation_id}")
        values = self.sql.head_row(tuple(row))
        stored = values.pop("history_head")
        return Head(stored, stored if stored is not None else genesis(Identity.of(values)))

    def _execute(self, statement: str, params: Mapping[str, Any]) -> Cursor:
        return self.connection.execute(self.sql.sql(statement), self.sql.bound(params))

    def _run(self, rendered: str, params: Mapping[str, Any]) -> Cursor:
        """A statement already in the driver's parameter style (DriverStatements' rendered ones)."""
        return self.connection.execute(rendered, self.sql.bound(params))

    def _first_receipt(self, statement: str, params: Mapping[str, Any]) -> ReceiptRecord | None:
        row = self._execute(statement, params).fetchone()
        return None if row is None else ReceiptRecord(**self.sql.receipt(tuple(row)))

    def _blocker(self, decision: dict[str, Any]) -> Blocker | None:
        if "key" in decision:
            other = self._first_receipt(sql.KEY_MISMATCH, decision)
            if other is not None:
                return Blocker(BlockKind.KEY_MISMATCH, other)
        found = self._first_receipt(sql.OPEN_OR_SUCCEEDED if "since" in decision else sql.OPEN, decision)
        if found is None:
            return None
        return Blocker(BlockKind.SUCCEEDED if found.state == State.SUCCEEDED.value else BlockKind.OPEN, found)

    def _open_receipt(self, decision: dict[str, Any]) -> Blocker | None:
        found = self._first_receipt(sql.OPEN, decision)
        return None if found is None else Blocker(BlockKind.OPEN, found)

    def _insert_new(self, new: NewReceipt, approval_id: str | None = None) -> str | None:
        """The receipt and its history rows, statement by statement; its history head, or None when the open-intent
        index refused the receipt (a concurrent writer's open one: nothing written)."""
        row, history = new_rows(new, approval_id)
        if self._run(self.sql.insert_receipt, row).rowcount != 1:
            return None
        for history_row in history:
            self._execute(sql.INSERT_TRANSITION, history_row)
        return str(row["history_head"])

    # -- approval first (only for a write whose rule asks for it) -----------------------------------------------

    def _record_approved(self, new: NewReceipt) -> Blocker | ApprovalRecord | str | None:
        """As `_record_once`, statement by statement on either database: what stands in the way first (a repeat
        of an approved write in flight is a duplicate, not a second use); then the intent's approved, unexpired
        approval is used up by this receipt (compare-and-set), in this transaction; without one, its pending
        approval or denial is the answer and no receipt is written."""
        decision = decision_params(new.intent, new.successes_block_for)
        blocker = self._blocker(decision)
        if blocker is not None:
            return blocker
        now = new.at or utcnow()
        intent = {"account": new.intent.account, "fingerprint": new.intent.intent_fingerprint, "now": now}
        self._execute(sql.EXPIRE_APPROVALS, intent)
        used = self._execute(sql.USE_APPROVAL, {**intent, "operation_id": new.intent.operation_id}).fetchone()
        if used is None:
            # none approved, or a concurrent writer (another replica) used it first: its receipt is in the way now
            return self._blocker(decision) or self._ask_approval(new, intent)
        head = self._insert_new(new, approval_id=used[0])
        if head is not None:
            return head
        self._execute(sql.UNUSE_APPROVAL, {"approval_id": used[0]})
        return self._open_receipt(decision)

    def _ask_approval(self, new: NewReceipt, intent: dict[str, Any]) -> ApprovalRecord:
        """The intent's denial while it stands; else its one pending approval (made now if it has none: the
        unique index makes two replicas share one), asked once more."""
        denial = self._execute(sql.DENIAL, intent).fetchone()
        if denial is not None:
            return ApprovalRecord(**self.sql.approval(tuple(denial)))
        assert new.approval is not None
        now, i = intent["now"], new.intent
        row = {name: getattr(i, name) for name in ("account", "operation", "method", "scheme", "host", "port", "path", "query")}
        row.update(
            {name: getattr(i, name) for name in ("request_headers", "request_body", "request_body_size", "request_body_truncated", "body_note", "proxy_instance")},
            approval_id=new_approval_id(),
            intent_fingerprint=i.intent_fingerprint,
            state=ApprovalState.PENDING.value,
            requested_at=now,
            expires_at=now + timedelta(seconds=new.approval.expires),
            expires_seconds=new.approval.expires,
            asked=0,
            last_asked_at=now,
        )
        self._execute(sql.INSERT_APPROVAL, row)
        pending = self._execute(sql.ASK_AGAIN, intent).fetchone()
        return ApprovalRecord(**self.sql.approval(tuple(pending)))


class SQLiteWrites(JournalWrites):
    """Decide, then write, statement by statement (module docstring)."""

    def _record_once(self, new: NewReceipt, sent: Sent | None) -> Blocker | str | None:
        decision = decision_params(new.intent, new.successes_block_for)
        blocker = self._blocker(decision)
        if blocker is not None:
            return blocker
        head = self._insert_new(new)
        return head if head is not None else self._open_receipt(decision)

    def _moved(self, step: Step, head: Head, sent: Sent | None) -> str | None:
        columns, params = step_params(step, head)
        statement = self.sql.compare_and_set(columns, step.owned_by is not None, head.stored is not None)
        if self._run(statement, params).rowcount != 1:
            return None
        history = {"operation_id": step.operation_id, "from_state": step.expected_from, "to_state": step.to}
        new_head = params["history_head"]
        self._execute(sql.INSERT_TRANSITION, {**history, "recorded_at": params["recorded_at"], "detail": step.detail, "hash": new_head})
        return str(new_head)


class PostgresWrites(JournalWrites):
    """Each write one statement; a batch's statements pipelined (module docstring)."""

    def pipelined(self, writes: Sequence[NewReceipt | Step]) -> list[Sent | None]:
        """The first statement of each write, all sent at once: one round trip for a batch instead of one per
        write. They run in order in the batch's transaction, each seeing the ones before it, as if sent one by
        one; `record` and `advance` then read what each did from its cursor. A step whose caller did not give
        its head (never the proxy's) must read it first: it and the writes after it are not sent ahead, so
        that the order stays.

        A record that something stood in the way of reads that blocker once the batch's statements have run: it
        is refused by (or replays) what stands in its way then, or, if nothing does any more, decides again.
        Either is a valid order for writes that were in flight together, and every decision to write is still
        one statement that sees everything before it."""
        ahead = next((i for i, w in enumerate(writes) if isinstance(w, Step) and w.head is None), len(writes))
        if ahead < 2:
            return [None] * len(writes)
        with self.connection.pipeline():  # a write that needs approval runs its statements one by one, later
            sent = [self._send_first(w) for w in writes[:ahead]]
        return [*sent, *[None] * (len(writes) - ahead)]

    def _send_first(self, write: NewReceipt | Step) -> Sent | None:
        if isinstance(write, Step):
            return self._send_advance(write)
        return None if write.approval is not None else self._send_record(write)

    def _record_once(self, new: NewReceipt, sent: Sent | None) -> Blocker | str | None:
        sent = sent if sent is not None else self._send_record(new)
        if sent.cursor.rowcount > 0:
            return sent.head
        return self._blocker(decision_params(new.intent, new.successes_block_for))  # None: it closed since

    def _moved(self, step: Step, head: Head, sent: Sent | None) -> str | None:
        sent = sent if sent is not None else self._send_advance(step, head)
        return sent.head if sent.cursor.rowcount == 1 else None

    def _send_record(self, new: NewReceipt) -> Sent:
        """Its cursor: a row count above 0 says the receipt and its history rows were written."""
        decision = decision_params(new.intent, new.successes_block_for)
        row, history = new_rows(new)
        statement = self.sql.record_unless_blocked("key" in decision, "since" in decision, new.submitted_by is not None)
        details = {"created_detail": history[0]["detail"], "created_hash": history[0]["hash"], "recorded_at": history[0]["recorded_at"]}
        if len(history) > 1:
            details.update(submitted_detail=history[1]["detail"], submitted_hash=history[1]["hash"])
        return Sent(self._run(statement, {**decision, **row, **details}), str(row["history_head"]))

    def _send_advance(self, step: Step, head: Head | None = None) -> Sent:
        """Its cursor: a row count of 1 says it moved. `head`: None for a step sent ahead (its caller gave it)."""
        head = head if head is not None else Head.known(str(step.head))
        columns, params = step_params(step, head)
        statement = self.sql.advance_in_one(columns, step.owned_by is not None, head.stored is not None)
        return Sent(self._run(statement, params), str(params["history_head"]))


