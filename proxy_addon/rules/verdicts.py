"""From an upstream's answer to a verdict, and what of the answer may be kept for a replay. Pure."""

import json
from typing import Any

from mitmproxy.net import encoding as mitm_encoding

from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import Verdict
from proxy_addon.rules.redaction import error_text, redact_document, redact_header_list
from proxy_addon.rules.send_result import SendEnd, SendResult
from proxy_addon.rules.states import State
from proxy_addon.units import compile_jsonpath

SEE_OTHER = 303


def is_success(status: int) -> bool:
    """2xx, or 303 See Other: the POST/Redirect/GET answer to a write that was made (its Location names what
    was made). Every other 3xx is a rejection: the upstream did not do it here."""
    return 200 <= status < 300 or status == SEE_OTHER


def send_verdict(result: SendResult, policy: HostPolicy, rule: OperationRule | None) -> Verdict:
    """2xx and 303 succeeded; the host's unknown statuses, timeouts and resets outcome_unknown; never-sent and
    every other status rejected. An answer that came before the upstream had read the whole request (an early
    413 or 401, then a reset) is an answer like any other: the sender read it."""
    error = error_text(result.error)  # the one place the sender's error becomes the receipt's: no data it quotes
    if result.end == SendEnd.NOT_SENT:
        return _verdict(State.REJECTED, error_code="not_sent", error_message=error)
    if result.end != SendEnd.ANSWERED or result.answer is None:
        return _verdict(State.OUTCOME_UNKNOWN, error_code=result.end.value, error_message=error)
    status = result.answer.status_code
    if status in policy.unknown_statuses:
        message = f"upstream answered {status}, which may follow a committed write"
        return _verdict(State.OUTCOME_UNKNOWN, status_code=status, error_code="upstream_status", error_message=message)
    if is_success(status):
        return _verdict(State.SUCCEEDED, status_code=status, external_id=extract_external_id(result, rule))
    return _verdict(State.REJECTED, status_code=status, error_code="upstream_status")


def not_sent(who: str, why: str) -> Verdict:
    """A submitted receipt whose request was not sent after all (its journal writer was lost, its caller gave up,
    its agent left): rejected, `not_sent`, so that the retry it invites is journaled rather than refused."""
    return Verdict(State.REJECTED, {"error_code": "not_sent", "error_message": why}, {"who": who, "error": "not_sent"})


def _verdict(
    state: State,
    status_code: int | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
    external_id: str | None = None,
) -> Verdict:
    updates = {"status_code": status_code, "error_code": error_code, "error_message": error_message, "external_id": external_id}
    return Verdict(state, updates)


def extract_external_id(result: SendResult, rule: OperationRule | None) -> str | None:
    if rule is None or rule.external_id is None or result.answer is None:
        return None
    spec = rule.external_id
    if spec.lower().startswith("header:"):
        wanted = spec.split(":", 1)[1].strip().lower().encode()
        for name, value in result.answer.headers:
            if name.lower() == wanted:
                return value.decode("latin-1")
        return None
    document = decoded_json(result)
    if document is None:
        return None
    found = compile_jsonpath(spec).first(document)
    return None if found is None or isinstance(found, dict | list) else str(found)


def decoded_json(result: SendResult) -> Any:
    if result.answer is None:
        return None
    try:
        return json.loads(_decoded_content(result))
    except (ValueError, UnicodeDecodeError):
        return None


def _decoded_content(result: SendResult) -> bytes:
    assert result.answer is not None
    encoding = next((v.decode().lower() for k, v in result.answer.headers if k.lower() == b"content-encoding"), None)
    if not encoding or encoding == "identity":
        return result.answer.content
    decoded = mitm_encoding.decode(result.answer.content, encoding)
    return decoded if isinstance(decoded, bytes) else decoded.encode()


def storable_response(result: SendResult, policy: HostPolicy, cap: int) -> dict[str, Any]:
    """The answer as it may be kept: the receipt's response columns.

    Headers and body exactly as delivered (Content-Encoding and all), so that a replay is the same bytes; the
    secret headers' values are not kept (a replay leaves them out). A JSON answer (once decoded) holding a
    secret field cannot be kept as delivered: its redacted form is stored for people, marked
    `response_body_redacted`, and never replayed; nor is one longer than `cap` (`response_body_truncated`)."""
    assert result.answer is not None
    headers = redact_header_list(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in result.answer.headers], policy.redact_headers
    )
    body = result.answer.content
    redacted = False
    document = decoded_json(result)
    if document is not None:
        cleaned = redact_document(document, policy.redact_fields)
        if cleaned != document:
            body = json.dumps(cleaned, separators=(",", ":")).encode()
            headers = [[k, v] for k, v in headers if k.lower() != "content-encoding"]  # stored decoded
            redacted = True
    return {
        "response_headers": headers,
        "response_body": body[:cap] if body else None,
        "response_body_truncated": len(body) > cap,
        "response_body_redacted": redacted,
    }
