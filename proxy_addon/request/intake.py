"""What a journaled write is decided by before anything is recorded.

The handler (handler.py) journals a write from its `WriteIntent`; the agent API's `POST /check`
(agent_api/check.py) asks the journal what it would decide for the same `WriteIntent`, without recording it, and
answers with what the handler would have answered (rules/answers.py, rules/duplicates.py). Both build it here,
from the same request facts, so that what `check` says and what the write then gets cannot drift apart.
"""

from dataclasses import dataclass

from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.approvals import ApprovalAsk, approval_for
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import Intent


@dataclass(frozen=True, slots=True)
class WriteIntent:
    """A journaled write as the journal decides it: its intent, the operation rule it matched, the agent's own
    Idempotency-Key (the header the host names), and the approval its rule or host asks for (None: none)."""

    intent: Intent
    rule: OperationRule | None
    agent_key: str | None
    approval: ApprovalAsk | None


def write_intent(
    facts: RequestFacts, policy: HostPolicy, hasher: AccountHasher, instance_id: str, max_stored_body: int, operation_id: str
) -> WriteIntent:
    """Fingerprint, account and redacted copy (rules/intent.py), with the key it is journaled under: the agent's
    own, else the operation id when the host injects one."""
    agent_key = header_value(facts, policy.idempotency_key_header)
    key = agent_key if agent_key is not None else (operation_id if policy.inject_idempotency_key else None)
    intent, rule = build_intent(facts, policy, hasher, instance_id, max_stored_body, key, operation_id)
    ask = approval_for(policy.approval, rule.approval if rule is not None else None)
    return WriteIntent(intent, rule, agent_key, ask)


def header_value(facts: RequestFacts, name: str) -> str | None:
    """The header's value, several joined with ", " (as mitmproxy's Headers give it)."""
    wanted = name.lower()
    values = [v for k, v in facts.headers if k.lower() == wanted]
    return ", ".join(values) if values else None
