"""The request as journaled, the upstream's stored answer and the reconciler's reads, as people and tools see them.

`RequestView`, `ResponseView` and `BodyView` are the one definition of their public shape: the `request` and
`response` of `receipts show --json` and `GET /receipts/{id}`, and their OpenAPI schemas (admin/openapi.py). The
terminal and the review page show a body through `body_summary` and `fold`: JSON pretty-printed, form fields one
per line, text as it is, "N bytes of binary" otherwise; a long body folded after its first lines.

Nothing here redacts: what is shown is what was stored, and the proxy stored it with its secrets already
replaced by `[REDACTED]` (rules/fingerprint.py), so nothing readable can come out that was not kept.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.rules.records import ApprovalRecord, ReceiptRecord, TransitionRecord

FOLD_LINES = 30  # a body longer than this many lines (or FOLD_CHARS characters) shows its start, the rest folded
FOLD_CHARS = 2000
DEFAULT_PORTS = {"http": 80, "https": 443}
BodyKind = Literal["empty", "json", "form", "text", "binary"]
_KIND_NAMES = {"empty": "no body", "json": "JSON", "form": "form", "text": "text", "binary": "binary"}


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BodyView(_View):
    """A stored body, and what it is: its text and, for JSON or a form, its parsed content."""

    kind: BodyKind = Field(description="json, form, text, binary (not UTF-8 text), or empty")
    size: int | None = Field(description="bytes sent, before the journal's cap; null when not known")
    stored_size: int = Field(description="bytes kept in the journal")
    truncated: bool = Field(description="only the first stored_size bytes were kept (proxy.max_stored_body / max_stored_response)")
    note: str | None = Field(description="how the proxy stored it, when not as sent (e.g. multipart as part digests)")
    text: str | None = Field(description="the stored body as text; null when binary or empty")
    document: Any = Field(description="kind json: the parsed body; otherwise null")
    form: list[tuple[str, str]] | None = Field(description="kind form: its fields in order, as [name, value]; otherwise null")


class RequestView(_View):
    """The request as the proxy journaled it: secrets were redacted before it was stored."""

    method: str
    url: str = Field(description="scheme, host, the port when not the scheme's default, path, and the redacted query")
    headers: dict[str, str] = Field(description="names lower-cased; secret headers keep their name, valued [REDACTED]")
    body: BodyView


class ResponseView(_View):
    """The upstream's answer as stored with the receipt (what a replay sends), redacted like the request."""

    status_code: int | None
    headers: dict[str, str]
    body: BodyView


def netloc(scheme: str, host: str, port: int) -> str:
    """`host`, or `host:port` when the port is not the scheme's default; an IPv6 address in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return shown if DEFAULT_PORTS.get(scheme) == port else f"{shown}:{port}"


def request_url(r: ReceiptRecord | ApprovalRecord) -> str:
    return f"{r.scheme}://{netloc(r.scheme, r.host, r.port)}{r.path}{'?' + r.query if r.query else ''}"


def request_view(r: ReceiptRecord | ApprovalRecord) -> RequestView:
    headers = {str(k): str(v) for k, v in (r.request_headers or {}).items()}
    body = body_view(r.request_body, r.request_body_size, r.request_body_truncated, r.body_note, headers.get("content-type"))
    return RequestView(method=r.method, url=request_url(r), headers=headers, body=body)


def response_view(r: ReceiptRecord) -> ResponseView | None:
    """The stored answer, or None when none was kept (no answer, or one the proxy did not store)."""
    if r.response_headers is None and r.response_body is None:
        return None
    headers: dict[str, str] = {}
    for name, value in r.response_header_pairs():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    stored = r.response_body or b""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    note = None
    if stored and encoding != "identity" and not r.response_body_truncated:
        decoded = _decoded(stored, encoding)
        if decoded is not None:
            stored, note = decoded, f"stored {encoding}-encoded ({len(r.response_body or b'')} bytes), shown decoded"
    size = None if r.response_body_truncated else len(r.response_body or b"")
    body = body_view(stored, size, r.response_body_truncated, note, headers.get("content-type"))
    return ResponseView(status_code=r.status_code, headers=headers, body=body)


def body_view(stored: bytes | None, size: int | None, truncated: bool, note: str | None, content_type: str | None) -> BodyView:
    stored = stored or b""
    common: dict[str, Any] = {"size": size, "stored_size": len(stored), "truncated": truncated, "note": note}
    text = _text(stored, truncated)
    if not stored:
        return BodyView(kind="empty", text=None, document=None, form=None, **common)
    if text is None:
        return BodyView(kind="binary", text=None, document=None, form=None, **common)
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime == "application/json" or mime.endswith("+json") or text.lstrip()[:1] in ("{", "["):  # as rules/fingerprint.py sniffs
        try:
            return BodyView(kind="json", text=text, document=json.loads(text), form=None, **common)
        except ValueError:
            pass
    if mime == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            pairs = []
        if pairs:
            return BodyView(kind="form", text=text, document=None, form=pairs, **common)
    return BodyView(kind="text", text=text, document=None, form=None, **common)


def _text(stored: bytes, truncated: bool) -> str | None:
    """UTF-8 text without control characters (tabs and line breaks aside), or None: binary. A cap may have
    cut the last character in two; that part is dropped."""
    try:
        text = stored.decode("utf-8")
    except UnicodeDecodeError as e:
        if not truncated or e.start < len(stored) - 3:
            return None
        text = stored[: e.start].decode("utf-8")
    if any((ord(c) < 32 and c not in "\t\n\r") or 0x7F <= ord(c) < 0xA0 for c in text):
        return None
    return text


def _decoded(body: bytes, encoding: str) -> bytes | None:
    from mitmproxy.net import encoding as mitm_encoding

    try:
        decoded = mitm_encoding.decode(body, encoding)
    except ValueError:
        return None
    return decoded if isinstance(decoded, bytes) else None


# -- how a body is shown -------------------------------------------------------------------------------------


def body_summary(body: BodyView) -> str:
    """One line: what the body is and how much of it was kept, e.g. `JSON, 52 bytes`."""
    if body.kind == "empty":
        return "no body" if not body.size else f"{body.size} bytes, none of them stored"
    size = body.stored_size if body.size is None else body.size
    parts = [f"{_KIND_NAMES[body.kind]}, {size} bytes"]
    if body.kind == "form" and body.form is not None:
        parts[0] += f", {len(body.form)} field{'' if len(body.form) == 1 else 's'}"
    if body.truncated:
        parts.append(f"only its first {body.stored_size} bytes were stored")
    if body.note:
        parts.append(body.note)
    return "; ".join(parts)


def body_lines(body: BodyView) -> list[str]:
    """The body as lines of text: JSON pretty-printed, form fields `name = value`, text as it is, or
    `N bytes of binary`."""
    if body.kind == "empty":
        return []
    if body.kind == "binary":
        return [f"{body.stored_size if body.size is None else body.size} bytes of binary"]
    if body.kind == "json":
        return json.dumps(body.document, indent=2, ensure_ascii=False).splitlines()
    if body.kind == "form" and body.form is not None:
        return [f"{name} = {value}" for name, value in body.form]
    return (body.text or "").splitlines()


@dataclass(frozen=True)
class Folded:
    """A text cut after its first lines: `head` is shown, `rest` is folded away (empty when nothing is)."""

    head: str
    rest: str

    @property
    def more(self) -> str:
        """How much is folded away: `71 more lines`, or `2096 more characters` of one long line."""
        lines = self.rest.count("\n") + 1
        return f"{lines} more lines" if lines > 1 else f"{len(self.rest)} more characters"


def fold(lines: list[str], max_lines: int = FOLD_LINES, max_chars: int = FOLD_CHARS) -> Folded:
    text = "\n".join(lines)
    head = "\n".join(lines[:max_lines])[:max_chars]
    rest = text[len(head) :]
    return Folded(head, rest[1:] if rest.startswith("\n") else rest)


# -- the reconciler's reads ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """One request the reconciler made to settle a receipt, as its history recorded it."""

    recorded_at: datetime
    to_state: str
    result: str | None
    method: str
    url: str
    status: int | None
    error: str | None
    elapsed_ms: Any
    reason: str | None


def reconcile_reads(history: list[TransitionRecord]) -> list[Read]:
    """Every read (lookup, search page, re-send) recorded in the transitions' details, oldest first."""
    reads = []
    for t in history:
        detail = t.detail or {}
        for value in detail.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict) and "url" in item and "method" in item:
                    reads.append(
                        Read(
                            recorded_at=t.recorded_at,
                            to_state=t.to_state,
                            result=detail.get("result"),
                            method=str(item["method"]),
                            url=str(item["url"]),
                            status=item.get("status"),
                            error=item.get("error"),
                            elapsed_ms=item.get("elapsed_ms"),
                            reason=detail.get("reason"),
                        )
                    )
    return reads
