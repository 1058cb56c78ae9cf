"""The reads that settle an unknown outcome: one class per strategy, chosen once by the rule's `strategy`.

Each reads the upstream (never through the proxy) and says what it found (decide.ReadOutcome); only
`resend_with_key` writes, and only the journaled request again, under the idempotency key the upstream honours.
"""

import time
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import httpx

from proxy_addon.exceptions import ReadNotPossibleError, UnreadableRuleError
from proxy_addon.log import get_logger
from proxy_addon.protocols import routing, sse
from proxy_addon.reconcile.aws_sigv4 import SigV4
from proxy_addon.reconcile.azure_shared_key import SharedKey
from proxy_addon.reconcile.decide import Found, ReadOutcome
from proxy_addon.reconcile.rules import (
    candidate_matches,
    expand_env,
    fill_body,
    fill_template,
    netloc_of,
    parse_time,
    request_document,
)
from proxy_addon.request.wire import HOP_BY_HOP
from proxy_addon.rules.fingerprint import canonical_json
from proxy_addon.rules.operations import OperationRule, ReconcileRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.redaction import REDACTED, error_text, redact_url
from proxy_addon.units import AnswerField, compile_jsonpath

log = get_logger("receipts.reconcile")


class RateLimiter(Protocol):
    async def wait(self, host: str) -> None: ...


class Reader:
    """The HTTP client the strategies share for one pass, with the per-host rate limit."""

    def __init__(self, client: httpx.AsyncClient, limiter: RateLimiter):
        self.client = client
        self.limiter = limiter

    async def request(self, host: str, method: str, url: str, what: str, **kwargs: Any) -> tuple[httpx.Response | None, dict[str, Any]]:
        """One request; the evidence records it under `what` (its status, or the error, and how long it took)."""
        await self.limiter.wait(host)
        started = time.monotonic()
        evidence: dict[str, Any] = {what: {"method": method, "url": redact_url(url)}}
        try:
            response = await self.client.request(method, url, **kwargs)
        except Exception as e:  # noqa: BLE001 - httpx.HTTPError, and InvalidURL or anyio's groups, which are not HTTPErrors
            evidence[what].update(error=error_text(f"{type(e).__name__}: {e}")[:300], elapsed_ms=_ms(started))
            return None, evidence
        evidence[what].update(status=response.status_code, elapsed_ms=_ms(started))
        return response, evidence


class Strategy(Protocol):
    async def read(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
    ) -> ReadOutcome: ...


class Lookup:
    """Read one resource: 2xx (and matching) is present, 404/410 absent; for a DELETE, present means not done."""

    def __init__(self, reader: Reader):
        self.reader = reader

    async def read(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
    ) -> ReadOutcome:
        url, kwargs = fill_template(rule.url or "", receipt, params), _read_kwargs(rule, receipt, params)
        response, evidence = await self.reader.request(receipt.host, rule.method, url, "read", **kwargs)
        if response is None:
            return ReadOutcome(Found.FAILED, evidence)
        if response.status_code in (404, 410):
            return ReadOutcome(Found.ABSENT, evidence)
        if not response.is_success:
            return ReadOutcome(Found.FAILED, evidence)
        found_kind = Found.STILL_PRESENT if receipt.method == "DELETE" else Found.PRESENT
        reads_body = bool(rule.match) or any(f is not None and f.header is None for f in (rule.id, rule.time_field))
        document = _json(response) if reads_body else None
        if reads_body and (document is None or _refused(document)):
            evidence["reason"] = _refused(document) or "lookup answer is not JSON"
            return ReadOutcome(Found.FAILED, evidence)
        if rule.match and not candidate_matches(document, request_document(receipt), rule):
            evidence["reason"] = "the resource found does not match the request"
            return ReadOutcome(Found.MISMATCH, evidence)
        if found_kind == Found.PRESENT and not _in_lookup_window(response, document, receipt, rule, evidence):
            return ReadOutcome(Found.MISMATCH, evidence)
        found = _answer_value(rule.id, response, document)
        if found is None or found_kind == Found.STILL_PRESENT:
            return ReadOutcome(found_kind, evidence if found is None else {**evidence, "matched_id": found})
        return ReadOutcome(Found.PRESENT, {**evidence, "matched_id": found}, str(found))


def _answer_value(where: AnswerField | None, response: httpx.Response, document: Any) -> Any:
    if where is None:
        return None
    return response.headers.get(where.header) if where.header else where.first(document)


def _in_lookup_window(response: httpx.Response, document: Any, receipt: ReceiptRecord, rule: ReconcileRule, evidence: dict[str, Any]) -> bool:
    """A resource last changed longer than `window` before or after the submission is not this write's effect (an
    S3 object that was there before, and that a lost PUT did not replace)."""
    if rule.time_field is None:
        return True
    value = _answer_value(rule.time_field, response, document)
    changed = parse_time(value) or (_http_date(value) if isinstance(value, str) else None)
    anchor = receipt.submitted_at or receipt.created_at
    if changed is None:
        evidence["reason"] = f"the resource has no readable {rule.time_field.text}; whose it is is not proven"
        return False
    if abs((changed - anchor).total_seconds()) <= rule.window:
        return True
    evidence["reason"] = f"the resource was last changed at {changed.isoformat()}, not within {rule.window:g}s of the write"
    return False


def _http_date(value: str) -> datetime | None:
    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None


class Search:
    """Read a list, page by page, and compare candidates with the journaled request (docs/configuration.md,
    "How the reconcile worker decides")."""

    def __init__(self, reader: Reader):
        self.reader = reader

    async def read(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
    ) -> ReadOutcome:
        original = request_document(receipt)
        if original is None:
            raise UnreadableRuleError("search needs the original request's JSON body, which was not journaled")
        url, kwargs = fill_template(rule.url or "", receipt, params), _read_kwargs(rule, receipt, params)
        matches: dict[str, Any] = {}  # by id: a record seen on two pages (the list shifted) is one candidate
        reads: list[dict[str, Any]] = []
        origin = urlsplit(url)[:2]
        anchor = receipt.submitted_at or receipt.created_at
        reached_back = False  # with time_field: the list showed a record older than the submission
        next_url: str | None = url
        for _page in range(rule.max_pages):
            if next_url is None:
                break
            response, evidence = await self.reader.request(receipt.host, rule.method, next_url, "read", **kwargs)
            reads.append(evidence["read"])
            if response is None or not response.is_success:
                return ReadOutcome(Found.FAILED, {"reads": reads})
            page = _json(response)
            if _refused(page):
                return ReadOutcome(Found.FAILED, {"reads": reads, "reason": _refused(page)})
            items = rule.items.first(page) if rule.items else page
            if not isinstance(items, list):
                return ReadOutcome(Found.FAILED, {"reads": reads, "reason": "search answer holds no list of items"})
            for c in items:
                created = parse_time(rule.time_field.first(c)) if rule.time_field else None
                reached_back = reached_back or (created is not None and created < anchor)
                if _in_window(c, receipt, rule) and candidate_matches(c, original, rule):
                    found = rule.id.first(c) if rule.id else None
                    matches.setdefault(canonical_json(c) if found is None else str(found), c)
            next_url, kwargs = _next_read(rule, page, next_url, kwargs)
            if next_url is not None and urlsplit(next_url)[:2] != origin:
                # the read's credentials go only where the rule's url points
                return ReadOutcome(Found.FAILED, {"reads": reads, "reason": f"next page {next_url} leaves {origin[1]}"})
        else:
            if next_url is not None:
                return ReadOutcome(Found.FAILED, {"reads": reads, "reason": f"more than {rule.max_pages} pages"})
        ids = [rule.id.first(c) if rule.id else None for c in matches.values()]
        evidence = {"reads": reads, "candidates": [str(i) for i in ids], "matched": len(matches)}
        if matches and receipt.method == "DELETE":
            return ReadOutcome(Found.STILL_PRESENT, evidence)
        if len(matches) == 1:
            return ReadOutcome(Found.PRESENT, {**evidence, "matched_id": ids[0]}, None if ids[0] is None else str(ids[0]))
        if len(matches) > 1:
            return ReadOutcome(Found.AMBIGUOUS, {**evidence, "reason": f"{len(matches)} records match; a person must pick"})
        list_ended = rule.next_page is not None or rule.cursor is not None  # the loop ends here only once no page is left
        if rule.time_field is not None and not reached_back and not list_ended:
            # newer records may have pushed ours off the pages read: that is no proof of absence
            reason = f"the pages read do not reach back to {anchor.isoformat()}; absence not proven (set next_page)"
            return ReadOutcome(Found.FAILED, {**evidence, "reason": reason})
        return ReadOutcome(Found.ABSENT, evidence)


def _next_read(rule: ReconcileRule, page: Any, url: str, kwargs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The next page's read: the URL the page names (`next_page`), or the same read with the page's cursor put into
    its query or body (`cursor`); None when the page is the last."""
    if rule.next_page is not None:
        found_next = rule.next_page.first(page)
        return (urljoin(url, str(found_next)) if found_next else None), kwargs
    cursor = rule.cursor
    if cursor is None or (cursor.more is not None and cursor.more.first(page) is not True):
        return None, kwargs
    value = cursor.value.first(page)
    if cursor.last is not None:
        value = _next_page_number(value, cursor.last.first(page))
    if value is None:
        return None, kwargs
    where, _, name = cursor.into.partition(":")
    if where == "body":
        return url, {**kwargs, "json": {**(kwargs.get("json") or {}), name: value}}
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name] + [(name, str(value))]
    return urlunsplit(parts._replace(query=urlencode(query))), kwargs


def _next_page_number(page: Any, last: Any) -> int | None:
    """The page after `page`, or None past the last. A page without both numbers proves nothing (PocketBase's
    `skipTotal` answers totalPages -1): the read fails rather than end the list early."""
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (page, last)):
        raise ReadNotPossibleError(f"cursor: the page gives no page number and last page (page {page!r}, last {last!r})")
    return page + 1 if page < last else None


def _in_window(candidate: Any, receipt: ReceiptRecord, rule: ReconcileRule) -> bool:
    if rule.time_field is None:
        return True
    created = parse_time(rule.time_field.first(candidate))
    if created is None:
        return True  # a candidate without a time is not ruled out
    anchor = receipt.submitted_at or receipt.created_at
    return abs((created - anchor).total_seconds()) <= rule.window


class ResendWithKey:
    """The one allowed write: the journaled request again, with the idempotency key the upstream honours."""

    def __init__(self, reader: Reader):
        self.reader = reader

    async def read(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
    ) -> ReadOutcome:
        if not policy.inject_idempotency_key or not receipt.idempotency_key:
            raise UnreadableRuleError("resend_with_key needs a host with inject_idempotency_key and a journaled key")
        body = receipt.request_body or b""
        query_values = [v for _k, v in parse_qsl(receipt.query or "", keep_blank_values=True)]
        if receipt.request_body_truncated or REDACTED.encode() in body or REDACTED in query_values:
            raise UnreadableRuleError("the journaled request is truncated or redacted, so it cannot be re-sent exactly")
        if receipt.body_note and "multipart" in receipt.body_note:
            raise UnreadableRuleError("multipart bodies are journaled as digests and cannot be re-sent")
        key_header = policy.idempotency_key_header.lower()
        headers = {
            k: v
            for k, v in (receipt.request_headers or {}).items()
            if v != REDACTED and k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "content-encoding", key_header)
        }
        headers.update(expand_env(rule.headers))
        headers[policy.idempotency_key_header] = receipt.idempotency_key
        url = f"{receipt.scheme}://{netloc_of(receipt)}{receipt.path}" + (f"?{receipt.query}" if receipt.query else "")
        response, evidence = await self.reader.request(
            receipt.host, receipt.method, url, "resend", headers=headers, content=body, timeout=rule.timeout
        )
        evidence["resend"]["idempotency_key"] = receipt.idempotency_key
        if response is None:
            return ReadOutcome(Found.FAILED, evidence)
        if response.is_success:
            found = _external_id(response, op)
            return ReadOutcome(Found.PRESENT, {**evidence, "matched_id": found}, found)
        if response.status_code in policy.unknown_statuses or response.status_code in (408, 409, 425, 429):
            return ReadOutcome(Found.FAILED, evidence)
        evidence["reason"] = f"the upstream refused the re-send with {response.status_code}"
        return ReadOutcome(Found.REFUSED, evidence)


async def read_outcome(
    strategy: Strategy, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
) -> ReadOutcome:
    """One read by the rule, whatever happens: the verdict's read and the verifier controls' reads alike."""
    try:
        return await strategy.read(receipt, op, rule, params, policy)
    except UnreadableRuleError as e:
        return ReadOutcome(Found.REFUSED, {"reason": str(e)})
    except ReadNotPossibleError as e:
        return ReadOutcome(Found.FAILED, {"reason": str(e)})
    except Exception as e:  # noqa: BLE001 - a read that broke proves nothing about the world
        log.error("reconcile_read_broke", operation_id=receipt.operation_id, error=f"{type(e).__name__}: {e}")
        return ReadOutcome(Found.FAILED, {"error": f"{type(e).__name__}: {e}"[:300]})


STRATEGIES: dict[str, type[Lookup] | type[Search] | type[ResendWithKey]] = {
    "lookup": Lookup,
    "search": Search,
    "resend_with_key": ResendWithKey,
}


def _external_id(response: httpx.Response, op: OperationRule) -> str | None:
    if op.external_id is None:
        return None
    if op.external_id.lower().startswith("header:"):
        return response.headers.get(op.external_id.split(":", 1)[1].strip())
    found = compile_jsonpath(op.external_id).first(_json(response))
    return None if found is None else str(found)


def _read_kwargs(rule: ReconcileRule, receipt: ReceiptRecord, params: dict[str, str]) -> dict[str, Any]:
    """The read's headers and, for a POST read, its JSON body (with the headers its protocol asks for)."""
    headers = expand_env(rule.headers)
    kwargs: dict[str, Any] = {"headers": headers, "timeout": rule.timeout}
    if rule.aws_sigv4 is not None:
        kwargs["auth"] = SigV4(rule.aws_sigv4.service, rule.aws_sigv4.region)
    elif rule.azure_shared_key:
        kwargs["auth"] = SharedKey()
    if rule.method == "POST":
        body = fill_body(rule.body, receipt, params) if rule.body is not None else {}
        given = {k.lower() for k in headers}
        headers.update({k: v for k, v in routing.read_headers(body).items() if k.lower() not in given})
        kwargs["json"] = body
    return kwargs


def _json(response: httpx.Response) -> Any:
    """The answer's JSON; from server-sent events (an MCP server's answer), the JSON-RPC response among them."""
    if sse.is_event_stream(response.headers.get("content-type")):
        messages = [m for m in sse.json_messages(response.content) if isinstance(m, dict) and ("result" in m or "error" in m)]
        return messages[-1] if messages else None
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        return None


def _refused(document: Any) -> str | None:
    """Why a 2xx read's answer proves nothing (a JSON-RPC error, GraphQL errors without data, a tool error)."""
    if not isinstance(document, dict):
        return None
    if document.get("jsonrpc") == "2.0" and "error" in document:
        return f"the read was refused: JSON-RPC error {str(document['error'])[:200]}"
    if document.get("errors") and document.get("data") is None:
        return f"the read was refused: GraphQL errors {str(document['errors'])[:200]}"
    result = document.get("result")
    if document.get("jsonrpc") == "2.0" and isinstance(result, dict) and result.get("isError") is True:
        return f"the read was refused: the tool reported an error {str(result.get('content'))[:200]}"
    return None


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
