"""What a person does with a receipt, and what the system can prove about it: shared by the CLI and the admin server.

- `resolve`: a person's verdict on a manual_review or outcome_unknown receipt, kept in its history;
- `proof`: what the system can prove happened, and what a retry of the same request would get now
  (the proxy's own duplicate decision, rules/duplicates.py).
"""

from typing import Any

from proxy_addon.config import ReceiptsConfig
from proxy_addon.exceptions import InvalidResolutionError, NotResolvableError
from proxy_addon.rules import duplicates
from proxy_addon.rules.records import ReceiptRecord, TransitionRecord
from proxy_addon.rules.states import RESOLUTION_STATES, RESOLVABLE_STATES, TERMINAL_STATES, State
from proxy_addon.store import ReceiptStore
from proxy_addon.views.documents import transition_document

# the transitions that say something about the outcome (not creation, sending or a worker's lease)
VERDICT_STATES = frozenset(
    {State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN, State.SAFE_TO_RETRY, State.MANUAL_REVIEW}
)


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
    receipt = store.receipts.get(operation_id)
    if State(receipt.state) not in RESOLVABLE_STATES:
        raise NotResolvableError(
            f"receipt {receipt.operation_id} is {receipt.state}; only manual_review or outcome_unknown can be resolved"
        )
    external_id = (external_id or "").strip() or None
    updates: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if external_id:
        updates["external_id"] = external_id
    detail = {"who": f"person:{who}", "note": note, "external_id": external_id, "verdict": target.value}
    store.receipts.transition(receipt.operation_id, receipt.state, target, detail, **updates)
    return receipt, store.receipts.get(receipt.operation_id)


# -- what the system can prove ------------------------------------------------------------------------------


def retry_decision(store: ReceiptStore, config: ReceiptsConfig, receipt: ReceiptRecord) -> duplicates.RetryDecision:
    """What the proxy would do, now, with the same request again (same account, same fingerprint, no key)."""
    after_success = config.policy_for(receipt.host, receipt.port).after_success
    return duplicates.decide_retry(store.receipts.blocker_of(receipt, after_success), after_success)


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
    receipt = store.receipts.get(operation_id)
    history = store.receipts.history(operation_id)
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
        "retry": retry_decision(store, config, receipt).document(),
        "duplicates_refused": len(store.refusals.list(blocking_operation_id=operation_id, limit=None)),
        "evidence": [transition_document(t) for t in history if t.to_state in VERDICT_STATES],
    }
