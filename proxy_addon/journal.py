"""From a request to an intent, and from an upstream answer to a verdict: the pure decisions of the proxy.

Nothing here touches the network or the database; the addon calls these and hands the results to the store.
"""

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from mitmproxy.net import encoding as mitm_encoding

from proxy_addon.account import AccountHasher
from proxy_addon.config import HostPolicy, OperationRule, compile_jsonpath
from proxy_addon.fingerprint import REDACTED, analyse_body, intent_fingerprint, redact_document, redact_headers
from proxy_addon.forward import SendEnd, SendResult
from proxy_addon.states import State
from proxy_addon.store import NewIntent, ReceiptRecord

_ID_SEGMENT = re.compile(r"^(\d+|[0-9a-fA-F-]{16,}|[A-Za-z0-9_-]{24,})$")
# Credentials that name an account; session cookies rotate too often to identify one.
_NOT_ACCOUNT_HEADERS = frozenset({"cookie", "set-cookie", "proxy-authorization"})


@dataclass(frozen=True)
class RequestFacts:
    """What the addon read off the flow; the body is the decoded one."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # without the query
    query: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    content_type: str | None
    body: bytes


@dataclass(frozen=True)
class Verdict:
    state: State
    status_code: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    external_id: str | None = None


def split_query(raw_path: str) -> tuple[str, list[tuple[str, str]]]:
    path, _, query = raw_path.partition("?")
    return path or "/", parse_qsl(query, keep_blank_values=True)


def operation_name(facts: RequestFacts, rule: OperationRule | None) -> str:
    """The rule's name, else `METHOD host path-template` with id-like segments shown as `{id}`."""
    if rule is not None:
        return rule.name
    segments = ["{id}" if _ID_SEGMENT.match(s) else s for s in facts.path.split("/")]
    return f"{facts.method} {facts.host} {'/'.join(segments)}"


def build_intent(
    facts: RequestFacts,
    policy: HostPolicy,
    hasher: AccountHasher,
    instance_id: str,
    max_stored_body: int,
    idempotency_key: str | None,
    operation_id: str,
) -> tuple[NewIntent, OperationRule | None]:
    matched = policy.match_operation(facts.method, facts.path)
    rule = matched[0] if matched else None
    body = analyse_body(facts.content_type, facts.body, policy.redact_fields, rule.fingerprint if rule else None)
    query = [(k, REDACTED if k.lower() in policy.redact_fields else v) for k, v in facts.query]
    fingerprint = intent_fingerprint(facts.method, facts.host, facts.port, facts.path, query, body)
    account = hasher.account_of(facts.headers, policy.redact_headers - _NOT_ACCOUNT_HEADERS)
    stored = body.stored
    intent = NewIntent(
        operation_id=operation_id,
        operation=operation_name(facts, rule),
        method=facts.method,
        scheme=facts.scheme,
        host=facts.host.lower(),
        port=facts.port,
        path=facts.path,
        query=urlencode(query) or None,
        intent_fingerprint=fingerprint,
        account=account,
        idempotency_key=idempotency_key,
        request_headers=redact_headers(facts.headers, policy.redact_headers),
        request_body=stored[:max_stored_body] if stored else None,
        request_body_size=len(facts.body),
        request_body_truncated=len(stored) > max_stored_body,
        body_note=body.note,
        proxy_instance=instance_id,
    )
    return intent, rule


def classify_outcome(result: SendResult, policy: HostPolicy, rule: OperationRule | None) -> Verdict:
    """2xx succeeded; the host's unknown statuses, timeouts and resets outcome_unknown; never-sent and
    every other status rejected."""
    if result.end == SendEnd.NOT_SENT:
        return Verdict(State.REJECTED, error_code="not_sent", error_message=result.error)
    if result.end != SendEnd.ANSWERED or result.answer is None:
        return Verdict(State.OUTCOME_UNKNOWN, error_code=result.end.value, error_message=result.error)
    status = result.answer.status_code
    if status in policy.unknown_statuses:
        return Verdict(
            State.OUTCOME_UNKNOWN,
            status_code=status,
            error_code="upstream_status",
            error_message=f"upstream answered {status}, which may follow a committed write",
        )
    if 200 <= status < 300:
        return Verdict(State.SUCCEEDED, status_code=status, external_id=extract_external_id(result, rule))
    return Verdict(State.REJECTED, status_code=status, error_code="upstream_status")


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
    return mitm_encoding.decode(result.answer.content, encoding)


def storable_response(
    result: SendResult, policy: HostPolicy, cap: int
) -> tuple[dict[str, str], bytes | None, bool]:
    """The answer, redacted like a request, as it may be kept for `replay`: (headers, body, truncated)."""
    assert result.answer is not None
    headers = redact_headers(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in result.answer.headers], policy.redact_headers
    )
    body = result.answer.content
    encoded = any(k.lower() == b"content-encoding" for k, _ in result.answer.headers)
    document = None if encoded else decoded_json(result)
    if document is not None:
        body = json.dumps(redact_document(document, policy.redact_fields), separators=(",", ":")).encode()
        headers.pop("content-encoding", None)
    return headers, (body[:cap] if body else None), len(body) > cap


def replayable(original: ReceiptRecord | None) -> bool:
    """Whether a succeeded receipt holds an upstream answer that may be replayed whole. One settled by a
    person or the reconciler holds none (its request ended unknown), and a truncated one is not whole."""
    return (
        original is not None
        and original.response_headers is not None
        and not original.response_body_truncated
        and original.status_code is not None
        and 200 <= original.status_code < 300
    )
