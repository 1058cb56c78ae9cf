"""The protocol seam: what the addon and the handler ask about a request, whatever its protocol.

A `Call` is one request as its protocol reads it. It answers three questions:
- read or write? (`journal`; a read passes through, streamed, and `passes` says why);
- what is this write's identity and operation name? (`identity`, `operation`; `name` is what a rule's `call`
  matches: a tool name, a GraphQL operation, a JSON-RPC method);
- how does the proxy say a problem, or replay, in this protocol? (`answer`), and what does the upstream's
  answer mean in it (`verdict`; `stored` is the part of it kept for a replay).

This base class is REST, and the default of every method is REST's: identity by the body, answers in
problem+json, verdicts by status. A protocol module (graphql.py, jsonrpc.py) subclasses it; routing.py asks
each in turn. Pure: no flows, no network, no database.
"""

import json
from dataclasses import dataclass, replace
from typing import Any

from mitmproxy.net import encoding

from proxy_addon.rules.answers import PROBLEM_BASE, PROBLEM_CONTENT_TYPE, REPLAYED_HEADER, Answer
from proxy_addon.rules.fingerprint import BodyIdentity
from proxy_addon.rules.operations import OperationRule, ProtocolName
from proxy_addon.rules.records import Verdict
from proxy_addon.rules.send_result import SendResult

RECEIPT_HEADER_PREFIX = b"x-receipt-"

# What the agent may do next, by the problem's kind: said to a model in the protocol's own words.
ADVICE = {
    "duplicate-open": "Do not send it again: the earlier request may still take effect. Retries are refused until "
    "its receipt is settled (by the reconciler or a person).",
    "outcome-unknown": "It may have taken effect. Do not send it again: retries are refused until its receipt is "
    "reconciled or resolved by a person.",
    "duplicate-succeeded": "It already took effect: do not repeat it.",
    "not-sent": "Nothing reached the server: you may send it again.",
    "journal-unavailable": "Nothing was sent: you may send it again later.",
    "idempotency-key-mismatch": "Use a new Idempotency-Key for a different request.",
    "approval-required": "Do not change the request: ask a person to approve it, then send this same request again.",
    "approval-denied": "Do not send it again: a person decided against it.",
}


@dataclass(frozen=True)
class Problem:
    """One of the proxy's own problem+json answers, read back (rules/answers.py writes them)."""

    kind: str  # the type's last segment: duplicate-open, outcome-unknown, ...
    status: int
    title: str
    detail: str
    operation_id: str | None
    state: str | None
    approval_id: str | None = None
    receipt_url: str | None = None  # where the agent asks for the receipt later (the agent API, agents/)

    @property
    def advice(self) -> str:
        return ADVICE.get(self.kind, "")

    def sentence(self) -> str:
        """What happened, which receipt, and what the agent may do, in one paragraph."""
        receipt = f" Receipt {self.operation_id} is {self.state}." if self.operation_id else ""
        ask = f"Before acting again, ask {self.receipt_url} (the get_receipt tool)." if self.receipt_url else ""
        return " ".join(part for part in (f"{self.title}: {self.detail}", receipt.strip(), self.advice, ask) if part)


@dataclass(frozen=True)
class Call:
    """A request read as REST: journaled (unless a route said otherwise), identified by its body."""

    protocol: str = "rest"
    journal: bool = True
    passes: str | None = None  # why it passes through, when `journal` is False
    operation: str | None = None  # the operation name the protocol gives it (None: the rule's, or METHOD host path)
    name: str | None = None  # what a rule's `call` matches

    def passing(self, why: str) -> "Call":
        """The same call, passing through."""
        return replace(self, journal=False, passes=why)

    def identity(self, body: BodyIdentity, rule: OperationRule | None) -> BodyIdentity:
        """What of the request identifies the write (the rule's allowlist, when it has one, stays in charge)."""
        return body

    def verdict(self, verdict: Verdict, result: SendResult) -> Verdict:
        """The receipt's verdict once the protocol has read the upstream's answer."""
        return verdict

    def stored(self, result: SendResult) -> SendResult:
        """The upstream's answer as it is kept for a replay."""
        return result

    def answer(self, answer: Answer) -> Answer:
        """The answer to send the agent: the proxy's problems and replays in the protocol's shape."""
        return answer


def problem_of(answer: Answer) -> Problem | None:
    """The proxy's own problem+json in this answer, or None (an upstream's answer, a replay)."""
    if (answer.header("content-type") or "").split(";")[0].strip().lower() != PROBLEM_CONTENT_TYPE:
        return None
    try:
        document = json.loads(answer.body)
    except ValueError:
        return None
    kind = document.get("type") if isinstance(document, dict) else None
    if not isinstance(kind, str) or not kind.startswith(PROBLEM_BASE):
        return None
    return Problem(
        kind=kind.removeprefix(PROBLEM_BASE),
        status=answer.status,
        title=str(document.get("title") or ""),
        detail=str(document.get("detail") or ""),
        operation_id=document.get("operation_id"),
        state=document.get("state"),
        approval_id=document.get("approval_id"),
        receipt_url=document.get("receipt_url"),
    )


def is_replay(answer: Answer) -> bool:
    return (answer.header(REPLAYED_HEADER) or "").lower() == "true"


def receipt_headers(answer: Answer) -> dict[str, str]:
    """The `X-Receipt-*` headers of an answer, to keep on the one that replaces it."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in answer.headers if k.lower().startswith(RECEIPT_HEADER_PREFIX)}


def decoded_body(headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...], body: bytes) -> bytes | None:
    """The body with its Content-Encoding undone, or None when it cannot be."""
    coding = next((v.decode("latin-1").strip().lower() for k, v in headers if k.lower() == b"content-encoding"), "")
    if not coding or coding == "identity":
        return body
    try:
        decoded = encoding.decode(body, coding)
    except ValueError:
        return None
    return decoded if isinstance(decoded, bytes) else decoded.encode()


def json_document(body: bytes) -> Any:
    """The body's JSON, or None."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True, slots=True)
class Route:
    """What the head of a request says: journaled (maybe), or passing through and why."""

    journal: bool
    passes: str | None = None  # method | host | model_api | rule
    protocol: ProtocolName = "auto"
    read_methods: tuple[str, ...] = ()
