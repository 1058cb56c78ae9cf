"""The intent fingerprint: what makes two requests "the same write", and the redacted copy that is stored.

Structured bodies are canonicalised first, so that key order, whitespace and `1` vs `1.0` do not make a
retry look new: JSON (sorted keys, compact, numbers normalised), forms and multipart (pairs sorted).
A body that parses as JSON is treated as JSON whatever its declared type (but multipart).
Anything else, or a body that does not parse as its declared type, is identified by its bytes, with a note;
such an unparsed structured body is stored as the redaction marker alone, as its secret fields cannot be found.
Secret fields are replaced by a marker before anything is hashed or stored.
"""

import hashlib
import json
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl, urlencode

from mitmproxy.net.http.multipart import decode_multipart

from proxy_addon.operations import FingerprintRule

REDACTED = "[REDACTED]"
FINGERPRINT_VERSION = 1


@dataclass(frozen=True)
class BodyIdentity:
    """What of a body counts for the intent, and the redacted form of it that may be stored."""

    kind: str  # json | form | multipart | bytes | empty
    identity: Any  # canonical, redacted structure (or a digest) that goes into the fingerprint
    stored: bytes  # redacted body as it may be written to the database (before the size cap)
    document: Any = None  # the redacted parsed JSON/form document, for rules that read fields
    note: str | None = None


def analyse_body(
    content_type: str | None,
    body: bytes,
    redact_fields: frozenset[str],
    rule: FingerprintRule | None = None,
) -> BodyIdentity:
    if not body:
        return BodyIdentity("empty", None, b"")
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime == "application/json" or mime.endswith("+json"):
        return _json_identity(body, redact_fields, rule)
    if not mime.startswith("multipart/form-data") and body.lstrip()[:1] in (b"{", b"["):
        # JSON undeclared or declared as something else (text/plain; a form, as `curl -d` labels it) is
        # still JSON: canonicalise and redact it rather than store its secrets raw
        sniffed = _json_identity(body, redact_fields, rule)
        if sniffed.kind == "json":
            return sniffed
    if mime == "application/x-www-form-urlencoded":
        return _form_identity(body, redact_fields)
    if mime.startswith("multipart/form-data"):
        return _multipart_identity(content_type or "", body, redact_fields)
    return _bytes_identity(body)


def _bytes_identity(body: bytes, note: str | None = None) -> BodyIdentity:
    return BodyIdentity("bytes", {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}, body, None, note)


def _unparsed_identity(body: bytes, note: str) -> BodyIdentity:
    """A body of a structured type that does not parse: its secret fields cannot be found, so all of it is
    redacted (stored as the marker alone, which also tells the reconciler it cannot be re-sent)."""
    note = f"{note}; stored redacted, its secret fields cannot be found"
    return replace(_bytes_identity(body, note), stored=REDACTED.encode())


def _json_identity(body: bytes, redact_fields: frozenset[str], rule: FingerprintRule | None) -> BodyIdentity:
    try:
        document = json.loads(body, parse_float=Decimal, parse_int=Decimal)
    except (ValueError, RecursionError):
        return _unparsed_identity(body, "body is not valid JSON; fingerprinted as bytes")
    try:
        redacted = redact_document(document, redact_fields)
        stored = canonical_json(redacted).encode()
        identity = _select_fields(redacted, rule)
        canonical_json(identity)  # prove it serialises before it is used as identity
    except RecursionError:
        return _unparsed_identity(body, "JSON body nested too deeply; fingerprinted as bytes")
    return BodyIdentity("json", identity, stored, _plain(redacted))


def _select_fields(document: Any, rule: FingerprintRule | None) -> Any:
    if rule is None:
        return document
    if rule.fields is not None:
        return {p.text: p.find(_plain(document)) for p in rule.fields}
    if rule.exclude:
        import copy

        trimmed = copy.deepcopy(document)
        for p in rule.exclude:
            trimmed = p.compiled.filter(lambda _v: True, trimmed)
        return trimmed
    return document


def _form_identity(body: bytes, redact_fields: frozenset[str]) -> BodyIdentity:
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return _unparsed_identity(body, "form body does not parse; fingerprinted as bytes")
    redacted = [(k, REDACTED if k.lower() in redact_fields else v) for k, v in pairs]
    document: dict[str, Any] = {}
    for k, v in redacted:
        document.setdefault(k, v)
    return BodyIdentity("form", sorted(redacted), urlencode(redacted).encode(), document)


def _multipart_identity(content_type: str, body: bytes, redact_fields: frozenset[str]) -> BodyIdentity:
    try:
        parts = decode_multipart(content_type, body)
    except ValueError:  # a part without the blank line that ends its headers
        parts = []
    if not parts:
        return _unparsed_identity(body, "multipart body does not parse; fingerprinted as bytes")
    identity = []
    for name, value in parts:
        key = name.decode("utf-8", "replace")
        secret = key.lower() in redact_fields
        identity.append([key, REDACTED if secret else hashlib.sha256(value).hexdigest()])
    identity.sort()
    stored = canonical_json({"multipart": identity}).encode()
    return BodyIdentity("multipart", identity, stored, None, "multipart stored as part digests")


def redact_document(value: Any, redact_fields: frozenset[str]) -> Any:
    """Replace every value whose key is a secret field name, at any depth."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if k.lower() in redact_fields else redact_document(v, redact_fields)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_document(v, redact_fields) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, numbers normalised (`1`, `1.0` and `1e0` are one number)."""
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + canonical_json(value[k]) for k in sorted(value, key=str)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float | Decimal):
        return _canonical_number(Decimal(value) if not isinstance(value, float) else Decimal(repr(value)))
    return json.dumps(str(value), ensure_ascii=False)


def _canonical_number(d: Decimal) -> str:
    if not d.is_finite():
        return json.dumps(str(d))
    n = d.normalize()
    if n == n.to_integral_value() and n.adjusted() < 30:
        return str(int(n))
    return str(n).replace("E+", "E")


def _plain(value: Any) -> Any:
    """Decimals back to int/float, for JSON path lookups and templates."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def intent_fingerprint(method: str, host: str, port: int, path: str, query: list[tuple[str, str]], body: BodyIdentity) -> str:
    """`sha256:<hex>` over method, target and the body's identity; the account is kept beside it, not in it."""
    payload = {
        "v": FINGERPRINT_VERSION,
        "method": method.upper(),
        "host": host.lower(),
        "port": port,
        "path": path,
        "query": sorted([k, v] for k, v in query),
        "body": {"kind": body.kind, "identity": body.identity},
    }
    return "sha256:" + hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def redact_query(query: list[tuple[str, str]], redact_fields: frozenset[str]) -> list[tuple[str, str]]:
    return [(k, REDACTED if k.lower() in redact_fields else v) for k, v in query]


def redact_header_list(headers: list[tuple[str, str]], secret_headers: frozenset[str]) -> list[list[str]]:
    """Headers safe to store, in order and as named: a secret one keeps its name with the value replaced."""
    return [[name, REDACTED if name.lower() in secret_headers else value] for name, value in headers]


def redact_headers(headers: list[tuple[str, str]], secret_headers: frozenset[str]) -> dict[str, str]:
    """A header dict safe to store: secret headers keep their name with the value replaced."""
    out: dict[str, str] = {}
    for name, shown in redact_header_list(headers, secret_headers):
        key = name.lower()
        out[key] = f"{out[key]}, {shown}" if key in out else shown
    return out
