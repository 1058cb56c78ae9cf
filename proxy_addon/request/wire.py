"""A journaled write as it goes upstream, and its answer as it comes back, for either protocol: its origin, its
headers less the hop-by-hop ones, its HTTP/1.1 bytes and HTTP/2 head (`prepare`: nothing is sent yet), and the
answer as the rules read it (UpstreamResponse). request/sender.py sends it."""

from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11

from proxy_addon.rules.send_result import UpstreamResponse

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
HOP_BY_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # scheme, host, port


@dataclass
class PreparedRequest:
    """A request ready to go: its origin, its HTTP/1.1 bytes with the h11 connection that will read the answer,
    and its HTTP/2 head."""

    origin: Origin
    h: h11.Connection
    chunks: list[bytes]
    h2_head: list[tuple[bytes, bytes]]
    content: bytes


def prepare(
    method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes, keep_alive: bool = False
) -> PreparedRequest:
    """The request for either protocol; raises ValueError or h11.LocalProtocolError (nothing sent). Without
    `keep_alive` it says `Connection: close`."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or DEFAULT_PORTS[scheme]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sendable = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP_BYTES]
    if not any(k.lower() == b"host" for k, _ in sendable):
        sendable.insert(0, (b"host", parts.netloc.rpartition("@")[2].encode("idna")))
    if content or method.upper() not in ("GET", "HEAD", "OPTIONS", "TRACE"):
        sendable.append((b"content-length", str(len(content)).encode()))
    h2_head = http2_head(method, scheme, target, sendable)
    if not keep_alive:
        sendable.append((b"connection", b"close"))
    h = h11.Connection(h11.CLIENT)  # validates the head (a header value the protocol forbids raises here)
    events: list[h11.Event] = [h11.Request(method=method.encode(), target=target.encode("ascii", "strict"), headers=sendable)]
    if content:
        events.append(h11.Data(data=content))
    events.append(h11.EndOfMessage())
    chunks = [chunk for event in events for chunk in h.send_with_data_passthrough(event) or ()]  # the body not copied
    return PreparedRequest((scheme, host, port), h, chunks, h2_head, content)


def http2_head(method: str, scheme: str, target: str, sendable: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The HTTP/2 head: pseudo-headers first (`Host` becomes `:authority`), names lower-case."""
    authority = next(v for k, v in sendable if k.lower() == b"host")
    pseudo = [(b":method", method.encode()), (b":scheme", scheme.encode()), (b":authority", authority), (b":path", target.encode())]
    return pseudo + [(k.lower(), v) for k, v in sendable if k.lower() != b"host"]


def h1_answer(head: h11.Response, body: bytes) -> UpstreamResponse:
    headers = [(k, v) for k, v in head.headers.raw_items() if k.lower() not in HOP_BY_HOP_BYTES]
    return UpstreamResponse(status_code=head.status_code, reason=head.reason.decode("latin-1"), headers=headers, content=body)


def h2_answer(head: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
    status = int(next(v for k, v in head if k == b":status"))
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    headers = [(k, v) for k, v in head if not k.startswith(b":") and k.lower() not in HOP_BY_HOP_BYTES]
    return UpstreamResponse(status_code=status, reason=reason, headers=headers, content=body)
