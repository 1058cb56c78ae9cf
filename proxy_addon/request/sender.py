"""Sending a journaled write upstream exactly once, and saying precisely how it ended.

Why the addon sends journaled writes itself instead of letting mitmproxy forward them: mitmproxy has no
upstream read timeout, cannot kill a flow that waits for the upstream, and answers its own forwarding
failures with a fixed 502 page. Sending here (one attempt, never retried) gives us per-host timeouts, the
problem+json answers of the contract, and exact classification by phase: a failure before the request could
be written (bad URL or header, no free connection slot, connect or TLS handshake failed or timed out) means
nothing reached the upstream; one while or after writing (reset, early close, malformed answer, timeout)
means the upstream may have acted. Reads (GET, HEAD, OPTIONS) stay on mitmproxy's own path, untouched.

The client is a small HTTP/1.1 sender on an asyncio protocol with h11. It replaced httpx, whose layers
(httpx, httpcore, anyio) cost 2-3 ms of event-loop CPU per request here, more than the rest of the
journaling. This module is the only one that knows the client.

Timeouts. `upstream_timeout` is an idle timeout: the longest wait for the answer to begin and between two
of its reads (while the request body is still being taken by the upstream, that progress counts too), so an
answer that trickles in slowly but steadily is not cut off. `upstream_deadline`, when set, bounds the whole
exchange, connecting included.

Early answers. The upstream may answer before it has read the whole request (413 for a body too large, 401
for bad credentials) and then close or reset the connection while the body is still being written. The
bytes it sent before the reset are read first (`_Stream` keeps data ahead of the error that followed it), so
a complete answer stands whatever became of the rest of the write.

One fresh connection per journaled write, no keep-alive pool. A pooled connection that the upstream closed
while idle fails exactly like "read the request, then reset", so reusing one risks a false outcome_unknown
whenever the upstream's idle close crosses our request on the wire; a liveness check before reuse (age, EOF,
readable socket) narrows that window but cannot close it, and upstreams' idle timeouts go down to 1 s and
below. Measured on this machine (2 vCPU, loopback, `bench/keepalive.py --requests 2000 --runs 3`: the
sender's CPU per write in its process, median of 3 runs, the upstream in a process of its own; the proxy as a
whole spends ~3-4 ms of CPU per journaled write):

    upstream  concurrency  kept-alive connection      fresh connection per write
    http      1            0.15 ms CPU, p50 0.18 ms   0.33 ms CPU, p50 0.36 ms
    http      16           0.10 ms CPU                0.23 ms CPU
    https     1            0.12 ms CPU, p50 0.14 ms   1.49 ms CPU, p50 2.18 ms
    https     16           0.26 ms CPU                1.08 ms CPU

So reuse would buy ~0.1-0.2 ms of CPU per write to an http upstream and ~0.8-1.4 ms to an https one (the TLS
handshake; resuming TLS sessions did not reduce it here), plus one round trip (two with TLS) of latency to a
remote upstream. A false outcome_unknown costs a blocked retry and a reconciliation or a person. We pay the
connection. The request says `Connection: close`, and our side closes once the upstream has (or after
LINGER), so the TIME_WAIT stays with the upstream rather than using up this host's ports.
"""

import asyncio
import ssl
import time
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

import certifi
import h11

READ_CHUNK = 65536
LINGER = 2.0  # seconds an answered connection waits for the upstream to close first
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
_HOP_BY_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class SendEnd(StrEnum):
    ANSWERED = "answered"
    NOT_SENT = "not_sent"
    TIMEOUT = "upstream_timeout"
    RESET = "upstream_reset"
    ERROR = "upstream_error"


@dataclass(frozen=True)
class UpstreamResponse:
    status_code: int
    reason: str
    headers: list[tuple[bytes, bytes]]  # as received, less the hop-by-hop ones
    content: bytes  # as received: Content-Encoding not undone


@dataclass(frozen=True)
class SendResult:
    end: SendEnd
    answer: UpstreamResponse | None = None
    error: str | None = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class TLSSettings:
    insecure: bool = False
    ca_file: str | None = None
    ca_dir: str | None = None


@dataclass(frozen=True)
class Timeouts:
    connect: float  # getting a connection slot and connecting (TLS included)
    idle: float  # upstream_timeout: the answer's beginning, and between its reads
    deadline: float | None = None  # upstream_deadline: the whole exchange


def classify_exception(exc: BaseException, may_be_written: bool) -> SendEnd:
    """Nothing sent, or maybe acted on: the one distinction that decides whether a retry is safe.

    `may_be_written` is False until the first byte of the request is handed to the connection."""
    if not may_be_written:
        return SendEnd.NOT_SENT
    if isinstance(exc, TimeoutError):
        return SendEnd.TIMEOUT
    if isinstance(exc, OSError | EOFError | h11.ProtocolError):
        return SendEnd.RESET
    return SendEnd.ERROR


class _Stream(asyncio.Protocol):
    """One upstream connection's incoming bytes in order: the data first, then the EOF or the error that
    ended it (asyncio's StreamReader raises a stored error before the data buffered ahead of it, which
    would lose an early answer followed by a reset)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._ended = False  # EOF or connection lost
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # let the transport close (after flushing what is left to write)

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        if exc is not None and self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def receive(self) -> bytes:
        """What has arrived (waiting for something); b"" once the upstream closed; the error after the data."""
        while not self._buffer:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    @property
    def unsent(self) -> int:
        """Bytes of the request the transport still holds: when it shrinks, the upstream is taking the body."""
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None and not transport.is_closing() else 0

    def close_when_upstream_has(self) -> None:
        """Close once the upstream has closed its side (its EOF makes the transport close), or after LINGER."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._ended:
            transport.close()
        else:
            asyncio.get_running_loop().call_later(LINGER, transport.close)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def _exchange(stream: _Stream, h: h11.Connection, request: list[bytes], idle: float) -> UpstreamResponse:
    """Write the whole request, read the whole answer. The write proceeds in the background (the transport
    flushes it as the upstream takes it) while the answer is read, so an answer that comes early is read."""
    assert stream.transport is not None
    stream.transport.writelines(request)
    response: h11.Response | None = None
    chunks: list[bytes] = []
    unsent = stream.unsent
    while True:
        event = h.next_event()
        if event is h11.NEED_DATA:
            try:
                async with asyncio.timeout(idle):
                    data = await stream.receive()
            except TimeoutError:
                if stream.unsent < unsent:  # no answer yet, but the upstream is still taking the body
                    unsent = stream.unsent
                    continue
                raise
            h.receive_data(data)  # b"" at EOF: h11 says whether that ends the answer or breaks it
            continue
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            chunks.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise h11.RemoteProtocolError("the upstream closed the connection before answering")
        # InformationalResponse (1xx): keep reading
    assert response is not None
    return UpstreamResponse(
        status_code=response.status_code,
        reason=response.reason.decode("latin-1"),
        headers=[(k, v) for k, v in response.headers.raw_items() if k.lower() not in _HOP_BY_HOP_BYTES],
        content=b"".join(chunks),
    )


class UpstreamSender:
    def __init__(self, tls: TLSSettings, max_connections: int = 200):
        self._ssl = _ssl_context(tls)
        self._slots = asyncio.Semaphore(max_connections)

    async def send_once(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes, timeouts: Timeouts
    ) -> SendResult:
        """One attempt on a connection of its own."""
        started = time.monotonic()
        try:
            origin, h, request = _prepare(method, url, headers, content)
        except (ValueError, h11.LocalProtocolError) as e:
            return SendResult(SendEnd.NOT_SENT, error=_describe(e), elapsed=time.monotonic() - started)
        stream: _Stream | None = None
        written = False
        acquired = False
        try:
            async with asyncio.timeout(timeouts.deadline) as deadline:
                try:
                    async with asyncio.timeout(timeouts.connect):
                        await self._slots.acquire()
                        acquired = True
                        stream = await self._connect(origin)
                    written = True  # from here on the upstream may receive the request and act on it
                    answer = await _exchange(stream, h, request, timeouts.idle)
                finally:
                    if acquired:
                        self._slots.release()
        except Exception as e:  # noqa: BLE001 - every failure is classified by when it happened
            if stream is not None:
                stream.abort()
            end = classify_exception(e, written)
            if isinstance(e, TimeoutError):
                e = TimeoutError(_timeout_text(timeouts, deadline.expired(), written, acquired))
            return SendResult(end, error=_describe(e), elapsed=time.monotonic() - started)
        except BaseException:
            if stream is not None:
                stream.abort()
            raise
        stream.close_when_upstream_has()
        return SendResult(SendEnd.ANSWERED, answer, elapsed=time.monotonic() - started)

    async def _connect(self, origin: tuple[str, str, int]) -> _Stream:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        if scheme == "https":
            _, stream = await loop.create_connection(_Stream, host, port, ssl=self._ssl, server_hostname=host)
        else:
            _, stream = await loop.create_connection(_Stream, host, port)
        return stream

    async def aclose(self) -> None:
        """Nothing is kept between writes; here for the addon's `done`."""


def _timeout_text(timeouts: Timeouts, deadline_expired: bool, written: bool, acquired: bool) -> str:
    if deadline_expired:
        return f"upstream_deadline passed ({timeouts.deadline:g}s)"
    if written:
        return f"no answer, or no progress in it, for {timeouts.idle:g}s (upstream_timeout)"
    return f"{'connect timeout' if acquired else 'no free upstream connection'} ({timeouts.connect:g}s)"


def _prepare(
    method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes
) -> tuple[tuple[str, str, int], h11.Connection, list[bytes]]:
    """Origin, the h11 connection that will read the answer, and the request's bytes; raises ValueError or
    h11.LocalProtocolError (nothing sent)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or _DEFAULT_PORTS[scheme]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sendable = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP_BYTES]
    if not any(k.lower() == b"host" for k, _ in sendable):
        sendable.insert(0, (b"host", parts.netloc.rpartition("@")[2].encode("idna")))
    if content or method.upper() not in ("GET", "HEAD", "OPTIONS", "TRACE"):
        sendable.append((b"content-length", str(len(content)).encode()))
    sendable.append((b"connection", b"close"))
    h = h11.Connection(h11.CLIENT)  # validates the head (a header value the protocol forbids raises here)
    events: list[h11.Event] = [h11.Request(method=method.encode(), target=target.encode("ascii", "strict"), headers=sendable)]
    if content:
        events.append(h11.Data(data=content))
    events.append(h11.EndOfMessage())
    chunks = [chunk for event in events for chunk in h.send_with_data_passthrough(event) or ()]  # the body not copied
    return (scheme, host, port), h, chunks


def _ssl_context(tls: TLSSettings) -> ssl.SSLContext:
    if tls.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=tls.ca_file or certifi.where(), capath=tls.ca_dir)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
