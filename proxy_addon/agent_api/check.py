"""`POST /check`: what the proxy would do now with the request an agent is about to send, with nothing journaled,
forwarded or stored.

It walks the real write's path, asking at each step the code that step runs (so that the two cannot drift):
the proxy's own addresses (addons/admission.py's `OwnAddresses`, 403), the route from the head
(protocols/routing.py: a method, host or rule that passes through), `proxy.max_body` (413), a request HTTP/1.1
cannot carry (admission.py's `bad_request`, 400), the body's protocol (a GraphQL query, an MCP `tools/list`:
reads pass through), the intent (request/intake.py, as the handler builds it), and the journal's decision
(journal/writes.py `foresee`: the blocker queries `record` runs and its approval statements' conditions, in a
read-only transaction). The answer it would give is made by the functions the handler answers with
(rules/duplicates.py `refusal_answer`, rules/answers.py `approval_answer`), in the request's protocol.

What it cannot foresee: what the upstream will answer to a forwarded write, a write another agent or replica
records between the check and the write, and, for a host with `in_flight.policy: wait`, the verdict an
in-flight original gets while the repeat waits for it (`waits` says how long it would wait).
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.config import HostPolicy, ReceiptsConfig
from proxy_addon.exceptions import BadRequestError
from proxy_addon.journal.writes import Foreseen
from proxy_addon.protocols import routing
from proxy_addon.protocols.base import problem_of
from proxy_addon.protocols.facts import RequestFacts, split_query
from proxy_addon.request.handler import INLINE_INTENT_BODY
from proxy_addon.request.intake import WriteIntent, write_intent
from proxy_addon.request.wellformed import bad_request
from proxy_addon.rules import answers, duplicates
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.answers import Answer, approval_answer
from proxy_addon.rules.records import ApprovalRecord, ReceiptRecord, new_operation_id
from proxy_addon.rules.states import ApprovalState, RefusalReason

Decision = Literal["forward", "replay", "refuse", "approval_required", "not_journaled"]
# why a request passes through (routing's and the protocols' reasons), said to a model
_PASSES = {
    "method": "its method is not one the proxy journals (proxy.methods)",
    "host": "its host says journal: false",
    "model_api": "its host is a model API, which passes through",
    "rule": "an operation rule says journal: false",
}
Forbidden = Callable[[str, int], Awaitable[str | None]]  # what of the proxy's own `host:port` is, or None


class CheckRequest(BaseModel):
    """The body of `POST /check`: the request the agent is about to send, as it will send it."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(min_length=1, examples=["POST"])
    url: str = Field(min_length=1, examples=["https://api.example.com/v1/payments"])
    headers: dict[str, str] = Field(
        default_factory=dict, description="its headers; the credentials count for whose request it is, as in the real write"
    )
    body: Any = Field(
        None,
        description="its body: a string as it will be sent, or any other JSON value, sent as JSON "
        "(Content-Type application/json unless the headers say otherwise)",
    )


@dataclass(frozen=True)
class Checked:
    """What the proxy would do: its `decision`, the answer it would give itself (None: the request goes upstream),
    the operation it would be journaled as, and the receipt or approval concerned."""

    decision: Decision
    reason: str
    answer: Answer | None = None
    problem: str | None = None  # the problem type's last segment (duplicate-open, ...)
    operation: str | None = None
    receipt: ReceiptRecord | None = None
    approval: ApprovalRecord | None = None
    approval_asked: bool = False  # a new approval would be asked for
    waits: float | None = None  # in_flight.policy wait: how long the write would wait for the open receipt's verdict


@dataclass(frozen=True)
class CheckContext:
    """What a check reads: the proxy's config, its account key, its instance id, and its own addresses."""

    config: ReceiptsConfig
    hasher: AccountHasher
    instance_id: str
    forbidden: Forbidden
    on_thread: Callable[..., Awaitable[Any]]  # runs a function off the event loop


def request_facts(request: CheckRequest) -> RequestFacts:
    """The request as the proxy's addon would read it off the wire; BadRequestError names what cannot be one."""
    method = request.method.strip().upper()
    parts = urlsplit(request.url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise BadRequestError(f"url {request.url[:200]!r} is not an absolute http or https URL")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise BadRequestError(f"url {request.url[:200]!r} has an invalid port") from None
    headers = list(request.headers.items())
    if isinstance(request.body, str) or request.body is None:
        body = (request.body or "").encode()
    else:
        body = json.dumps(request.body, separators=(",", ":")).encode()
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", "application/json"))
    path, query = split_query(parts.path + (f"?{parts.query}" if parts.query else ""))
    content_type = next((v for k, v in headers if k.lower() == "content-type"), None)
    return RequestFacts(
        method=method,
        scheme=scheme,
        host=parts.hostname.lower(),
        port=port,
        path=path,
        query=query,
        headers=headers,
        content_type=content_type,
        body=body,
        url=request.url.strip(),
        raw_headers=tuple((k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers),
        raw_body=body,
    )


async def check_write(
    request: CheckRequest, context: CheckContext, foresee: Callable[[WriteIntent, HostPolicy], Awaitable[Foreseen]]
) -> Checked:
    """What the proxy would do now with this request. `foresee` asks the journal (off the event loop) what it
    would decide for the write (StoredReceipts.foresee)."""
    facts = request_facts(request)
    config = context.config
    if config.agent_api.enabled and facts.host == config.agent_api.host:
        return Checked("not_journaled", "it is addressed to the agent API, which the proxy answers itself")
    own = await context.forbidden(facts.host, facts.port)
    if own is not None:
        return _refused(answers.forbidden_destination(own), "the proxy does not forward requests to itself")
    where = routing.route(config, facts.method, facts.host, facts.port, facts.path)
    if not where.journal:
        return Checked("not_journaled", f"it passes through: {_PASSES.get(where.passes or '', where.passes)}")
    if len(facts.body) > config.proxy.max_body:
        return _refused(answers.body_too_large(config.proxy.max_body, len(facts.body)), "its body is over proxy.max_body")
    problem = bad_request(facts)
    if problem is not None:
        return _refused(answers.bad_request(problem), problem)
    if len(facts.body) <= INLINE_INTENT_BODY:
        facts, written = _read(facts, context)
    else:  # its protocol's reading and its fingerprint cost more: off the event loop, as the handler's do
        facts, written = await context.on_thread(_read, facts, context)
    if written is None:
        return Checked("not_journaled", f"it passes through: its protocol reads it as a read ({facts.call.passes})")
    policy = config.policy_for(facts.host, facts.port)
    foreseen = await foresee(written, policy)
    checked = _decided(foreseen, written, policy)
    shaped = None if checked.answer is None else facts.call.answer(checked.answer)  # MCP, GraphQL: their own shape
    return replace(checked, answer=shaped, operation=written.intent.operation)


def _read(facts: RequestFacts, context: CheckContext) -> tuple[RequestFacts, WriteIntent | None]:
    """The request as its protocol reads it, and, for a write, what the journal decides it by."""
    config = context.config
    facts = replace(facts, call=routing.recognise(facts, config))
    if not facts.call.journal:
        return facts, None
    policy = config.policy_for(facts.host, facts.port)
    operation_id = new_operation_id()
    return facts, write_intent(facts, policy, context.hasher, context.instance_id, config.proxy.max_stored_body, operation_id)


def _decided(foreseen: Foreseen, written: WriteIntent, policy: HostPolicy) -> Checked:
    """The decision and the answer, from what the journal would decide (as the handler answers it)."""
    if foreseen.blocker is not None:
        retry = duplicates.decide_retry(foreseen.blocker, policy.after_success)
        answer = duplicates.refusal_answer(retry, written.agent_key)
        decision: Decision = "replay" if retry.reason == RefusalReason.DUPLICATE_SUCCEEDED_REPLAY else "refuse"
        waits = policy.in_flight.max_wait if policy.in_flight.policy == "wait" and duplicates.in_flight(foreseen.blocker) else None
        return Checked(decision, retry.explanation, answer, retry.problem, receipt=foreseen.blocker.receipt, waits=waits)
    a = foreseen.approval
    if a is not None and a.state == ApprovalState.DENIED.value:
        return Checked("refuse", f"a person denied it: {a.note or '(no note)'}", approval_answer(a), "approval-denied", approval=a)
    if a is not None and a.state == ApprovalState.PENDING.value:
        why = f"approval {a.approval_id} is pending: a person must approve it before it is sent"
        return Checked("approval_required", why, approval_answer(a), "approval-required", approval=a)
    if foreseen.asks_approval:
        # sending it asks for a new approval: the answer's shape, with the id it would be given still unknown
        asked = answers.approval_required("", written.intent.operation, 1, "")
        why = "its rule asks for a person's approval: sending it asks for one, and forwards nothing"
        return Checked("approval_required", why, asked, "approval-required", approval_asked=True)
    if foreseen.approval is not None:
        why = f"approval {foreseen.approval.approval_id} is used up by it: it would be journaled and sent"
        return Checked("forward", why, approval=foreseen.approval)
    return Checked("forward", "nothing stands in its way: it would get a new receipt and be sent upstream once")


def _refused(answer: Answer, reason: str) -> Checked:
    found = problem_of(answer)
    return Checked("refuse", reason, answer, found.kind if found is not None else None)
