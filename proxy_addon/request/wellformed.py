"""A journaled request the upstream protocol would not carry (the contract's 400 `bad-request`): named, never with
the value, since it may be a secret. Nothing is journaled for it: it could not be sent. The Admission addon
(addons/admission.py) refuses it before journaling; the agent API's check (agent_api/check.py) says so beforehand.
"""

from urllib.parse import urlsplit

import h11

from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.request.wire import HOP_BY_HOP

_HOP_BY_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)


def bad_request(facts: RequestFacts) -> str | None:
    """Why this journaled request cannot be sent upstream as HTTP/1.1, naming the part (never a header's value),
    or None. It checks what the sender would send: the method, the target and every header it forwards."""
    parts = urlsplit(facts.url)
    if parts.scheme.lower() not in ("http", "https"):
        return f"the URL scheme {parts.scheme[:16]!r} is not http or https"
    if not parts.hostname:
        return "the URL names no host"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        target_bytes = target.encode("ascii", "strict")
    except UnicodeEncodeError:
        return "the request target (path or query) is not ASCII; percent-encode it"
    method = facts.method.encode("ascii", "replace")
    forwarded = [(name, value) for name, value in facts.raw_headers if name.lower() not in _HOP_BY_HOP_BYTES]
    if _valid_together(method, target_bytes, forwarded):
        return None  # what h11 checks of each part alone it checks here: none of them is refused alone
    try:
        h11.Request(method=method, target=target_bytes, headers=[(b"host", b"h")])
    except h11.LocalProtocolError:
        return "the method or the request target has characters HTTP/1.1 does not allow"
    for name, value in forwarded:
        fields = [(name, value)] if name.lower() == b"host" else [(b"host", b"h"), (name, value)]
        try:
            h11.Request(method=b"POST", target=b"/", headers=fields)
        except h11.LocalProtocolError:
            return f"the header {_shown(name)} has a name or value HTTP/1.1 does not allow (control characters?)"
    return None


def _valid_together(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether h11 takes the method, the target and all these headers in one request: one check for the usual
    request, where one per part costs a request object each. False may also mean headers refused only together
    (two Host headers, conflicting Content-Lengths): the caller then checks each part alone, and names it."""
    fields = headers if any(name.lower() == b"host" for name, _ in headers) else [(b"host", b"h"), *headers]
    try:
        h11.Request(method=method, target=target, headers=fields)
    except h11.LocalProtocolError:
        return False
    return True


def _shown(name: bytes) -> str:
    text = name.decode("latin-1")
    return repr(text[:64]) if text.isprintable() else ascii(text[:64])
