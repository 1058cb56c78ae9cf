"""The journal's write SQL, written once for both databases and run over the driver itself (sqlite3, psycopg 3).

Plain SQL text, not SQLAlchemy constructs: SQLAlchemy's per-execution Python (parameter processing, execution
context, result rows) was the largest single cost of a journaled write on the proxy's side. The text is
rendered once (in the driver's parameter style), and writes.py runs it for the journal writer and for the
store's general path alike.

Values go through the models' own column types (their bind and result processors for the dialect), so a row
written here reads back through SQLAlchemy exactly like any other, and a receipt read here is the same
ReceiptRecord the store's reads build.
"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Dialect, Table

from proxy_addon.journal.tables import INVALIDATING_PREDICATE, Approval, Receipt, ReceiptTransition
from proxy_addon.rules.records import APPROVAL_FIELDS, INTENT_FIELDS, RECEIPT_FIELDS
from proxy_addon.rules.states import OPEN_STATES, ApprovalState, State

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
_TRANSITIONS: Table = ReceiptTransition.__table__  # type: ignore[assignment]
_APPROVALS: Table = Approval.__table__  # type: ignore[assignment]


def _listed(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in sorted(values))


_OPEN = _listed(s.value for s in OPEN_STATES)
# the partial index's predicate on `later` (its two column names qualified)
_INVALIDATING_LATER = INVALIDATING_PREDICATE.replace(" AND state ", " AND later.state ")
_SELECTED = ", ".join(f"r.{name}" for name in RECEIPT_FIELDS)

# What stands in the way of a new receipt (writes.py, `blocker`), as conditions on `r`:
# an Idempotency-Key the agent used before for another request of the same account;
_KEY_MISMATCH_WHERE = "r.account = :account AND r.idempotency_key = :key AND r.intent_fingerprint <> :fingerprint"
# the open receipt of the same intent;
_OPEN_WHERE = f"r.account = :account AND r.intent_fingerprint = :fingerprint AND r.state IN ({_OPEN})"
# or, when successes block (replay, refuse), the same intent's success since `since` that no later write to its
# target has invalidated (rules/duplicates.py). "Later" is by the order the receipts were journaled in (`seq`,
# drawn in the recording transaction: one order for every replica, which their clocks cannot change). The
# writes that may invalidate are a partial index of their own (tables.py, INVALIDATING_PREDICATE, repeated here
# word for word so that both databases use it), ordered by `seq` last: the newest one on the target is one probe
# at the index's end, however many writes the account made. Asked as "the newest is not after the success", not
# as NOT EXISTS: for an EXISTS, PostgreSQL expects to meet a match early and scans the table when most of the
# account's writes are on the target, which reads all of it exactly when nothing invalidates (a replay).
_OPEN_OR_SUCCEEDED_WHERE = f"""r.account = :account AND r.intent_fingerprint = :fingerprint
  AND (r.state IN ({_OPEN})
       OR (r.state = '{State.SUCCEEDED.value}' AND r.completed_at >= :since
           AND COALESCE((
             SELECT MAX(later.seq) FROM receipts later
             WHERE later.account = r.account AND later.host = r.host AND later.path = r.path
               AND later.port = r.port AND later.scheme = r.scheme AND later.{_INVALIDATING_LATER}), 0) <= r.seq))"""

KEY_MISMATCH = f"SELECT {_SELECTED} FROM receipts r WHERE {_KEY_MISMATCH_WHERE} LIMIT 1"
OPEN = f"SELECT {_SELECTED} FROM receipts r WHERE {_OPEN_WHERE} LIMIT 1"
OPEN_OR_SUCCEEDED = (  # an open receipt wins over a success, the latest success over older ones
    f"SELECT {_SELECTED} FROM receipts r WHERE {_OPEN_OR_SUCCEEDED_WHERE} "
    f"ORDER BY CASE WHEN r.state IN ({_OPEN}) THEN 0 ELSE 1 END, r.completed_at DESC LIMIT 1"
)

# A new receipt. Of two writers that decided at once (two proxies on one PostgreSQL), the second finds the
# first's open receipt in the partial unique index and inserts nothing: it then reads it.
RECEIPT_COLUMNS = (*INTENT_FIELDS, "state", "created_at", "updated_at", "submitted_at", "history_head")
# `seq`, the journal's order, drawn by the statement itself (tables.py): a sequence, or SQLite's max + 1 under
# its write lock (BEGIN IMMEDIATE: no other writer between the read and the insert; ix_receipts_seq makes the
# max one index probe)
NEXT_SEQ = {"postgresql": "nextval('receipts_seq')", "sqlite": "(SELECT COALESCE(MAX(seq), 0) + 1 FROM receipts)"}


def insert_receipt(dialect: str) -> str:
    return (
        f"INSERT INTO receipts ({', '.join(RECEIPT_COLUMNS)}, seq) "
        f"VALUES ({', '.join(':' + c for c in RECEIPT_COLUMNS)}, {NEXT_SEQ[dialect]}) ON CONFLICT DO NOTHING"
    )


TRANSITION_COLUMNS = ("operation_id", "from_state", "to_state", "recorded_at", "detail", "hash")
INSERT_TRANSITION = (
    f"INSERT INTO receipt_transitions ({', '.join(TRANSITION_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in TRANSITION_COLUMNS)})"
)

STATE_OF = "SELECT state, history_head FROM receipts WHERE operation_id = :operation_id"
# a receipt's history head, and the identity its chain starts from when it has none yet (audit/chain.py)
HEAD_COLUMNS = ("history_head", "operation_id", "account", "intent_fingerprint", "method", "scheme", "host", "port", "path", "created_at")
HEAD_OF = f"SELECT {', '.join(HEAD_COLUMNS)} FROM receipts WHERE operation_id = :operation_id"

# The history of a new receipt, for the one a CTE named `receipt` inserted: its creation row, and
# `planned -> submitted` when it was recorded as submitted.
_CREATED_ROW = f"(1, CAST(NULL AS VARCHAR), '{State.PLANNED.value}', :created_detail, :created_hash)"
_SUBMITTED_ROW = f"(2, '{State.PLANNED.value}', '{State.SUBMITTED.value}', :submitted_detail, :submitted_hash)"


def _history_of_new(submitted: bool) -> str:
    steps = f"{_CREATED_ROW}, {_SUBMITTED_ROW}" if submitted else _CREATED_ROW
    return (
        f"INSERT INTO receipt_transitions ({', '.join(TRANSITION_COLUMNS)}) "
        "SELECT receipt.operation_id, step.from_state, step.to_state, :recorded_at, step.detail, step.hash "
        f"FROM receipt, (VALUES {steps}) AS step(n, from_state, to_state, detail, hash) ORDER BY step.n"
    )


def compare_and_set(columns: tuple[str, ...], owned: bool, headed: bool = True) -> str:
    """`expected_from -> state` with these columns updated and its history head moved on, if the receipt is
    still in `expected_from` with the head `prev_head` (none when not `headed`: a receipt without history),
    and, when `owned`, still leased by `owned_by`. The head in the compare chains the new history row to the
    one before it without reading it."""
    assignments = ", ".join(f"{c} = :{c}" for c in ("state", "updated_at", "history_head", *columns))
    head = "history_head = :prev_head" if headed else "history_head IS NULL"
    owner = " AND lease_owner = :owned_by" if owned else ""
    return f"UPDATE receipts SET {assignments} WHERE operation_id = :operation_id AND state = :expected_from AND {head}{owner}"


def advance_in_one(columns: tuple[str, ...], owned: bool, headed: bool = True) -> str:
    """PostgreSQL only: `compare_and_set` and its history row in one statement; its row count says if it moved
    (one round trip instead of two, and, for a writer's batch of one, no COMMIT of its own: see connection.py)."""
    return (
        f"WITH moved AS ({compare_and_set(columns, owned, headed)} RETURNING operation_id) "
        f"INSERT INTO receipt_transitions ({', '.join(TRANSITION_COLUMNS)}) "
        "SELECT moved.operation_id, :expected_from, :state, :recorded_at, :detail, :history_head FROM moved"
    )


# -- approvals: only a write whose rule asks for one runs these (writes.py, `_record_approved`) ------------------
_PENDING, _APPROVED, _DENIED = (f"'{s.value}'" for s in (ApprovalState.PENDING, ApprovalState.APPROVED, ApprovalState.DENIED))
_OF_INTENT = "account = :account AND intent_fingerprint = :fingerprint"
_APPROVAL_SELECTED = ", ".join(APPROVAL_FIELDS)
# an undecided request, or an unused approval, past its time
EXPIRE_APPROVALS = (
    f"UPDATE approvals SET state = '{ApprovalState.EXPIRED.value}' "
    f"WHERE {_OF_INTENT} AND state IN ({_PENDING}, {_APPROVED}) AND expires_at <= :now"
)
# The compare-and-set that uses an approval up: of two writers (two replicas), the second finds it `used`
# (PostgreSQL re-checks `state` on the row the first changed) and changes nothing.
_USABLE = (  # the approval a write of the intent uses now: approved, not past its time, the latest decided
    f"SELECT approval_id FROM approvals WHERE {_OF_INTENT} AND state = {_APPROVED} AND expires_at > :now "
    "ORDER BY decided_at DESC LIMIT 1"
)
USE_APPROVAL = (
    f"UPDATE approvals SET state = '{ApprovalState.USED.value}', operation_id = :operation_id "
    f"WHERE state = {_APPROVED} AND approval_id = ({_USABLE}) RETURNING approval_id"
)
# Its receipt could not be inserted after all (a concurrent open one): the approval stays for the next request.
UNUSE_APPROVAL = (
    f"UPDATE approvals SET state = {_APPROVED}, operation_id = NULL "
    f"WHERE approval_id = :approval_id AND state = '{ApprovalState.USED.value}'"
)
DENIAL = (
    f"SELECT {_APPROVAL_SELECTED} FROM approvals WHERE {_OF_INTENT} AND state = {_DENIED} AND expires_at > :now "
    "ORDER BY decided_at DESC LIMIT 1"
)
APPROVAL_INSERT_COLUMNS = (
    "approval_id", "account", "intent_fingerprint", "operation", "method", "scheme", "host", "port", "path", "query",
    "request_headers", "request_body", "request_body_size", "request_body_truncated", "body_note", "state",
    "requested_at", "expires_at", "expires_seconds", "asked", "last_asked_at", "proxy_instance",
)  # fmt: skip
# A new pending approval; when the intent has one already (the unique index), nothing: the next statement asks it.
INSERT_APPROVAL = (
    f"INSERT INTO approvals ({', '.join(APPROVAL_INSERT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in APPROVAL_INSERT_COLUMNS)}) ON CONFLICT DO NOTHING"
)
# read only, what `foresee` (writes.py) reads instead of using or asking: the approval USE_APPROVAL would use, and
# the pending one ASK_AGAIN would ask again (EXPIRE_APPROVALS would have made one past its time `expired`)
USABLE_APPROVAL = f"SELECT {_APPROVAL_SELECTED} FROM approvals WHERE approval_id = ({_USABLE})"
PENDING_APPROVAL = f"SELECT {_APPROVAL_SELECTED} FROM approvals WHERE {_OF_INTENT} AND state = {_PENDING} AND expires_at > :now"
ASK_AGAIN = (
    f"UPDATE approvals SET asked = asked + 1, last_asked_at = :now WHERE {_OF_INTENT} AND state = {_PENDING} "
    f"RETURNING {_APPROVAL_SELECTED}"
)


_NAMED = re.compile(r"(?<![:\w]):(\w+)")


class DriverStatements:
    """The statements as one driver takes them, and the columns' value conversions for it."""

    def __init__(self, dialect: Dialect):
        self.name = dialect.name
        self._sql: dict[Any, str] = {}
        self._bind = _bind_processors(dialect)
        self._result = [self._result_of(dialect, name) for name in RECEIPT_FIELDS]
        self._head_result = [self._result_of(dialect, name) for name in HEAD_COLUMNS]
        self._approval_result = [  # a float needs none (and PostgreSQL's asks for the column's type code)
            None if name == "expires_seconds" else self._result_of(dialect, name, _APPROVALS) for name in APPROVAL_FIELDS
        ]
        self._types = {c.name: c.type.compile(dialect=dialect) for c in _RECEIPTS.c} if self.name == "postgresql" else {}

    def sql(self, statement: str) -> str:
        """`statement` in the driver's parameter style: sqlite3 takes `:name` as written, psycopg `%(name)s`."""
        converted = self._sql.get(statement)
        if converted is None:
            converted = statement if self.name == "sqlite" else _NAMED.sub(r"%(\1)s", statement)
            self._sql[statement] = converted
        return converted

    @property
    def insert_receipt(self) -> str:
        """A new receipt with its `seq` (INSERT ... ON CONFLICT DO NOTHING: the open-intent index may refuse it)."""
        return self._rendered("insert_receipt", lambda: insert_receipt(self.name))

    def compare_and_set(self, columns: tuple[str, ...], owned: bool, headed: bool) -> str:
        return self._rendered(("cas", columns, owned, headed), lambda: compare_and_set(columns, owned, headed))

    def advance_in_one(self, columns: tuple[str, ...], owned: bool, headed: bool) -> str:
        return self._rendered(("advance", columns, owned, headed), lambda: advance_in_one(columns, owned, headed))

    def record_unless_blocked(self, key_checked: bool, successes_block: bool, submitted: bool) -> str:
        """PostgreSQL only: the decision and the receipt's rows in one statement (a data-modifying CTE, which
        SQLite does not have). It inserts nothing when something stands in the way (its row count is then 0,
        and the blocker is read with the statements above)."""

        def render() -> str:
            blocked = [f"EXISTS (SELECT 1 FROM receipts r WHERE {_OPEN_OR_SUCCEEDED_WHERE if successes_block else _OPEN_WHERE})"]
            if key_checked:
                blocked.insert(0, f"EXISTS (SELECT 1 FROM receipts r WHERE {_KEY_MISMATCH_WHERE})")
            values = ", ".join(f"CAST(:{c} AS {self._types[c]})" for c in RECEIPT_COLUMNS)
            return (
                f"WITH receipt AS (INSERT INTO receipts ({', '.join(RECEIPT_COLUMNS)}, seq) SELECT {values}, {NEXT_SEQ['postgresql']} "
                f"WHERE NOT ({' OR '.join(blocked)}) ON CONFLICT DO NOTHING RETURNING operation_id) "
                f"{_history_of_new(submitted)}"
            )

        return self._rendered(("record", key_checked, successes_block, submitted), render)

    def _rendered(self, key: Any, render: Callable[[], str]) -> str:
        """A statement built from its parts once, in the driver's parameter style."""
        converted = self._sql.get(key)
        if converted is None:
            converted = self._sql[key] = self.sql(render())
        return converted

    def bound(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters as the driver takes them, each converted by the type of the column it is named after."""
        out = dict(params)
        for name, value in params.items():
            convert = self._bind.get(name)
            if convert is not None and value is not None:
                out[name] = convert(value)
        return out

    def receipt(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """A selected receipt row (RECEIPT_FIELDS order) as the Python values SQLAlchemy would give."""
        return _converted(RECEIPT_FIELDS, self._result, row)

    def approval(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """A selected approval row (APPROVAL_FIELDS order) as the Python values SQLAlchemy would give."""
        return _converted(APPROVAL_FIELDS, self._approval_result, row)

    def head_row(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """A HEAD_OF row as the Python values SQLAlchemy would give."""
        return _converted(HEAD_COLUMNS, self._head_result, row)

    @staticmethod
    def _result_of(dialect: Dialect, name: str, table: Table = _RECEIPTS) -> Callable[[Any], Any] | None:
        return table.c[name].type.dialect_impl(dialect).result_processor(dialect, None)


def _converted(
    names: Sequence[str], processors: Sequence[Callable[[Any], Any] | None], row: tuple[Any, ...]
) -> dict[str, Any]:
    """A row's values by column name, each through its column's result processor."""
    return {
        name: (convert(value) if convert is not None and value is not None else value)
        for name, convert, value in zip(names, processors, row, strict=True)
    }


def _bind_processors(dialect: Dialect) -> dict[str, Callable[[Any], Any]]:
    """Bind processors by parameter name: the receipts', the history's and the approvals' columns, and `since`
    and `now` (timestamps)."""
    columns: dict[str, ColumnElement[Any]] = {c.name: c for c in (*_APPROVALS.c, *_TRANSITIONS.c, *_RECEIPTS.c)}
    columns["since"] = columns["now"] = _RECEIPTS.c.completed_at
    columns["created_detail"] = columns["submitted_detail"] = _TRANSITIONS.c.detail
    out: dict[str, Callable[[Any], Any]] = {}
    for name, column in columns.items():
        processor = column.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            out[name] = processor
    return out
