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
from proxy_addon.records import INTENT_FIELDS, Blocker, BlockKind, ReceiptRecord, utcnow
from proxy_addon.states import TERMINAL_STATES, State

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

    def record(self, request: Record) -> Blocker | None:
        """The receipt in the way, or None once the intent is written as `submitted` with both history rows."""
        for _attempt in range(RECORD_ATTEMPTS):
            blocker = self.blocker(request)
            if blocker is not None:
                return blocker
            if self._insert(request):
                return None
            open_receipt = self._first_receipt(sql.OPEN, self._intent_params(request))
            if open_receipt is not None:
                return Blocker(BlockKind.OPEN, open_receipt)
        raise JournalUnavailableError("could not record the intent: the open-intent index kept changing")

    def blocker(self, request: Record) -> Blocker | None:
        """store/receipts.py's `_find_blocker`: a reused Idempotency-Key (not the one the proxy injects), then
        the open receipt or the recent success the host's after_success policy replays or refuses."""
        intent, after_success = request.intent, request.after_success
        params = self._intent_params(request)
        if intent.idempotency_key is not None and intent.idempotency_key != intent.operation_id:
            other = self._first_receipt(sql.KEY_MISMATCH, {**params, "key": intent.idempotency_key})
            if other is not None:
                return Blocker(BlockKind.KEY_MISMATCH, other)
        if after_success.policy != "allow" and after_success.window > 0:
            since = utcnow() - timedelta(seconds=after_success.window)
            found = self._first_receipt(sql.OPEN_OR_SUCCEEDED, {**params, "since": since})
        else:
            found = self._first_receipt(sql.OPEN, params)
        if found is None:
            return None
        return Blocker(BlockKind.SUCCEEDED if found.state == State.SUCCEEDED.value else BlockKind.OPEN, found)

    def _insert(self, request: Record) -> bool:
        intent, now = request.intent, utcnow()
        row = {name: getattr(intent, name) for name in INTENT_FIELDS}
        row.update(state=State.SUBMITTED.value, created_at=now, updated_at=now, submitted_at=now)
        created = {"who": intent.proxy_instance or "store", "fingerprint": intent.intent_fingerprint}
        submitted = {"who": request.who}
        if self.in_one:
            params = {**row, "recorded_at": now, "created_detail": created, "submitted_detail": submitted}
            return bool(self._execute(sql.RECORD_IN_ONE, params).rowcount == 2)
        if self._execute(sql.INSERT_RECEIPT, row).rowcount != 1:
            return False
        for from_state, to_state, detail in (
            (None, State.PLANNED.value, created),
            (State.PLANNED.value, State.SUBMITTED.value, submitted),
        ):
            history = {"operation_id": intent.operation_id, "from_state": from_state, "to_state": to_state}
            self._execute(sql.INSERT_TRANSITION, {**history, "recorded_at": now, "detail": detail})
        return True

    @staticmethod
    def _intent_params(request: Record) -> dict[str, Any]:
        return {"account": request.intent.account, "fingerprint": request.intent.intent_fingerprint}

    # -- advance --------------------------------------------------------------------------------------------

    def advance(self, request: Advance) -> None:
        """Compare-and-set with its history row; StaleStateError or ReceiptNotFoundError (nothing written) if the
        receipt is in another state or missing."""
        now = utcnow()
        updates = dict(request.updates)
        if request.to == State.SUBMITTED.value:
            updates.setdefault("submitted_at", now)
        if State(request.to) in TERMINAL_STATES:
            updates.setdefault("completed_at", now)
        columns = tuple(sorted(updates))
        params = {**updates, "state": request.to, "updated_at": now, "recorded_at": now, "detail": request.detail}
        params.update(operation_id=request.operation_id, expected_from=request.expected_from)
        if self.in_one:
            moved = self._execute(sql.advance_in_one(columns), params).rowcount == 1
        else:
            moved = self._execute(sql.compare_and_set(columns), params).rowcount == 1
            if moved:
                history = {"operation_id": request.operation_id, "from_state": request.expected_from, "to_state": request.to}
                self._execute(sql.INSERT_TRANSITION, {**history, "recorded_at": now, "detail": request.detail})
        if not moved:
            row = self._execute(sql.STATE_OF, {"operation_id": request.operation_id}).fetchone()
            if row is None:
                raise ReceiptNotFoundError(f"no receipt {request.operation_id}")
            raise StaleStateError(request.operation_id, request.expected_from, row[0])
