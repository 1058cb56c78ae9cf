"""The intent fingerprint: what makes two requests "the same write", and the redacted copy that is stored.

Structured bodies are canonicalised first, so that key order, whitespace and `1` vs `1.0` do not make a
retry look new: JSON (sorted keys, compact, numbers normalised exactly), forms and multipart (pairs sorted).
A body that parses as JSON is treated as JSON whatever its declared type (but multipart).
Anything else, or a body that does not parse as its declared type, is identified by its bytes, with a note;
such an unparsed structured body is stored as the redaction marker alone, as its secret fields cannot be found.

What is a secret is rules/redaction.py's to say. A secret field is replaced by the marker in what is stored, and by
a keyed HMAC of its value (the account key, `keyed`) in what is hashed: the same body with another password
is another intent, and nothing readable or guessable offline is kept. A rotating secret (a nonce, a CSRF or
session token) counts for nothing. Multipart parts are identified by their keyed HMAC too.

Bounded work: the body's bytes stand as its identity (with a note, stored redacted) when canonicalising it
could cost more than a little: a JSON or form body over MAX_CANONICAL_BODY, a number literal longer than
MAX_NUMBER_CHARS, nesting deeper than MAX_JSON_DEPTH. Numbers are canonicalised from their digits, never
expanded (`1e999999` costs what `1e9` does), and never rounded (two 40-digit numbers stay two numbers).
"""

import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl, urlencode

from mitmproxy.net.http.multipart import decode_multipart

from proxy_addon.rules import redaction
from proxy_addon.rules.operations import FingerprintRule
from proxy_addon.rules.redaction import REDACTED
from proxy_addon.rules.signing import NO_SIGNING, Signing, split_pairs

FINGERPRINT_VERSION = 1
MAX_CANONICAL_BODY = 1024 * 1024  # JSON and form bodies longer than this are identified by their bytes
MAX_ITEMS = 50_000  # more members, elements, containers or form fields (counted from the separators): likewise
MAX_NUMBER_CHARS = 256  # a longer number literal: likewise
MAX_JSON_DEPTH = 64  # deeper nesting: likewise

Keyed = Callable[[bytes], str]
"""A keyed digest of a secret's value (AccountHasher.digest): what a secret contributes to the identity."""

_PROCESS_KEY = os.urandom(32)


def process_keyed(data: bytes) -> str:
    """For callers that give no key (tests, tools): a key of this process's own, never stored anywhere."""
    return "hmac:" + hmac.new(_PROCESS_KEY, data, hashlib.sha256).hexdigest()


class _TooComplex(Exception):
    """Canonicalising this body would cost more than a bounded amount of work: why, in a few words."""


@dataclass(frozen=True)
class BodyIdentity:
    """What of a body counts for the intent, and the redacted form of it that may be stored."""

    kind: str  # json | form | multipart | bytes | empty
    identity: Any  # canonical structure (secrets as keyed digests, or a digest of the bytes) for the fingerprint
    stored: bytes  # redacted body as it may be written to the database (before the size cap)
    form: dict[str, Any] | None = None  # a form's fields, redacted
    note: str | None = None
    keyed: "Keyed | None" = field(default=None, compare=False, repr=False)  # for a protocol's own secrets (GraphQL)
    signers: tuple[tuple[str, str], ...] = ()  # a signed form's signer, for the account (rules/signing.py)

    @cached_property
    def document(self) -> Any:
        """The redacted parsed JSON (numbers exact) or form document, for rules and protocols that read fields
        (None for other kinds)."""
        return json.loads(self.stored, parse_float=Decimal) if self.kind == "json" else self.form


def analyse_body(
    content_type: str | None,
    body: bytes,
    redact_fields: frozenset[str],
    rule: FingerprintRule | None = None,
    keyed: Keyed | None = None,
    signing: Signing = NO_SIGNING,
) -> BodyIdentity:
    if not body:
        return BodyIdentity("empty", None, b"")
    keyed = keyed or process_keyed
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime == "application/json" or mime.endswith("+json"):
        return _json_identity(body, redact_fields, rule, keyed)
    if not mime.startswith("multipart/form-data") and body.lstrip()[:1] in (b"{", b"["):
        # JSON undeclared or declared as something else (text/plain; a form, as `curl -d` labels it) is
        # still JSON: canonicalise and redact it rather than store its secrets raw
        sniffed = _json_identity(body, redact_fields, rule, keyed)
        if sniffed.kind == "json" or len(body) > MAX_CANONICAL_BODY or _names_a_secret(body, redact_fields):
            return sniffed  # JSON, or what may be JSON with secrets in it that could not be found: kept redacted
    if mime == "application/x-www-form-urlencoded":
        return _form_identity(body, redact_fields, keyed, signing)
    if mime.startswith("multipart/form-data"):
        return _multipart_identity(content_type or "", body, redact_fields, keyed)
    return _bytes_identity(body)


_QUOTED_NAME = re.compile(rb'"([^"\\\r\n]{1,128})"\s*:')


def _names_a_secret(body: bytes, redact_fields: frozenset[str]) -> bool:
    """Whether text that looks like JSON, and does not parse, has a member named like a secret (`"password":`):
    a truncated or malformed JSON body, whose secret's value must not be stored or digested unkeyed."""
    return any(redaction.is_secret_field(m.decode("utf-8", "replace"), redact_fields) for m in _QUOTED_NAME.findall(body))


def _bytes_identity(body: bytes, note: str | None = None) -> BodyIdentity:
    return BodyIdentity("bytes", {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}, body, None, note)


def _unparsed_identity(body: bytes, note: str, keyed: Keyed) -> BodyIdentity:
    """A body of a structured type that is not canonicalised: its secret fields cannot be found, so all of it
    is redacted (stored as the marker alone, which also tells the reconciler it cannot be re-sent), and its
    bytes count for the identity through the keyed digest (a secret in them cannot be guessed from it)."""
    note = f"{note}; stored redacted, its secret fields cannot be found"
    return BodyIdentity("bytes", {"keyed": keyed(body), "size": len(body)}, REDACTED.encode(), None, note)


def _number(text: str) -> Decimal:
    if len(text) > MAX_NUMBER_CHARS:
        raise _TooComplex(f"a number {len(text)} characters long")
    return Decimal(text)


_JSON = json.JSONDecoder(parse_float=_number)  # once: json.loads builds a decoder per call when given a hook


def too_costly(body: bytes) -> str | None:
    """The cheap pre-check (C-speed scans of the bytes): why canonicalising this JSON or form body could
    cost more than a bounded amount of work, or None."""
    if len(body) > MAX_CANONICAL_BODY:
        return f"over {MAX_CANONICAL_BODY} bytes"
    items = sum(body.count(c) for c in (b",", b":", b"[", b"{", b"&"))
    if items > MAX_ITEMS:
        return f"over {MAX_ITEMS} items"
    return None


def _json_identity(body: bytes, redact_fields: frozenset[str], rule: FingerprintRule | None, keyed: Keyed) -> BodyIdentity:
    costly = too_costly(body)
    if costly:
        return _unparsed_identity(body, f"JSON body {costly}; fingerprinted as bytes", keyed)
    try:
        document = _JSON.decode(body.decode(json.detect_encoding(body), "surrogatepass"))  # json.loads(body), hook kept
    except _TooComplex as e:
        return _unparsed_identity(body, f"JSON body with {e}; fingerprinted as bytes", keyed)
    except RecursionError:
        return _unparsed_identity(body, "JSON body nested too deeply; fingerprinted as bytes", keyed)
    except ValueError as e:  # not JSON, or an integer over Python's 4300 digits
        why = "body is not valid JSON" if "digits" not in str(e) else "JSON body with a number over 4300 digits"
        return _unparsed_identity(body, f"{why}; fingerprinted as bytes", keyed)
    try:
        stored_doc, identity_doc, _secrets = _split_secrets(document, redact_fields, keyed, 0)
        stored = canonical_json(stored_doc).encode()
        identity = _select_fields(identity_doc, rule)
    except (_TooComplex, RecursionError):
        return _unparsed_identity(body, f"JSON body nested over {MAX_JSON_DEPTH} levels; fingerprinted as bytes", keyed)
    return BodyIdentity("json", identity, stored, keyed=keyed)


def _split_secrets(value: Any, redact_fields: frozenset[str], keyed: Keyed, depth: int) -> tuple[Any, Any, bool]:
    """(what is stored, what counts for identity, whether a secret was found): a secret member is the marker
    in the first and its keyed digest in the second (the marker again when it rotates). Containers without a
    secret are the same object in both."""
    if depth > MAX_JSON_DEPTH:
        raise _TooComplex("nesting too deep")
    if isinstance(value, dict):
        stored: dict[str, Any] = {}
        identity: dict[str, Any] = {}
        found = False
        for k, v in value.items():
            if redaction.is_secret_field(k, redact_fields):
                stored[k] = REDACTED
                identity[k] = _secret_identity(k, canonical_json(v).encode(), keyed)
                found = True
            elif isinstance(v, dict | list):
                stored[k], identity[k], inner = _split_secrets(v, redact_fields, keyed, depth + 1)
                found = found or inner
            else:
                stored[k] = identity[k] = v
        return (stored, identity, True) if found else (value, value, False)
    if isinstance(value, list):
        parts = [_split_secrets(v, redact_fields, keyed, depth + 1) if isinstance(v, dict | list) else (v, v, False) for v in value]
        if not any(f for _, _, f in parts):
            return value, value, False
        return [s for s, _, _ in parts], [i for _, i, _ in parts], True
    return value, value, False


def _secret_identity(name: str, value: bytes, keyed: Keyed) -> str:
    """What a secret field's value contributes to the identity: nothing when it rotates, else its keyed digest."""
    return REDACTED if redaction.is_rotating_field(name) else keyed(value)


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


def _form_identity(body: bytes, redact_fields: frozenset[str], keyed: Keyed, signing: Signing) -> BodyIdentity:
    costly = too_costly(body)
    if costly:
        return _unparsed_identity(body, f"form body {costly}; fingerprinted as bytes", keyed)
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return _unparsed_identity(body, "form body does not parse; fingerprinted as bytes", keyed)
    redacted = redaction.redact_pairs(pairs, redact_fields)
    signed = split_pairs(pairs, signing)  # OAuth 1.0a may sign in the form: its signature counts for nothing
    identity = identity_pairs(signed.kept, redact_fields, keyed)
    document: dict[str, Any] = {}
    for k, v in redacted:
        document.setdefault(k, v)
    return BodyIdentity("form", sorted(identity), urlencode(redacted).encode(), document, signers=tuple(signed.signers))


def identity_pairs(pairs: list[tuple[str, str]], redact_fields: frozenset[str], keyed: Keyed) -> list[tuple[str, str]]:
    """Query or form pairs as they count for the identity: a secret's value as its keyed digest."""
    return [
        (k, _secret_identity(k, v.encode("utf-8", "surrogateescape"), keyed) if redaction.is_secret_field(k, redact_fields) else v)
        for k, v in pairs
    ]


def _multipart_identity(content_type: str, body: bytes, redact_fields: frozenset[str], keyed: Keyed) -> BodyIdentity:
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip().strip('"').encode("latin-1", "replace")
    if boundary and body.count(b"--" + boundary) > MAX_ITEMS:
        return _unparsed_identity(body, f"multipart body of over {MAX_ITEMS} parts; fingerprinted as bytes", keyed)
    try:
        parts = decode_multipart(content_type, body)
    except ValueError:  # a part without the blank line that ends its headers
        parts = []
    if not parts:
        return _unparsed_identity(body, "multipart body does not parse; fingerprinted as bytes", keyed)
    identity, stored = [], []
    for name, value in parts:
        key = name.decode("utf-8", "replace")
        secret = redaction.is_secret_field(key, redact_fields)
        digest = _secret_identity(key, value, keyed) if secret else keyed(value)
        identity.append([key, digest])
        stored.append([key, REDACTED if secret else digest])
    identity.sort()
    stored.sort()
    return BodyIdentity(
        "multipart", identity, canonical_json({"multipart": stored}).encode(), None, "multipart stored as keyed part digests"
    )


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, numbers normalised (`1`, `1.0` and `1e0` are one number)."""
    if isinstance(value, str):
        return _dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(_dumps(str(k)) + ":" + canonical_json(value[k]) for k in sorted(value, key=str)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return _dumps(value)
    if isinstance(value, int) and -_SHORT_INT < value < _SHORT_INT:
        return str(value)
    if isinstance(value, int | float | Decimal):
        return _canonical_number(Decimal(value) if not isinstance(value, float) else Decimal(repr(value)))
    return json.dumps(str(value), ensure_ascii=False)


_dumps = json.JSONEncoder(ensure_ascii=False).encode
_SHORT_INT = 10**29  # integers written out in full; larger ones as <digits>E<exponent>


def _canonical_number(d: Decimal) -> str:
    """From the digits, exactly: trailing zeros moved into the exponent (Decimal.normalize would round to 28
    digits), an integer under 30 digits written out, anything else as `<digits>E<exponent>`."""
    if not d.is_finite():
        return json.dumps(str(d))
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    kept = len(digits)
    while kept > 1 and digits[kept - 1] == 0:
        kept -= 1
    if kept == 1 and digits[0] == 0:
        return "0"
    digits, exponent = digits[:kept], exponent + len(digits) - kept
    n = Decimal((sign, digits, exponent))
    if exponent >= 0 and n.adjusted() < 30:
        return str(int(n))
    return str(n).replace("E+", "E")


def _plain(value: Any) -> Any:
    """Decimals back to int/float, for JSON path lookups and templates."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        # from the canonical text: never int() a huge exponent (`1e999999` would become a million digits)
        text = _canonical_number(value)
        return int(text) if text.lstrip("-").isdigit() else float(value)
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
