"""What is a secret, decided here and nowhere else (the contract's "Database" section).

- A **header** is secret when it is `Authorization`, `Proxy-Authorization`, `Cookie` or `Set-Cookie`, when its
  name contains `auth`, `token`, `secret`, `key`, `signature`, `session` or `credential` (case-insensitive), or
  when `redact_headers` names it. `Idempotency-Key` (any name containing `idempotency-key`) is not: it is
  recorded.
- A **field** (a query parameter, a JSON member at any depth, a form field, a multipart part) is secret when its
  name, lower-cased without `_` and `-`, contains `password`, `passwd`, `secret`, `token`, `apikey`,
  `privatekey`, `credential`, `signature`, `cardnumber`, `cvc` or `cvv`, or is exactly `key`, `sig` or `pin`,
  or when `redact_fields` names it (compared the same way).
- **Rotating** secrets change by design within one agent's work: `Cookie`, `Set-Cookie`, `Proxy-Authorization`,
  and headers or fields whose name contains `session`, `csrf`, `xsrf` or `nonce`. They are secret (redacted),
  but count for neither the intent's identity nor the account, so that a resubmission is still recognised.
  Every other secret counts for the identity (its value, through a keyed HMAC: rules/fingerprint.py) and, for a
  header, for the account (rules/account.py).

Everything that stores, shows or logs a request, an answer or an error asks this module: request headers,
query and bodies (rules/fingerprint.py), stored answers (rules/verdicts.py through rules/fingerprint.py), the sender's and the
reconciler's error texts (`error_text`), and the log (`scrub_text`, log.py). `SecretHeaders` and
`SecretFields` are the configured names as HostPolicy holds them; `name in policy.redact_headers` applies the
whole rule, so code that only tests membership gets it too.
"""

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[REDACTED]"

SECRET_HEADER_NAMES = ("authorization", "proxy-authorization", "cookie", "set-cookie")
SECRET_HEADER_PARTS = ("auth", "token", "secret", "key", "signature", "session", "credential")
RECORDED_HEADER_PART = "idempotency-key"  # the agent's key is recorded in its own column, never a credential
ROTATING_HEADER_NAMES = ("cookie", "set-cookie", "proxy-authorization")
ROTATING_PARTS = ("session", "csrf", "xsrf", "nonce")
SECRET_FIELD_PARTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "privatekey",
    "credential",
    "signature",
    "cardnumber",
    "cvc",
    "cvv",
)
SECRET_FIELD_NAMES = ("key", "sig", "pin")
MAX_DEPTH = 100  # a document nested deeper is redacted whole below this depth: its names are not looked at


# -- the rules ----------------------------------------------------------------------------------------------


def field_key(name: str) -> str:
    """A field name as the rules compare it: lower-cased, without `_` and `-` (`client_secret` -> `clientsecret`)."""
    return name.lower().replace("_", "").replace("-", "")


@lru_cache(maxsize=256)
def _configured_fields(extra: frozenset[str]) -> frozenset[str]:
    return frozenset(field_key(name) for name in extra)


@lru_cache(maxsize=256)
def _configured_headers(extra: frozenset[str]) -> frozenset[str]:
    return frozenset(name.lower() for name in extra)


def is_rotating_header(name: str) -> bool:
    n = name.lower()
    return n in ROTATING_HEADER_NAMES or any(p in n for p in ROTATING_PARTS)


@lru_cache(maxsize=4096)
def is_secret_header(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a header's value is a secret (`extra`: the configured `redact_headers`)."""
    n = name.lower()
    if RECORDED_HEADER_PART in n:
        return False
    return (
        n in SECRET_HEADER_NAMES
        or any(p in n for p in SECRET_HEADER_PARTS)
        or is_rotating_header(n)
        or n in _configured_headers(extra)
    )


def counts_for_account(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a header names the agent's account: every secret header but the rotating ones."""
    return is_secret_header(name, extra) and not is_rotating_header(name)


def is_rotating_field(name: str) -> bool:
    k = field_key(name)
    return any(p in k for p in ROTATING_PARTS)


@lru_cache(maxsize=4096)
def is_secret_field(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a query parameter, body field or multipart part holds a secret (`extra`: the configured
    `redact_fields`)."""
    k = field_key(name)
    return (
        k in SECRET_FIELD_NAMES
        or any(p in k for p in SECRET_FIELD_PARTS)
        or any(p in k for p in ROTATING_PARTS)
        or k in _configured_fields(extra)
    )


class SecretHeaders(frozenset[str]):
    """The configured `redact_headers` (lower-cased); `name in it` is `is_secret_header(name, it)`."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and is_secret_header(name, self)


class SecretFields(frozenset[str]):
    """The configured `redact_fields`; `name in it` is `is_secret_field(name, it)`."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and is_secret_field(name, self)


# -- applying them ------------------------------------------------------------------------------------------


def redact_headers(headers: Iterable[tuple[str, str]], extra: frozenset[str] = frozenset()) -> dict[str, str]:
    """A header dict safe to store: a secret header keeps its name, its value is replaced (repeats joined)."""
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        shown = REDACTED if is_secret_header(key, extra) else value
        out[key] = f"{out[key]}, {shown}" if key in out else shown
    return out


def redact_header_list(headers: Iterable[tuple[str, str]], extra: frozenset[str] = frozenset()) -> list[list[str]]:
    """Headers safe to store, in order and as named: a secret one keeps its name with the value replaced."""
    return [[name, REDACTED if is_secret_header(name, extra) else value] for name, value in headers]


def redact_pairs(pairs: Iterable[tuple[str, str]], extra: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Query or form pairs with every secret field's value replaced."""
    return [(k, REDACTED if is_secret_field(k, extra) else v) for k, v in pairs]


def redact_document(value: Any, extra: frozenset[str] = frozenset(), depth: int = 0) -> Any:
    """A parsed JSON document with the value of every secret member replaced, at any depth. Equal to the
    input when nothing in it is secret. Below MAX_DEPTH levels, whatever is left is replaced whole."""
    if depth > MAX_DEPTH and isinstance(value, dict | list):
        return REDACTED
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_field(k, extra) else redact_document(v, extra, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_document(v, extra, depth + 1) for v in value]
    return value


def contains_secret_field(value: Any, extra: frozenset[str] = frozenset(), depth: int = 0) -> bool:
    """Whether a parsed JSON document has a secret member anywhere (or is nested past MAX_DEPTH)."""
    if depth > MAX_DEPTH and isinstance(value, dict | list):
        return True
    if isinstance(value, dict):
        return any(
            (isinstance(k, str) and is_secret_field(k, extra)) or contains_secret_field(v, extra, depth + 1)
            for k, v in value.items()
        )
    if isinstance(value, list):
        return any(contains_secret_field(v, extra, depth + 1) for v in value)
    return False


def redact_url(url: str, extra: frozenset[str] = frozenset()) -> str:
    """A URL safe to show: no userinfo, secret query parameters' values replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub_text(url, extra)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        query = urlencode(redact_pairs(parse_qsl(query, keep_blank_values=True), extra))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# -- free text: errors and log lines ------------------------------------------------------------------------

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#@'\"<>]*@")
_QUERY_PAIR = re.compile(r"([?&;])([^=&;?#\s'\"<>]+)=([^&;#\s'\"<>]*)")
_NAMED_VALUE = re.compile(r"(?m)(^|[\s'\"(\[{,])([A-Za-z0-9][A-Za-z0-9_-]*)(:\s*[^\r\n'\"]*|=[^\s&;,'\"]*)")
_NOT_NAMES = ("error", "exception", "warning")  # `KeyError: ...` is an exception's name, not a header's
_BYTES_LITERAL = re.compile(r"""\bb(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def scrub_text(text: str, extra: frozenset[str] = frozenset()) -> str:
    """Free text (a log line, an error) with URL userinfo, secret query parameters and `Secret-Header: value`
    pairs replaced. A header or field name stays: an error names a header, never its value."""
    if not text or ("@" not in text and "=" not in text and ":" not in text):
        return text  # each pattern below needs one of these: most log values (names, ids) have none
    text = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _QUERY_PAIR.sub(
        lambda m: m.group(0) if not is_secret_field(m.group(2), extra) else f"{m.group(1)}{m.group(2)}={REDACTED}",
        text,
    )
    return _NAMED_VALUE.sub(
        lambda m: m.group(0)
        if m.group(2).lower().endswith(_NOT_NAMES) or not (is_secret_header(m.group(2), extra) or is_secret_field(m.group(2), extra))
        else f"{m.group(1)}{m.group(2)}{m.group(3)[0]}{' ' if m.group(3)[0] == ':' else ''}{REDACTED}",
        text,
    )


@overload
def error_text(text: str) -> str: ...
@overload
def error_text(text: None) -> None: ...
def error_text(text: str | None) -> str | None:
    """An error text as a receipt may keep it (error_message, a transition's detail): `scrub_text`, and every
    bytes literal the error quotes (h11 quotes the header value it refused; a parser the line it could not
    read) replaced, since it is the request's or the answer's own data."""
    if text is None:
        return None
    return scrub_text(_BYTES_LITERAL.sub(REDACTED, text))
