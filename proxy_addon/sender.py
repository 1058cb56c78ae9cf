"""Sending a journaled write upstream exactly once, and saying precisely how it ended.

Why the addon sends journaled writes itself instead of letting mitmproxy forward them: mitmproxy has no
upstream read timeout, cannot kill a flow that waits for the upstream, and answers its own forwarding
failures with a fixed 502 page. Sending here (one attempt, never retried) gives us a per-host read timeout,
the problem+json answers of the contract, and exact classification by phase: a failure before the
request could be written (bad URL or header, no free connection, connect or TLS handshake failed or
timed out) means nothing reached the upstream; one while or after writing (reset, early close, malformed
answer, read timeout) means the upstream may have acted. Reads (GET, HEAD, OPTIONS) stay on mitmproxy's
own path, untouched.

The client is a small HTTP/1.1 sender on asyncio streams with h11 and a keep-alive pool per origin.
It replaced httpx, whose layers (httpx, httpcore, anyio) cost 2-3 ms of event-loop CPU per request here,
more than the rest of the journaling; this one costs a fraction of that (see README, Performance).
This module is the only one that knows the client.

A pooled keep-alive connection that the upstream closed while idle would fail like "reset after send" and
produce a false outcome_unknown. Before reusing an idle connection the pool checks it: not older than
KEEPALIVE_EXPIRY (well under the idle timeouts servers commonly use), no EOF, reset or stray bytes seen by
the event loop, and its socket not readable (an EOF not delivered yet); otherwise it opens a fresh one.
"""

import asyncio
import select
import ssl
import time
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

import certifi
import h11

KEEPALIVE_EXPIRY = 2.0
READ_CHUNK = 65536
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
class UpstreamAnswer:
    status_code: int
    reason: str
    headers: list[tuple[bytes, bytes]]
    content: bytes


@dataclass(frozen=True)
class SendResult:
    end: SendEnd
    answer: UpstreamAnswer | None = None
    error: str | None = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class TLSSettings:
    insecure: bool = False
    ca_file: str | None = None
    ca_dir: str | None = None


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


class _Connection:
    __slots__ = ("h11", "idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def reusable(self, now: float) -> bool:
        if now - self.idle_since > KEEPALIVE_EXPIRY or self.writer.is_closing():
            return False
        # StreamReader shows no public count of bytes already buffered: an idle connection has none
        if self.reader.at_eof() or self.reader.exception() is not None or len(self.reader._buffer):  # type: ignore[attr-defined]
            return False
        sock = self.writer.get_extra_info("socket")
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError, TypeError):
            return False
        return not readable  # an idle connection has nothing to say: readable means EOF, a reset or garbage

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, data: bytes) -> tuple[UpstreamAnswer, bool]:
        """Write the request, read the whole answer; returns it and whether the connection may be reused."""
        self.writer.write(data)
        await self.writer.drain()
        h = self.h11
        response: h11.Response | None = None
        chunks: list[bytes] = []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                h.receive_data(await self.reader.read(READ_CHUNK))  # b"" at EOF: h11 says if that is an error
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
        reusable = h.our_state is h11.DONE and h.their_state is h11.DONE
        if reusable:
            h.start_next_cycle()
            reusable = h.trailing_data == (b"", False)
        answer = UpstreamAnswer(
            status_code=response.status_code,
            reason=response.reason.decode("latin-1"),
            headers=[(k, v) for k, v in response.headers.raw_items() if k.lower() not in _HOP_BY_HOP_BYTES],
            content=b"".join(chunks),
        )
        return answer, reusable


class UpstreamSender:
    def __init__(self, tls: TLSSettings, max_connections: int = 200):
        self._ssl = _ssl_context(tls)
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._max_idle_per_origin = max_connections

    async def send_once(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        connect_timeout: float,
        read_timeout: float,
    ) -> SendResult:
        """One attempt; the connect timeout bounds getting a connection, the read timeout the whole wait
        for the answer after connecting."""
        started = time.monotonic()
        try:
            origin, request, body = _prepare(method, url, headers, content)
        except (ValueError, h11.LocalProtocolError) as e:
            return SendResult(SendEnd.NOT_SENT, error=_describe(e), elapsed=time.monotonic() - started)
        conn: _Connection | None = None
        written = False
        acquired = False
        try:
            async with asyncio.timeout(connect_timeout):
                await self._slots.acquire()
                acquired = True
                conn = self._checkout(origin)
                if conn is None:
                    conn = await self._connect(origin)
            h = conn.h11
            data = h.send(request) + (h.send(h11.Data(data=body)) if body else b"") + h.send(h11.EndOfMessage())
            written = True  # from here on the upstream may receive the request and act on it
            async with asyncio.timeout(read_timeout):
                answer, reusable = await conn.exchange(data)
        except Exception as e:  # noqa: BLE001 - every failure is classified by when it happened
            if conn is not None:
                conn.close()
            end = classify_exception(e, written)
            if isinstance(e, TimeoutError):
                what = "read timeout" if written else "connect timeout" if acquired else "no free upstream connection"
                e = TimeoutError(f"{what} ({read_timeout if written else connect_timeout:g}s)")
            return SendResult(end, error=_describe(e), elapsed=time.monotonic() - started)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        finally:
            if acquired:
                self._slots.release()
        if reusable:
            self._checkin(origin, conn)
        else:
            conn.close()
        return SendResult(SendEnd.ANSWERED, answer, elapsed=time.monotonic() - started)

    def _checkout(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable(now):
                return conn
            conn.close()
        return None

    def _checkin(self, origin: tuple[str, str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._max_idle_per_origin:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        if scheme == "https":
            reader, writer = await asyncio.open_connection(
                host, port, ssl=self._ssl, server_hostname=host, limit=READ_CHUNK * 4
            )
        else:
            reader, writer = await asyncio.open_connection(host, port, limit=READ_CHUNK * 4)
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _prepare(
    method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes
) -> tuple[tuple[str, str, int], h11.Request, bytes]:
    """Origin, validated request head and body; raises ValueError or h11.LocalProtocolError (nothing sent)."""
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
    request = h11.Request(method=method.encode(), target=target.encode("ascii", "strict"), headers=sendable)
    return (scheme, host, port), request, content


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
