"""What a reconcile read found, and the verdict it gives; pure, so the whole table of cases is tested directly.

- the write is there: succeeded, with the external id found;
- absence proven by an authoritative 2xx read, after `settle`: the rule's `absent_means`
  (safe_to_retry only with retry_safe; succeeded only for a DELETE whose rule says so; else manual_review);
- a DELETE whose target is still there after `settle` did not happen: safe_to_retry with retry_safe, else
  manual_review (never succeeded);
- several candidates, a mismatch after `settle`, or no rule: manual_review, for a person;
- a read that failed proves nothing (an error, a timeout, a non-2xx, a search whose pages do not reach back to
  the submission): back to outcome_unknown with backoff, manual_review after `attempts`.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from proxy_addon.rules.operations import ReconcileRule
from proxy_addon.rules.records import ReceiptRecord, Verdict
from proxy_addon.rules.states import State


class Found(StrEnum):
    """What a read found."""

    PRESENT = "present"  # the write's effect is there
    STILL_PRESENT = "still_present"  # a DELETE's target is still there: the delete did not happen
    ABSENT = "absent"  # an authoritative read found nothing
    MISMATCH = "mismatch"  # a different resource is where ours would be
    AMBIGUOUS = "ambiguous"  # several candidates
    REFUSED = "refused"  # the rule cannot be applied
    FAILED = "failed"  # the read proved nothing


NEEDS_SETTLE = frozenset({Found.ABSENT, Found.STILL_PRESENT, Found.MISMATCH})
_CLEAR_LEASE = {"lease_owner": None, "lease_expires_at": None}


@dataclass(frozen=True)
class ReadOutcome:
    kind: Found
    evidence: dict[str, Any] = field(default_factory=dict)
    external_id: str | None = None


def read_verdict(
    receipt: ReceiptRecord, rule: ReconcileRule, retry_safe: bool, outcome: ReadOutcome, now: datetime, backoff: float
) -> Verdict:
    """The verdict for one read, with the evidence for the history."""
    kind = Found(outcome.kind)
    detail = {"strategy": rule.strategy, "result": kind.value, **outcome.evidence}
    if kind == Found.PRESENT:
        return Verdict(State.SUCCEEDED, {**_CLEAR_LEASE, "external_id": outcome.external_id or receipt.external_id}, detail)
    if kind in (Found.AMBIGUOUS, Found.REFUSED):
        detail.setdefault("reason", f"read {kind.value}; a person must decide")
        return Verdict(State.MANUAL_REVIEW, dict(_CLEAR_LEASE), detail)
    if kind in NEEDS_SETTLE:
        return _after_settle(receipt, rule, retry_safe, kind, now, detail)
    attempts = receipt.reconcile_attempts + 1
    detail["attempt"] = attempts
    why = outcome.evidence.get("reason", "read failed")
    if attempts >= rule.attempts:
        detail["reason"] = f"{attempts} reads failed (last: {why}); a person must decide"
        return Verdict(State.MANUAL_REVIEW, {**_CLEAR_LEASE, "reconcile_attempts": attempts}, detail)
    retry_at = now + timedelta(seconds=backoff * 2 ** (attempts - 1))
    detail["reason"] = f"{why}; tried again after {retry_at.isoformat()}"
    return Verdict(State.OUTCOME_UNKNOWN, {**_CLEAR_LEASE, "reconcile_attempts": attempts, "next_attempt_at": retry_at}, detail)


def _after_settle(
    receipt: ReceiptRecord, rule: ReconcileRule, retry_safe: bool, kind: Found, now: datetime, detail: dict[str, Any]
) -> Verdict:
    """Absent, still present or mismatched: what a read does not show yet (eventual consistency) proves
    nothing before `settle`."""
    settled_at = (receipt.submitted_at or receipt.created_at) + timedelta(seconds=rule.settle)
    if now < settled_at:
        detail["reason"] = f"not settled: {kind.value} proves nothing before {settled_at.isoformat()}"
        return Verdict(State.OUTCOME_UNKNOWN, {**_CLEAR_LEASE, "next_attempt_at": settled_at}, detail)
    if kind == Found.MISMATCH:
        detail.setdefault("reason", "the resource found does not match the request")
        return Verdict(State.MANUAL_REVIEW, dict(_CLEAR_LEASE), detail)
    if kind == Found.STILL_PRESENT:
        verdict = State.SAFE_TO_RETRY if retry_safe else State.MANUAL_REVIEW
        detail["reason"] = f"still there after settle: the {receipt.method} did not take effect; retry_safe {retry_safe}"
        return Verdict(verdict, dict(_CLEAR_LEASE), detail)
    verdict = State(rule.absent_means)
    if verdict == State.SAFE_TO_RETRY and not retry_safe:
        verdict = State.MANUAL_REVIEW
    if verdict == State.SUCCEEDED and receipt.method != "DELETE":
        verdict = State.MANUAL_REVIEW  # absence is success only for a DELETE (config refuses it elsewhere)
    detail["reason"] = f"absent after settle; absent_means {rule.absent_means}, retry_safe {retry_safe}: {verdict.value}"
    return Verdict(verdict, dict(_CLEAR_LEASE), detail)
