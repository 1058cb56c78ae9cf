"""The answers the handler gives an agent: the upstream's own, a replay, or an RFC 9457 problem+json of ours.

An `Answer` is plain data (no mitmproxy): the addon turns it into the flow's response.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from proxy_addon.rules.records import ApprovalRecord
from proxy_addon.rules.send_result import UpstreamResponse
from proxy_addon.rules.states import ApprovalState

PROBLEM_BASE = "urn:agent-receipts:problem:"
PROBLEM_CONTENT_TYPE = "application/problem+json"
RECEIPT_ID_HEADER = "X-Receipt-Id"
RECEIPT_STATE_HEADER = "X-Receipt-State"
REPLAYED_HEADER = "X-Receipt-Replayed"
_PROBLEM_TYPE_BYTES = PROBLEM_CONTENT_TYPE.encode()


@dataclass(frozen=True)
class Answer:
    """A response: its status, headers exactly as they go out (Content-Length included), body, reason phrase
    (None: the standard one)."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    reason: str | None = None

    def with_headers(self, values: dict[str, str]) -> "Answer":
        """These headers set, replacing any of the same name."""
        given = {k.encode(): v.encode("latin-1", "replace") for k, v in values.items()}
        lowered = {k.lower() for k in given}
        kept = tuple((k, v) for k, v in self.headers if k.lower() not in lowered)
        return replace(self, headers=kept + tuple(given.items()))

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == wanted), None)


def answer(status: int, body: bytes, headers: dict[str, str] | None = None, reason: str | None = None) -> Answer:
    fields = [(k.lower().encode(), str(v).encode("latin-1", "replace")) for k, v in (headers or {}).items()]
    fields = [(k, v) for k, v in fields if k != b"content-length"]
    return Answer(status, (*fields, (b"content-length", str(len(body)).encode())), body, reason)


def exact(status: int, headers: list[tuple[bytes, bytes]], body: bytes, reason: str | None = None) -> Answer:
    """These headers as given (names, order, repeats), with the body as given and its Content-Length."""
    kept = tuple((k, v) for k, v in headers if k.lower() != b"content-length")
    return Answer(status, (*kept, (b"content-length", str(len(body)).encode())), body, reason)


def from_upstream(a: UpstreamResponse) -> Answer:
    """The upstream's answer as it came (hop-by-hop headers already dropped by the sender)."""
    return exact(a.status_code, a.headers, a.content, a.reason)


def with_receipt(a: Answer, operation_id: str, state: str) -> Answer:
    """The receipt headers every journaled request's answer carries."""
    return a.with_headers({RECEIPT_ID_HEADER: operation_id, RECEIPT_STATE_HEADER: state})


# -- problem+json ---------------------------------------------------------------------------------------------


def problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> Answer:
    document = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    document.update({k: v for k, v in extra.items() if v is not None})
    return answer(status, json.dumps(document).encode(), {"Content-Type": PROBLEM_CONTENT_TYPE, "Cache-Control": "no-store"})


def with_receipt_url(a: Answer, receipt_url: Callable[[str], str | None]) -> Answer:
    """One of our problem+json answers that names a receipt, with `receipt_url`: where the agent asks for that
    receipt later (the agent API, agents/). Any other answer (the upstream's, a replay) as it is."""
    if (b"content-type", _PROBLEM_TYPE_BYTES) not in a.headers:
        return a  # ours are made by `answer` (names in lower case); on every write's answer: one tuple scan
    try:
        document = json.loads(a.body)
    except ValueError:  # an upstream's own problem+json that is not JSON: not ours
        return a
    if not isinstance(document, dict) or not str(document.get("type")).startswith(PROBLEM_BASE):
        return a
    operation_id = document.get("operation_id")
    url = receipt_url(operation_id) if isinstance(operation_id, str) else None
    if url is None or "receipt_url" in document:
        return a
    return _with_body(a, json.dumps({**document, "receipt_url": url}).encode())


def _with_body(a: Answer, body: bytes) -> Answer:
    headers = tuple((k, v) for k, v in a.headers if k.lower() != b"content-length")
    return replace(a, headers=(*headers, (b"content-length", str(len(body)).encode())), body=body)


def outcome_unknown(
    operation_id: str, reason: str, upstream_status: int | None = None, state: str = "outcome_unknown"
) -> Answer:
    return problem(
        504,
        "outcome-unknown",
        "Outcome unknown",
        f"{reason}. The upstream may have acted on this request; retrying it is blocked until the receipt "
        "is reconciled (receipts reconcile) or resolved by a person.",
        operation_id=operation_id,
        state=state,
        upstream_status=upstream_status,
    )


def not_sent(operation_id: str, reason: str) -> Answer:
    return problem(
        502,
        "not-sent",
        "Upstream not reached",
        f"{reason}. Nothing reached the upstream, so retrying is allowed.",
        operation_id=operation_id,
        state="rejected",
    )


def duplicate_open(operation_id: str, state: str) -> Answer:
    return problem(
        409,
        "duplicate-open",
        "Duplicate of an open receipt",
        f"The same request is already recorded as {operation_id}, which is {state}; it was not forwarded again. "
        "Wait for the receipt to be reconciled before acting again.",
        operation_id=operation_id,
        state=state,
    )


def duplicate_succeeded(operation_id: str, upstream_status: int | None = None, external_id: str | None = None) -> Answer:
    return problem(
        409,
        "duplicate-succeeded",
        "Duplicate of a recent success",
        f"The same request already succeeded as {operation_id}"
        + (f" (the upstream answered {upstream_status})" if upstream_status else "")
        + "; it was not forwarded again.",
        operation_id=operation_id,
        state="succeeded",
        upstream_status=upstream_status,
        external_id=external_id,
    )


def idempotency_key_mismatch(operation_id: str, state: str, key: str) -> Answer:
    return problem(
        422,
        "idempotency-key-mismatch",
        "Idempotency-Key reused for a different request",
        f"Idempotency-Key {key!r} belongs to {operation_id}, whose request differs from this one; nothing was forwarded.",
        operation_id=operation_id,
        state=state,
    )


def journal_unavailable(reason: str) -> Answer:
    return problem(
        503,
        "journal-unavailable",
        "Receipt journal unavailable",
        f"The receipt could not be written ({reason}); the request was not forwarded. Retrying later is safe.",
    )


# -- a write that waits for a person's approval (rules/approvals.py) ---------------------------------------------


def approval_required(approval_id: str, operation: str, asked: int, expires_at: str) -> Answer:
    return problem(
        403,
        "approval-required",
        "Approval required",
        f"This request ({operation}) needs a person's approval before it is forwarded; it was not forwarded. "
        f"Approval {approval_id} is pending: a person must approve it (receipts approve {approval_id}), and then "
        f"this same request must be sent again, before {expires_at}.",
        approval_id=approval_id,
        state="pending",
        asked=asked,
        expires_at=expires_at,
    )


def approval_denied(approval_id: str, operation: str, decided_by: str | None, note: str | None) -> Answer:
    return problem(
        403,
        "approval-denied",
        "Approval denied",
        f"A person ({decided_by or 'unknown'}) denied this request ({operation}); it was not forwarded. "
        f"Their note: {note or '(none)'}",
        approval_id=approval_id,
        state="denied",
        note=note,
    )


def approval_answer(a: ApprovalRecord) -> Answer:
    """The answer to a write waiting for this approval (pending), or refused by it (denied): nothing forwarded."""
    if a.state == ApprovalState.DENIED.value:
        return approval_denied(a.approval_id, a.operation, a.decided_by, a.note)
    return approval_required(a.approval_id, a.operation, a.asked, f"{a.expires_at:%Y-%m-%dT%H:%M:%SZ}")



# -- requests the proxy refuses before journaling them (addons/admission.py) -----------------------------------------


def bad_request(reason: str) -> Answer:
    return problem(
        400,
        "bad-request",
        "Request cannot be journaled",
        f"{reason}. Nothing was journaled or forwarded; correct the request before sending it again.",
    )


def body_too_large(limit: int, size: int | None = None) -> Answer:
    told = f"of {size} bytes " if size is not None else ""
    return problem(
        413,
        "body-too-large",
        "Request body too large",
        f"The request body {told}is over the proxy's limit of {limit} bytes (proxy.max_body); it was not journaled "
        "or forwarded.",
        max_body=limit,
    )


def forbidden_destination(what: str) -> Answer:
    return problem(
        403,
        "forbidden-destination",
        "Destination refused",
        f"The request is addressed to {what}; the proxy does not forward requests to itself. Nothing was forwarded.",
    )
