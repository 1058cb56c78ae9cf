"""Verifier controls: a read rule is trusted for a verdict only once it has been seen to see.

A rule written with a slip (the wrong collection, a query parameter the server ignores, an items path that
is not there, a match on a field the server does not return) finds nothing for an effect that happened; a
server that answers 200 for any path "finds" one that did not. Either gives a false verdict. So each rule is
run, exactly as for a verdict (strategies.py), twice more:

- positive: for a known effect (the most recent succeeded receipt of the same operation and account with an
  external id), it must find that effect with that id (for a DELETE: find its target gone);
- negative: for a probe that cannot exist (the same values, a fresh random nonce in every field the rule
  looks up by or matches on), it must find nothing.

An absence verdict needs both (a blind rule calls everything absent); a presence verdict needs the negative
(a rule that sees everything calls everything present). A control whose read fails proves nothing either way:
it is a failed read of the rule. What the controls cannot tell is which of two look-alike effects is ours:
that is the fingerprint's and the twins rule's (several candidates go to a person) job.
"""

import json
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from proxy_addon.reconcile.decide import Found, ReadOutcome
from proxy_addon.reconcile.rules import request_document
from proxy_addon.rules.operations import PLACEHOLDER_RE, OperationRule, ReconcileRule, template_placeholders
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import ControlRunRecord, ReceiptRecord, Verdict
from proxy_addon.rules.states import ControlKind, ControlResult, State

READ_RULE_STRATEGIES = frozenset({"lookup", "search"})
BOTH = frozenset({ControlKind.POSITIVE, ControlKind.NEGATIVE})
NEGATIVE_ONLY = frozenset({ControlKind.NEGATIVE})
UNPROVEN = "verifier_unproven"  # the error_code of a receipt sent to a person for want of a proven rule


def controls_needed(rule: ReconcileRule, verdict: Verdict, outcome: ReadOutcome) -> frozenset[ControlKind]:
    """What a verdict must be backed by: absence (safe_to_retry, or a DELETE's succeeded by absence) both
    controls, presence (succeeded by finding the effect) the negative one; anything for a person, nothing."""
    if rule.strategy not in READ_RULE_STRATEGIES:
        return frozenset()
    if verdict.state == State.SAFE_TO_RETRY:
        return BOTH
    if verdict.state == State.SUCCEEDED:
        return BOTH if Found(outcome.kind) == Found.ABSENT else NEGATIVE_ONLY
    return frozenset()


def nonce() -> str:
    return f"receipts-probe-{secrets.token_hex(8)}"


def probe_of(base: ReceiptRecord, rule: ReconcileRule, params: dict[str, str], value: str) -> tuple[ReceiptRecord, dict[str, str]]:
    """`base` with `value` in every field the rule looks up by (its url's and body's placeholders) or matches
    on (`match`'s request fields; with each_field, each field of those; a greedy `{key+}` its last segment): an
    effect that cannot exist, read the way the rule reads any other."""
    document = request_document(base)
    document = document if isinstance(document, dict) else {}
    probe_params = dict(params)
    names = [*PLACEHOLDER_RE.findall(rule.url or ""), *template_placeholders(rule.body)]
    for name in (n for n in names if n not in rule.controls.keep):
        if name.startswith("path."):  # a `{key+}`'s leading segments stay: the bucket, Azurite's account
            given = params.get(name[5:], "")
            probe_params[name[5:]] = f"{given.rpartition('/')[0]}/{value}" if "/" in given else value
        elif name.startswith("body."):
            _set_dotted(document, name[5:].split("."), value)
    for _candidate, original in rule.match_paths:
        if rule.match_compare == "each_field":  # the nonce in each of the request's fields the rule compares
            for fields in (f for f in original.find(document) if isinstance(f, dict)):
                fields.update(dict.fromkeys(fields, value))
        else:
            original.compiled.update_or_create(document, value)
    probe = replace(
        base,
        operation_id=f"op_{value}",
        external_id=value if "external_id" in names else base.external_id,
        idempotency_key=value if "idempotency_key" in names else base.idempotency_key,
        request_body=json.dumps(document).encode(),
        request_body_truncated=False,
    )
    return probe, probe_params


def _set_dotted(document: dict[str, Any], parts: list[str], value: str) -> None:
    node = document
    for part in parts[:-1]:
        child = node.get(part)
        node[part] = child = child if isinstance(child, dict) else {}
        node = child
    node[parts[-1]] = value


def known_by_its_id(method: str, op: OperationRule | None = None) -> bool:
    """Whether a known effect of this method is found by its `external_id` (so one is needed): every write but a
    DELETE, whose effect is its target gone, and one whose operation has no id anywhere (a DynamoDB PutItem)."""
    if method == "DELETE":
        return False
    return op is None or op.external_id is not None or (op.reconcile is not None and op.reconcile.id is not None)


def is_known_effect(receipt: ReceiptRecord, op: OperationRule | None = None) -> bool:
    """A receipt the positive control can run on: succeeded, with an external_id where its method needs one."""
    return receipt.state == State.SUCCEEDED and (receipt.external_id is not None or not known_by_its_id(receipt.method, op))


def judge_positive(outcome: ReadOutcome, known: ReceiptRecord, rule: ReconcileRule) -> ControlResult:
    """The rule, run for a known effect, found it, with its id."""
    kind = Found(outcome.kind)
    if kind == Found.FAILED:
        return ControlResult.READ_FAILED
    if not known_by_its_id(known.method):
        return ControlResult.PASSED if kind == Found.ABSENT else ControlResult.FAILED
    if kind == Found.PRESENT and (outcome.external_id == known.external_id or (outcome.external_id is None and rule.id is None)):
        return ControlResult.PASSED
    if kind == Found.AMBIGUOUS and known.external_id in outcome.evidence.get("candidates", []):
        return ControlResult.PASSED  # it saw ours among look-alikes: telling them apart is not its job
    return ControlResult.FAILED


def judge_negative(outcome: ReadOutcome) -> ControlResult:
    """The rule, run for a probe that cannot exist, found nothing."""
    kind = Found(outcome.kind)
    if kind == Found.FAILED:
        return ControlResult.READ_FAILED
    return ControlResult.PASSED if kind == Found.ABSENT else ControlResult.FAILED


@dataclass(frozen=True)
class RuleTarget:
    """One rule as it reads for one host, operation and account (the key its control runs are kept under)."""

    op: OperationRule
    rule: ReconcileRule
    params: dict[str, str]
    policy: HostPolicy
    base: ReceiptRecord  # the values a probe is made from: the receipt being reconciled, or a known success

    def run(self, control: ControlKind, result: ControlResult, at: datetime, **kw: Any) -> ControlRunRecord:
        b = self.base
        return ControlRunRecord(at, b.host, b.port, b.operation, b.account, self.rule.digest, control.value, result.value, **kw)



@dataclass(frozen=True)
class Proof:
    """The control runs a verdict rests on, one per control it needs."""

    runs: tuple[ControlRunRecord, ...]

    @property
    def read_failed(self) -> ControlRunRecord | None:
        return next((r for r in self.runs if r.result == ControlResult.READ_FAILED), None)

    @property
    def failed(self) -> str | None:
        """What failed, as a receipt's detail names it: `negative`, `positive` or `no_known_success`."""
        for run in sorted(self.runs, key=lambda r: r.control):  # negative before positive: it is the graver
            if run.result == ControlResult.NO_KNOWN_SUCCESS:
                return ControlResult.NO_KNOWN_SUCCESS.value
            if run.result != ControlResult.PASSED:
                return run.control
        return None

    def summary(self) -> list[dict[str, Any]]:
        runs = sorted(self.runs, key=lambda r: r.control)
        return [{"control": r.control, "result": r.result, "checked_at": r.checked_at.isoformat()} for r in runs]


def fresh(run: ControlRunRecord | None, now: datetime, max_age: float) -> bool:
    return run is not None and run.passed and run.checked_at >= now - timedelta(seconds=max_age)


def evidence_of(outcome: ReadOutcome, **extra: Any) -> dict[str, Any]:
    """What the control read (URLs redacted by the reader, no header), and what it found."""
    found = {"found": Found(outcome.kind).value, **outcome.evidence}
    if outcome.external_id is not None:
        found["matched_id"] = outcome.external_id
    return {**found, **extra}


def unproven_verdict(rule: ReconcileRule, outcome: ReadOutcome, proof: Proof, would_be: State) -> Verdict:
    """The receipt goes to a person: the verdict the read gave rests on a rule not proven to see."""
    failed = proof.failed or ControlResult.NO_KNOWN_SUCCESS.value
    reason = (
        f"the read says {would_be.value}, but the rule is not proven to see: "
        + ("no known success to run its positive control on" if failed == "no_known_success" else f"its {failed} control failed")
    )
    detail = {"strategy": rule.strategy, "result": Found(outcome.kind).value, **outcome.evidence}
    detail.update(reason=reason, unproven=failed, controls=proof.summary())
    updates = {"lease_owner": None, "lease_expires_at": None, "error_code": UNPROVEN, "error_message": reason}
    return Verdict(State.MANUAL_REVIEW, updates, detail)
