"""The one duplicate decision: what a request gets when an earlier receipt of the same intent stands in its way.

The store finds the blocker (store/receipts.py, `_find_blocker`); this module decides, from the blocker and
the host's `after_success` policy, whether the request is refused, answered with the stored response, or
forwarded. The proxy answers by it, and the proof endpoint and the review page say what a retry would get by it.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from proxy_addon import answers
from proxy_addon.answers import Answer
from proxy_addon.config import AfterSuccess
from proxy_addon.fingerprint import REDACTED
from proxy_addon.records import Blocker, BlockKind, ReceiptRecord
from proxy_addon.states import RefusalReason


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


def decide(blocker: Blocker | None, after_success: AfterSuccess) -> RetryDecision:
    if blocker is None:
        explanation = "no open receipt and no recent success for this request: a retry gets a new receipt and is sent"
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
    return RetryDecision("refused", RefusalReason.DUPLICATE_SUCCEEDED_REFUSE, blocker, until, explanation)


def replayable(original: ReceiptRecord) -> bool:
    """Whether a succeeded receipt holds an upstream answer that may be replayed whole. One settled by a
    person or the reconciler holds none (its request ended unknown), and a truncated one is not whole."""
    return (
        original.response_headers is not None
        and not original.response_body_truncated
        and original.status_code is not None
        and 200 <= original.status_code < 300
    )


def refusal_answer(decision: RetryDecision, idempotency_key: str | None) -> Answer:
    """The answer to a request that is not forwarded, with the blocking receipt's headers."""
    assert decision.blocker is not None and decision.reason is not None
    r = decision.blocker.receipt
    if decision.reason == RefusalReason.DUPLICATE_OPEN:
        reply = answers.duplicate_open(r.operation_id, r.state)
    elif decision.reason == RefusalReason.IDEMPOTENCY_KEY_MISMATCH:
        reply = answers.idempotency_key_mismatch(r.operation_id, r.state, idempotency_key or "")
    elif decision.reason == RefusalReason.DUPLICATE_SUCCEEDED_REPLAY:
        reply = replay(r)
    else:
        reply = answers.duplicate_succeeded(r.operation_id)
    return answers.with_receipt(reply, r.operation_id, r.state)


def replay(original: ReceiptRecord) -> Answer:
    """The stored upstream response, less the secret headers that were not stored."""
    stored = original.response_headers or {}
    headers = {k: v for k, v in stored.items() if v != REDACTED and k != "content-length"}
    assert original.status_code is not None
    return answers.answer(original.status_code, original.response_body or b"", headers).with_headers(
        {answers.REPLAYED_HEADER: "true"}
    )
