"""The hot path's two units of work on a driver connection: record an intent, advance a receipt.

Both run inside a transaction the caller (the writer's group commit) opens and commits; neither commits.
Each does what store/receipts.py does for the same request (`record_and_submit`, `transition`), with the
statements of statements.py: the same decision, the same rows, the same history.
"""

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError, StaleStateError
from proxy_addon.journal import statements as sql
from proxy_addon.journal.messages import Advance, Record
from proxy_addon.journal.statements import DriverStatements
from proxy_addon.rules.records import INTENT_FIELDS, Blocker, BlockKind, ReceiptRecord, utcnow
from proxy_addon.rules.states import TERMINAL_STATES, State

RECORD_ATTEMPTS = 3  # decisions lost to a concurrent writer's insert (another proxy) before giving up


class HotPath:
    def __init__(self, connection: Any, statements: DriverStatements):
        self.connection = connection
        self.sql = statements
        self.in_one = statements.name == "postgresql"  # a receipt's rows in one statement: see statements.py

    def _execute(self, statement: str, params: Mapping[str, Any]) -> Any:
        cursor = self.connection.cursor()
        cursor.execute(self.sql.sql(statement), self.sql.bound(params))
        return cursor

    def _first_receipt(self, statement: str, params: Mapping[str, Any]) -> ReceiptRecord | None:
        row = self._execute(statement, params).fetchone()
        return None if row is None else ReceiptRecord(**self.sql.receipt(tuple(row)))

    # -- record ---------------------------------------------------------------------------------------------

    def pipelined(self, requests: list[Record | Advance]) -> list[Any]:
        """On PostgreSQL, the first statement of each request, all sent at once: psycopg's pipeline mode, one round
        trip for a batch instead of one per request. They run in order in the batch's transaction, each seeing
        the ones before it, as if sent one by one. `record` and `advance` then read what each did from its cursor.

        A record that something stood in the way of reads that blocker once the batch's statements have run: it is
        refused by (or replays) what stands in its way then, or, if nothing does any more, decides again. Either is
        a valid order for requests that were in flight together, and every decision to write is still one
        statement that sees everything before it."""
        if not self.in_one or len(requests) < 2:
            return [None] * len(requests)
        with self.connection.pipeline():
            return [
                self._record_unless_blocked(r) if isinstance(r, Record) else self._advance_in_one(r) for r in requests
            ]

    def record(self, request: Record, sent: Any = None) -> Blocker | None:
        """The receipt in the way, or None once the intent is written as `submitted` with both history rows.
        `sent`: the cursor of its first statement, already sent by `pipelined`."""
        for _attempt in range(RECORD_ATTEMPTS):
            if self.in_one:
                inserted = (sent if sent is not None else self._record_unless_blocked(request)).rowcount == 2
                sent = None
                if inserted:
                    return None
                blocker = self.blocker(request)
                if blocker is not None:
                    return blocker
                continue  # it was in the way, and closed since: decide again
            blocker = self.blocker(request)
            if blocker is not None:
                return blocker
            if self._insert(request):
                return None
            open_receipt = self._first_receipt(sql.OPEN, self._decision_params(request))
            if open_receipt is not None:
                return Blocker(BlockKind.OPEN, open_receipt)
        raise JournalUnavailableError("could not record the intent: the open-intent index kept changing")

    def blocker(self, request: Record) -> Blocker | None:
        """store/receipts.py's `_find_blocker`: a reused Idempotency-Key (not the one the proxy injects), then
        the open receipt or the recent success the host's after_success policy replays or refuses."""
        params = self._decision_params(request)
        if "key" in params:
            other = self._first_receipt(sql.KEY_MISMATCH, params)
            if other is not None:
                return Blocker(BlockKind.KEY_MISMATCH, other)
        found = self._first_receipt(sql.OPEN_OR_SUCCEEDED if "since" in params else sql.OPEN, params)
        if found is None:
            return None
        return Blocker(BlockKind.SUCCEEDED if found.state == State.SUCCEEDED.value else BlockKind.OPEN, found)

    @staticmethod
    def _decision_params(request: Record) -> dict[str, Any]:
        """The decision's parameters: `key` when a reused key must be looked for, `since` when successes block."""
        intent, after_success = request.intent, request.after_success
        params: dict[str, Any] = {"account": intent.account, "fingerprint": intent.intent_fingerprint}
        if intent.idempotency_key is not None and intent.idempotency_key != intent.operation_id:
            params["key"] = intent.idempotency_key
        if after_success.policy != "allow" and after_success.window > 0:
            params["since"] = utcnow() - timedelta(seconds=after_success.window)
        return params

    def _new_rows(self, request: Record) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Any]:
        """The receipt's row, its creation and submission details, and the time they are written."""
        intent, now = request.intent, utcnow()
        row = {name: getattr(intent, name) for name in INTENT_FIELDS}
        row.update(state=State.SUBMITTED.value, created_at=now, updated_at=now, submitted_at=now)
        created = {"who": intent.proxy_instance or "store", "fingerprint": intent.intent_fingerprint}
        return row, created, {"who": request.who}, now

    def _record_unless_blocked(self, request: Record) -> Any:
        """Its cursor: a row count of 2 says the receipt and its two history rows were written."""
        decision = self._decision_params(request)
        row, created, submitted, now = self._new_rows(request)
        statement = sql.record_unless_blocked("key" in decision, "since" in decision)
        params = {**decision, **row, "recorded_at": now, "created_detail": created, "submitted_detail": submitted}
        return self._execute(statement, params)

    def _insert(self, request: Record) -> bool:
        row, created, submitted, now = self._new_rows(request)
        if self._execute(sql.INSERT_RECEIPT, row).rowcount != 1:
            return False
        for from_state, to_state, detail in (
            (None, State.PLANNED.value, created),
            (State.PLANNED.value, State.SUBMITTED.value, submitted),
        ):
            history = {"operation_id": request.intent.operation_id, "from_state": from_state, "to_state": to_state}
            self._execute(sql.INSERT_TRANSITION, {**history, "recorded_at": now, "detail": detail})
        return True

    # -- advance --------------------------------------------------------------------------------------------

    def advance(self, request: Advance, sent: Any = None) -> None:
        """Compare-and-set with its history row; StaleStateError or ReceiptNotFoundError (nothing written) if the
        receipt is in another state or missing. `sent`: the cursor of its statement, sent by `pipelined`."""
        if self.in_one:
            moved = (sent if sent is not None else self._advance_in_one(request)).rowcount == 1
        else:
            moved = self._compare_and_set(request)
        if not moved:
            row = self._execute(sql.STATE_OF, {"operation_id": request.operation_id}).fetchone()
            if row is None:
                raise ReceiptNotFoundError(f"no receipt {request.operation_id}")
            raise StaleStateError(request.operation_id, request.expected_from, row[0])

    def _advance_params(self, request: Advance) -> tuple[tuple[str, ...], dict[str, Any]]:
        now = utcnow()
        updates = dict(request.updates)
        if request.to == State.SUBMITTED.value:
            updates.setdefault("submitted_at", now)
        if State(request.to) in TERMINAL_STATES:
            updates.setdefault("completed_at", now)
        params = {**updates, "state": request.to, "updated_at": now, "recorded_at": now, "detail": request.detail}
        params.update(operation_id=request.operation_id, expected_from=request.expected_from)
        return tuple(sorted(updates)), params

    def _advance_in_one(self, request: Advance) -> Any:
        """Its cursor: a row count of 1 says it moved."""
        columns, params = self._advance_params(request)
        return self._execute(sql.advance_in_one(columns), params)

    def _compare_and_set(self, request: Advance) -> bool:
        columns, params = self._advance_params(request)
        if self._execute(sql.compare_and_set(columns), params).rowcount != 1:
            return False
        history = {"operation_id": request.operation_id, "from_state": request.expected_from, "to_state": request.to}
        self._execute(sql.INSERT_TRANSITION, {**history, "recorded_at": params["recorded_at"], "detail": request.detail})
        return True
