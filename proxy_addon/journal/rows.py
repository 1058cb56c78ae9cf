"""What each journal write puts in its statements: the write (a new receipt to record, a step to advance one),
the decision's parameters, the receipt's row and its history rows with their hashes in the audit chain, and a
step's parameters with its new history head. Plain functions of the write and the clock; journal/writes.py runs
them."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from proxy_addon.audit.chain import Identity, chained, genesis, row_hash
from proxy_addon.exceptions import IllegalTransitionError
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.records import INTENT_FIELDS, ApprovalRecord, Blocker, Intent, utcnow
from proxy_addon.rules.states import TERMINAL_STATES, State, is_allowed

# what `advance` may change besides the state (everything else is fixed once the receipt is recorded)
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


@dataclass(frozen=True, slots=True)
class NewReceipt:
    """An intent to record: as `submitted` by `submitted_by` (the proxy, one commit before it sends), or as
    `planned` when None (tests and tools). `approval`: its rule asks for a person's approval first.
    `successes_block_for`: how long (seconds) a success of the same
    intent stands in its way (duplicates.successes_block_for), None when none does. `at`: the time it is
    recorded at (created_at, and its history rows'); None: now (the writer's way), while the store's general
    path gives the time it read before its transaction began. Fixed once made, so that its rows (and their
    hashes) are the same however often they are built."""

    intent: Intent
    successes_block_for: float | None
    submitted_by: str | None
    at: datetime | None = None
    approval: ApprovalAsk | None = None  # a person must have approved the intent (rules/approvals.py)

    def __post_init__(self) -> None:
        if self.at is None:
            object.__setattr__(self, "at", utcnow())


@dataclass(frozen=True, slots=True)
class Step:
    """A compare-and-set `expected_from -> to` with column updates, and its history row. `owned_by` adds the
    lease holder to the compare: a worker whose lease expired and was taken over cannot write a verdict over
    its successor's. `at`: as NewReceipt's (updated_at, and the history row's). `head`: the receipt's history
    head as the caller knows it (what `record` or the last `advance` returned); None: read it first. Only an
    allowed transition setting UPDATABLE columns can be made one."""

    operation_id: str
    expected_from: str
    to: str
    detail: dict[str, Any] = field(default_factory=dict)
    updates: dict[str, Any] = field(default_factory=dict)
    owned_by: str | None = None
    at: datetime | None = None
    head: str | None = None

    def __post_init__(self) -> None:
        if self.at is None:
            object.__setattr__(self, "at", utcnow())
        expected_from, to = State(self.expected_from), State(self.to)
        if not is_allowed(expected_from, to):
            raise IllegalTransitionError(f"{expected_from.value} -> {to.value} is not an allowed transition")
        unknown = set(self.updates) - UPDATABLE
        if unknown:
            raise ValueError(f"transition cannot set {', '.join(sorted(unknown))}")
        object.__setattr__(self, "expected_from", expected_from.value)  # plain strings for the drivers
        object.__setattr__(self, "to", to.value)


@dataclass(frozen=True, slots=True)
class Foreseen:
    """What `record` would do with a write now (writes.py, `foresee`): be refused by, or replay, `blocker`; for a
    write that needs approval, use `approval` (approved) or answer with it (pending, denied), or ask for a new one
    (`asks_approval`); with none of these, record it and send it."""

    blocker: Blocker | None = None
    approval: ApprovalRecord | None = None
    asks_approval: bool = False


@dataclass(frozen=True, slots=True)
class Head:
    """A receipt's history head as stored (None: no history yet), and what its next row chains from (the
    stored head, or the receipt's genesis)."""

    stored: str | None
    previous: str

    @classmethod
    def known(cls, head: str) -> "Head":
        return cls(head, head)


def decision_params(intent: Intent, successes_block_for: float | None) -> dict[str, Any]:
    """The decision's parameters: `key` when a reused key must be looked for, `since` when successes block."""
    params: dict[str, Any] = {"account": intent.account, "fingerprint": intent.intent_fingerprint}
    if intent.idempotency_key is not None and intent.idempotency_key != intent.operation_id:
        params["key"] = intent.idempotency_key
    if successes_block_for is not None:
        params["since"] = utcnow() - timedelta(seconds=successes_block_for)
    return params


def new_rows(new: NewReceipt, approval_id: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The receipt's row and its history rows, written at one time, each row with its hash in the chain and
    the receipt with its head; its creation row names the approval it used, when it needed one."""
    intent, now = new.intent, new.at or utcnow()
    row = {name: getattr(intent, name) for name in INTENT_FIELDS}
    row.update(state=State.PLANNED.value, created_at=now, updated_at=now, submitted_at=None)
    created = {"who": intent.proxy_instance or "store", "fingerprint": intent.intent_fingerprint}
    if intent.agent is not None:  # in the audit chain (its rows are hashed), not only in a column one could edit
        created["agent"] = intent.agent
    if approval_id is not None:
        created["approval_id"] = approval_id
    history: list[dict[str, Any]] = [
        {"operation_id": intent.operation_id, "from_state": None, "to_state": State.PLANNED.value, "recorded_at": now, "detail": created}
    ]
    if new.submitted_by is not None:
        row.update(state=State.SUBMITTED.value, submitted_at=now)
        step = {"from_state": State.PLANNED.value, "to_state": State.SUBMITTED.value, "detail": {"who": new.submitted_by}}
        history.append({**history[0], **step})
    row["history_head"] = chain(row, history)
    return row, history


def chain(row: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """Each of a new receipt's history rows gets its hash, chained from the receipt's identity; the head."""
    hashes = chained(genesis(Identity.of(row)), history)
    for h, digest in zip(history, hashes, strict=True):
        h["hash"] = digest
    return hashes[-1]


def step_params(step: Step, head: Head) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The columns the step sets besides its state and head (submitted_at and completed_at by default when it
    enters those states), and the statement's parameters: the new history row's hash is the new head."""
    now = step.at or utcnow()
    updates = dict(step.updates)
    if step.to == State.SUBMITTED.value:
        updates.setdefault("submitted_at", now)
    if State(step.to) in TERMINAL_STATES:
        updates.setdefault("completed_at", now)
    params = {**updates, "state": step.to, "updated_at": now, "recorded_at": now, "detail": step.detail}
    params.update(operation_id=step.operation_id, expected_from=step.expected_from)
    if head.stored is not None:
        params["prev_head"] = head.stored
    params["history_head"] = row_hash(head.previous, step.operation_id, step.expected_from, step.to, now, step.detail)
    if step.owned_by is not None:
        params["owned_by"] = step.owned_by
    return tuple(sorted(updates)), params
