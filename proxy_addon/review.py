"""What people and tools see of a receipt, and what a person does to one: shared by the CLI and the admin server.

- the JSON documents of `receipts ls/show --json` (and of the admin API, which serves the same shapes);
- `resolve`: a person's verdict on a manual_review or outcome_unknown receipt, kept in its history;
- `proof`: what the system can prove happened, and what a retry of the same request would get now.
"""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy_addon.config import ReceiptsConfig
from proxy_addon.exceptions import (
    DuplicateOpenError,
    DuplicateSucceededError,
    InvalidResolutionError,
    NotResolvableError,
)
from proxy_addon.journal import replayable
from proxy_addon.states import OPEN_STATES, RESOLUTION_STATES, RESOLVABLE_STATES, TERMINAL_STATES, State
from proxy_addon.store import ReceiptRecord, ReceiptStore, TransitionRecord

PUBLIC_COLUMNS = (
    "operation_id",
    "operation",
    "method",
    "scheme",
    "host",
    "port",
    "path",
    "query",
    "intent_fingerprint",
    "account",
    "idempotency_key",
    "state",
    "created_at",
    "updated_at",
    "submitted_at",
    "completed_at",
    "status_code",
    "external_id",
    "error_code",
    "error_message",
    "authentication_recorded",
    "proxy_instance",
    "request_body_size",
    "body_note",
    "reconcile_attempts",
    "next_attempt_at",
)

# names for several states at once, in `receipts ls --state`, the API's `?state=` and the review page
STATE_GROUPS: dict[str, tuple[State, ...]] = {
    "open": tuple(sorted(OPEN_STATES)),
    "unknown": (State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW),  # nobody knows the outcome yet
}


def expand_states(names: list[str]) -> list[str]:
    """State names and group names (`open`, `unknown`) -> state values; ValueError names an unknown one."""
    states: list[str] = []
    for name in names:
        if name in STATE_GROUPS:
            states.extend(s.value for s in STATE_GROUPS[name])
            continue
        try:
            states.append(State(name).value)
        except ValueError:
            raise ValueError(
                f"unknown state {name!r} (one of {', '.join(s.value for s in State)}, or open, unknown)"
            ) from None
    return states


# the transitions that say something about the outcome (not creation, sending or a worker's lease)
VERDICT_STATES = frozenset(
    {State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN, State.SAFE_TO_RETRY, State.MANUAL_REVIEW}
)


# -- documents ----------------------------------------------------------------------------------------------


def receipt_document(r: ReceiptRecord) -> dict[str, Any]:
    return {c: getattr(r, c) for c in PUBLIC_COLUMNS}


def transition_document(t: TransitionRecord) -> dict[str, Any]:
    return {"from_state": t.from_state, "to_state": t.to_state, "recorded_at": t.recorded_at, "detail": t.detail}


def show_document(r: ReceiptRecord, history: list[TransitionRecord]) -> dict[str, Any]:
    """`receipts show --json`: the receipt with its whole history."""
    return {**receipt_document(r), "transitions": [transition_document(t) for t in history]}


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(document: Any, indent: int | None = 2) -> str:
    return json.dumps(document, indent=indent, default=json_default)


# -- a person's verdict -------------------------------------------------------------------------------------


def resolve(
    store: ReceiptStore,
    operation_id: str,
    state: str,
    note: str,
    external_id: str | None = None,
    who: str = "operator",
) -> tuple[ReceiptRecord, ReceiptRecord]:
    """Settle a manual_review or outcome_unknown receipt as succeeded or safe_to_retry, with the note in its
    history. Returns (before, after). Raises InvalidResolutionError, ReceiptNotFoundError, NotResolvableError,
    or StaleStateError when someone else changed it first."""
    allowed = ", ".join(sorted(RESOLUTION_STATES))
    try:
        target = State(state)
    except ValueError:
        raise InvalidResolutionError(f"state {state!r} is not a resolution (one of {allowed})") from None
    if target not in RESOLUTION_STATES:
        raise InvalidResolutionError(f"state {state!r} is not a resolution (one of {allowed})")
    if not (note or "").strip():
        raise InvalidResolutionError("a note is required: say what you checked, it stays in the history")
    receipt = store.get(operation_id)
    if State(receipt.state) not in RESOLVABLE_STATES:
        raise NotResolvableError(
            f"receipt {receipt.operation_id} is {receipt.state}; only manual_review or outcome_unknown can be resolved"
        )
    external_id = (external_id or "").strip() or None
    updates: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if external_id:
        updates["external_id"] = external_id
    detail = {"who": f"person:{who}", "note": note, "external_id": external_id, "verdict": target.value}
    updated = store.transition(receipt.operation_id, receipt.state, target, detail, **updates)
    return receipt, updated


# -- what the system can prove ------------------------------------------------------------------------------


def retry_decision(store: ReceiptStore, config: ReceiptsConfig, receipt: ReceiptRecord) -> dict[str, Any]:
    """What the proxy would do, now, with the same request again (same account, same fingerprint, no key)."""
    policy = config.policy_for(receipt.host, receipt.port)
    dup = store.duplicate_of(receipt, policy.after_success)
    if isinstance(dup, DuplicateOpenError):
        return {
            "decision": "refused",
            "status": 409,
            "problem": "duplicate-open",
            "blocking_operation_id": dup.operation_id,
            "until": None,
            "reason": f"{dup.operation_id} is {dup.state}: nothing is forwarded while its outcome is open",
        }
    if isinstance(dup, DuplicateSucceededError):
        original: ReceiptRecord | None = dup.receipt  # type: ignore[assignment]
        until = (
            original.completed_at + timedelta(seconds=policy.after_success.window)
            if original is not None and original.completed_at is not None
            else None
        )
        if dup.policy == "replay" and replayable(original):
            return {
                "decision": "replayed",
                "status": original.status_code if original else None,
                "problem": None,
                "blocking_operation_id": dup.operation_id,
                "until": until,
                "reason": f"{dup.operation_id} succeeded: its stored response is replayed, nothing is forwarded",
            }
        return {
            "decision": "refused",
            "status": 409,
            "problem": "duplicate-succeeded",
            "blocking_operation_id": dup.operation_id,
            "until": until,
            "reason": f"{dup.operation_id} succeeded within the after_success window: nothing is forwarded",
        }
    return {
        "decision": "forwarded",
        "status": None,
        "problem": None,
        "blocking_operation_id": None,
        "until": None,
        "reason": "no open receipt and no recent success for this request: a retry gets a new receipt and is sent",
    }


def what_happened(r: ReceiptRecord, history: list[TransitionRecord]) -> str:
    """One sentence a person or an agent can act on."""
    last = history[-1].detail if history else {}
    who = str(last.get("who") or "")
    by_person = who.startswith("person:")
    status = f" (status {r.status_code})" if r.status_code is not None else ""
    ext = f", external id {r.external_id}" if r.external_id else ""
    state = State(r.state)
    if state == State.PLANNED:
        return "The request was journaled but has not been sent."
    if state == State.SUBMITTED:
        return "The request was sent upstream; no answer is recorded yet."
    if state == State.SUCCEEDED:
        if by_person:
            return f"A person settled it as succeeded{ext}: {last.get('note')}"
        if history and history[-1].from_state == State.RECONCILING.value:
            return f"The reconciler found it upstream: it took effect{ext}."
        return f"The upstream accepted it{status}{ext}."
    if state == State.REJECTED:
        if r.error_code == "not_sent":
            return "It was never sent: nothing reached the upstream."
        return f"The upstream refused it{status}; it did not take effect."
    if state == State.SAFE_TO_RETRY:
        if by_person:
            return f"A person settled it as not done, safe to retry: {last.get('note')}"
        return "A read of the upstream showed it did not take effect: it is safe to retry."
    if state == State.OUTCOME_UNKNOWN:
        why = f"status {r.status_code}" if r.status_code is not None else (r.error_code or "no answer")
        return f"The upstream may or may not have acted ({why}); the reconciler will read it to find out."
    if state == State.RECONCILING:
        return "A reconciliation worker is reading the upstream now to find out whether it took effect."
    reason = last.get("reason")
    return "The system could not prove what happened; a person must decide" + (f" ({reason})." if reason else ".")


def proof(store: ReceiptStore, config: ReceiptsConfig, operation_id: str) -> dict[str, Any]:
    """"What can the system prove happened before I act again?" for one receipt."""
    receipt = store.get(operation_id)
    history = store.history(operation_id)
    state = State(receipt.state)
    return {
        "operation_id": receipt.operation_id,
        "operation": receipt.operation,
        "method": receipt.method,
        "host": receipt.host,
        "path": receipt.path,
        "state": receipt.state,
        "open": state not in TERMINAL_STATES,
        "proven": state in TERMINAL_STATES,
        "what_happened": what_happened(receipt, history),
        "external_id": receipt.external_id,
        "status_code": receipt.status_code,
        "error_code": receipt.error_code,
        "submitted_at": receipt.submitted_at,
        "completed_at": receipt.completed_at,
        "retry": retry_decision(store, config, receipt),
        "duplicates_refused": len(store.list_refusals(blocking_operation_id=operation_id, limit=None)),
        "evidence": [transition_document(t) for t in history if t.to_state in VERDICT_STATES],
    }
