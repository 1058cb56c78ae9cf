"""The one duplicate decision: what a request gets when an earlier receipt of the same intent stands in its way.

The journal finds the blocker (journal/writes.py, `blocker`); this module decides, from the blocker and
the host's `after_success` policy, whether the request is refused, answered with the stored response, or
forwarded. The proxy answers by it, and the proof endpoint and the review page say what a retry would get by it.

Which successes still block (the blocker query applies it): one within the host's `after_success.window`,
unless a later journaled write by the same account to the same target (scheme, host, port, path) with a
method in INVALIDATING_METHODS (states.py) may have changed what is there since (RFC 9111 4.4: unsafe methods
invalidate what a cache holds for their target). PUT A, PUT B, PUT A forwards the third: replaying A's first answer
would be a stale lie. A POST invalidates nothing: a later create does not undo an earlier one, and POST A,
POST B, POST A is most likely a retry of the first. A later write known not to have happened (rejected,
or proved absent: safe_to_retry) changes nothing either.

A repeat that waited for an in-flight original (`in_flight.policy: wait`, request/handler.py) is decided here too,
once the original has its verdict, as any repeat after that verdict is; only when the original ended with
its outcome unknown does the waiter get the original's 504 rather than a 409, as it is in effect that call.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from proxy_addon.rules import answers
from proxy_addon.rules.answers import Answer
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Blocker, BlockKind, ReceiptRecord
from proxy_addon.rules.redaction import REDACTED
from proxy_addon.rules.states import IN_FLIGHT_STATES, RefusalReason
from proxy_addon.rules.verdicts import is_success


def successes_block_for(after_success: AfterSuccess) -> float | None:
    """How long (seconds) a success of an intent blocks a repeat of it under this policy; None when none does
    (`allow`, or no window): what the blocker query is given."""
    if after_success.policy != "allow" and after_success.window > 0:
        return float(after_success.window)
    return None


@dataclass(frozen=True)
class RetryDecision:
    """What a request for an intent gets now."""

    decision: Literal["forwarded", "refused", "replayed"]
    reason: RefusalReason | None  # why it is not forwarded; None when it is
    blocker: Blocker | None
    until: datetime | None  # when a success stops blocking (its after_success window ends)
    explanation: str

    @property
    def status(self) -> int | None:
        if self.reason is None:
            return None
        if self.reason == RefusalReason.DUPLICATE_SUCCEEDED_REPLAY and self.blocker is not None:
            return self.blocker.receipt.status_code
        return 422 if self.reason == RefusalReason.IDEMPOTENCY_KEY_MISMATCH else 409

    @property
    def problem(self) -> str | None:
        return _PROBLEMS.get(self.reason) if self.reason is not None else None

    def document(self) -> dict[str, Any]:
        """The `retry` object of `GET /receipts/{id}/proof`."""
        return {
            "decision": self.decision,
            "status": self.status,
            "problem": self.problem,
            "blocking_operation_id": self.blocker.receipt.operation_id if self.blocker else None,
            "until": self.until,
            "reason": self.explanation,
        }


_PROBLEMS = {
    RefusalReason.DUPLICATE_OPEN: "duplicate-open",
    RefusalReason.DUPLICATE_SUCCEEDED_REFUSE: "duplicate-succeeded",
    RefusalReason.IDEMPOTENCY_KEY_MISMATCH: "idempotency-key-mismatch",
}


def decide_retry(blocker: Blocker | None, after_success: AfterSuccess) -> RetryDecision:
    if blocker is None:
        explanation = (
            "no open receipt and no recent success for this request (or a later PUT, PATCH or DELETE to its target "
            "ended that success's window): a retry gets a new receipt and is sent"
        )
        return RetryDecision("forwarded", None, None, None, explanation)
    r = blocker.receipt
    if blocker.kind == BlockKind.KEY_MISMATCH:
        explanation = f"its Idempotency-Key belongs to {r.operation_id}, a different request: nothing is forwarded"
        return RetryDecision("refused", RefusalReason.IDEMPOTENCY_KEY_MISMATCH, blocker, None, explanation)
    if blocker.kind == BlockKind.OPEN:
        explanation = f"{r.operation_id} is {r.state}: nothing is forwarded while its outcome is open"
        return RetryDecision("refused", RefusalReason.DUPLICATE_OPEN, blocker, None, explanation)
    until = r.completed_at + timedelta(seconds=after_success.window) if r.completed_at is not None else None
    if after_success.policy == "replay" and replayable(r):
        explanation = f"{r.operation_id} succeeded: its stored response is replayed, nothing is forwarded"
        return RetryDecision("replayed", RefusalReason.DUPLICATE_SUCCEEDED_REPLAY, blocker, until, explanation)
    explanation = f"{r.operation_id} succeeded within the after_success window: nothing is forwarded"
    if after_success.policy == "replay":
        explanation += " (it holds no answer that can be replayed as it was delivered)"
    return RetryDecision("refused", RefusalReason.DUPLICATE_SUCCEEDED_REFUSE, blocker, until, explanation)


def in_flight(blocker: Blocker) -> bool:
    """Whether the blocker is an original still on its way: a repeat may wait for its verdict."""
    return blocker.kind == BlockKind.OPEN and blocker.receipt.state in IN_FLIGHT_STATES


def replayable(original: ReceiptRecord) -> bool:
    """Whether a succeeded receipt holds the upstream's answer whole and as delivered. One settled by a
    person or the reconciler holds none (its request ended unknown); a truncated one is not whole; a redacted
    one is not what was delivered."""
    return (
        original.response_headers is not None
        and not original.response_body_truncated
        and not original.response_body_redacted
        and original.status_code is not None
        and is_success(original.status_code)
    )


def refusal_answer(decision: RetryDecision, idempotency_key: str | None, waited: bool = False) -> Answer:
    """The answer to a request that is not forwarded, with the blocking receipt's headers. `waited`: the
    request waited for the blocker's verdict (in_flight.policy wait)."""
    assert decision.blocker is not None and decision.reason is not None
    r = decision.blocker.receipt
    if decision.reason == RefusalReason.DUPLICATE_OPEN and waited and r.state not in IN_FLIGHT_STATES:
        reason = f"This request repeats {r.operation_id}, whose outcome became unknown while this one waited for it"
        reply = answers.outcome_unknown(r.operation_id, reason, r.status_code, r.state)
    elif decision.reason == RefusalReason.DUPLICATE_OPEN:
        reply = answers.duplicate_open(r.operation_id, r.state)
    elif decision.reason == RefusalReason.IDEMPOTENCY_KEY_MISMATCH:
        reply = answers.idempotency_key_mismatch(r.operation_id, r.state, idempotency_key or "")
    elif decision.reason == RefusalReason.DUPLICATE_SUCCEEDED_REPLAY:
        reply = replay(r)
    else:
        reply = answers.duplicate_succeeded(r.operation_id, r.status_code, r.external_id)
    return answers.with_receipt(reply, r.operation_id, r.state)


def replay(original: ReceiptRecord) -> Answer:
    """The stored upstream answer byte for byte, less the secret headers whose values were not stored."""
    pairs = original.response_header_pairs()
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs if v != REDACTED]
    assert original.status_code is not None
    return answers.exact(original.status_code, headers, original.response_body or b"").with_headers(
        {answers.REPLAYED_HEADER: "true"}
    )
