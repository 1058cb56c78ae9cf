"""The receipt state machine: states, which transitions the contract allows, and which states are open."""

from enum import StrEnum


class State(StrEnum):
    PLANNED = "planned"
    SUBMITTED = "submitted"
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILING = "reconciling"
    SAFE_TO_RETRY = "safe_to_retry"
    MANUAL_REVIEW = "manual_review"


ALLOWED_TRANSITIONS: dict[State, frozenset[State]] = {
    State.PLANNED: frozenset({State.SUBMITTED, State.REJECTED}),
    State.SUBMITTED: frozenset({State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN}),
    State.OUTCOME_UNKNOWN: frozenset(
        {State.RECONCILING, State.MANUAL_REVIEW, State.SUCCEEDED, State.SAFE_TO_RETRY}
    ),
    State.RECONCILING: frozenset(
        {State.SUCCEEDED, State.SAFE_TO_RETRY, State.MANUAL_REVIEW, State.OUTCOME_UNKNOWN}
    ),
    State.MANUAL_REVIEW: frozenset({State.SUCCEEDED, State.SAFE_TO_RETRY}),
    State.SUCCEEDED: frozenset(),
    State.REJECTED: frozenset(),
    State.SAFE_TO_RETRY: frozenset(),
}

TERMINAL_STATES: frozenset[State] = frozenset({State.SUCCEEDED, State.REJECTED, State.SAFE_TO_RETRY})
OPEN_STATES: frozenset[State] = frozenset(State) - TERMINAL_STATES
# Open and still on its way: recorded, about to be or being sent, no verdict yet (in_flight.policy is about these).
IN_FLIGHT_STATES: frozenset[State] = frozenset({State.PLANNED, State.SUBMITTED})

# A success's replay window ends with a later journaled write to its target by one of these methods
# (duplicates.py says why) ...
INVALIDATING_METHODS = ("PUT", "PATCH", "DELETE")
# ... unless that write is known not to have happened.
NOT_HAPPENED_STATES = (State.REJECTED, State.SAFE_TO_RETRY)

# A person's `resolve` may settle these, into these.
RESOLVABLE_STATES: frozenset[State] = frozenset({State.MANUAL_REVIEW, State.OUTCOME_UNKNOWN})
RESOLUTION_STATES: frozenset[State] = frozenset({State.SUCCEEDED, State.SAFE_TO_RETRY})


def is_allowed(from_state: State | None, to_state: State) -> bool:
    """Whether the contract allows `from_state -> to_state`; `None` is creation, which starts at planned."""
    if from_state is None:
        return to_state == State.PLANNED
    return to_state in ALLOWED_TRANSITIONS[from_state]


class RefusalReason(StrEnum):
    """Why the proxy answered a request from an earlier receipt instead of forwarding it."""

    DUPLICATE_OPEN = "duplicate_open"
    DUPLICATE_SUCCEEDED_REPLAY = "duplicate_succeeded_replay"
    DUPLICATE_SUCCEEDED_REFUSE = "duplicate_succeeded_refuse"
    IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"


class ControlKind(StrEnum):
    """The two verifier controls of a read rule: it finds a known effect, and it finds nothing for a probe."""

    POSITIVE = "positive"
    NEGATIVE = "negative"


class ControlResult(StrEnum):
    """What one run of a verifier control showed. `read_failed` proves nothing either way (a failed read of
    the rule); `no_known_success` is a positive control with no effect to be run on."""

    PASSED = "passed"
    FAILED = "failed"
    READ_FAILED = "read_failed"
    NO_KNOWN_SUCCESS = "no_known_success"


class ApprovalState(StrEnum):
    """Where a person's approval of one intent stands. `pending` waits for a person; `approved` may be used
    by the next same request before it expires; `used` was used up by the receipt it names; `denied` and
    `expired` are final."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    USED = "used"
    EXPIRED = "expired"


# Only a pending approval is decided by a person.
DECIDABLE_APPROVAL_STATES: frozenset[ApprovalState] = frozenset({ApprovalState.PENDING})
