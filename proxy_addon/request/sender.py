"""Sending a journaled write upstream exactly once, and saying precisely how it ended.

Why the addon sends journaled writes itself instead of letting mitmproxy forward them: mitmproxy has no
upstream read timeout, cannot kill a flow that waits for the upstream, and answers its own forwarding
failures with a fixed 502 page. Sending here (one attempt, never retried) gives us per-host timeouts, the
problem+json answers of the contract, and exact classification by phase: a failure before the request could
be written (bad URL or header, no free connection slot, connect or TLS handshake failed or timed out) means
nothing reached the upstream; one while or after writing (reset, early close, malformed answer, timeout)
means the upstream may have acted. Reads (GET, HEAD, OPTIONS) stay on mitmproxy's own path, untouched.

The client is a small sender on asyncio protocols with h11. It replaced httpx, whose layers (httpx, httpcore,
anyio) cost more event-loop CPU per request than the rest of the journaling. No proxy is taken from the
environment; mitmproxy's upstream TLS options are (TLSSettings). This module (with wire.py, what it sends) is the only one
that knows the client.

Timeouts. `upstream_timeout` is an idle timeout: the longest wait for the answer to begin and between two
of its reads (while the request body is still being taken by the upstream, that progress counts too), so an
answer that trickles in slowly but steadily is not cut off. `upstream_deadline`, when set, bounds the whole
exchange, connecting included.

Early answers. The upstream may answer before it has read the whole request (413 for a body too large, 401
for bad credentials) and then close or reset the connection while the body is still being written. The
bytes it sent before the reset are read first (h1client's `Stream` keeps data ahead of the error that followed it), so
a complete answer stands whatever became of the rest of the write.

Connections are reused (`upstream_connections: reuse`, the default): a handshake per write costs one round
trip, two with TLS, and the TLS handshake's CPU, on every write to a remote API. Reuse must never turn into a
second send on a guess, and should not into a false outcome_unknown:
- HTTP/2 (offered by ALPN over TLS, then HTTP/1.1): one connection per origin, shared by concurrent writes as
  streams (h2client.py). HTTP/2 says what HTTP/1.1 cannot: a stream the upstream refused before processing it
  (REFUSED_STREAM, or one above a GOAWAY's last-stream-id) provably was not acted on. That is the one case a
  write is sent again: once, on a new connection, and SendResult.resent says so for the receipt's history; a
  second refusal is not sent again (rejected, not sent: nothing was processed). Every other end without an
  answer is ambiguous, as on HTTP/1.1. A connection idle for `upstream_keepalive` is checked with a PING first
  (nothing is sent on a connection that no longer answers).
- HTTP/1.1 (h1client.py): a connection is used again only while its idle close cannot cross our request (idle
  under `upstream_keepalive` and the upstream's advertised `Keep-Alive: timeout`, nothing pending on it), one
  request at a time, never pipelined. What is left (an upstream that closes early for its own reasons) ends
  like any ambiguous end, as outcome_unknown, never resent; `receipts_reused_connection_unknowns_total` counts
  those that got no byte of an answer on a reused connection, so an operator sees whether reuse costs anything
  on a host and can set `upstream_connections: fresh` there.
- `fresh` is one HTTP/1.1 connection per write: the request says `Connection: close`, and our side closes once
  the upstream has (or after h1client.LINGER), so the TIME_WAIT stays with the upstream rather than using up
  this host's ports. Idle connections are closed with the sender.
"""

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import certifi
import h2.exceptions
import h11

from proxy_addon import metrics
from proxy_addon.request.h1client import H1Connection, IdleConnections, Stream, exchange, reusable, usable_for
from proxy_addon.request.h2client import H2Connection, Refused
from proxy_addon.request.wire import Origin, PreparedRequest, h1_answer, h2_answer, prepare
from proxy_addon.rules.send_result import SendEnd, SendResult, UpstreamResponse


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
    keepalive: float | None = None  # upstream_keepalive: reuse a connection idle less than this; None: one per write


def classify_exception(exc: BaseException, may_be_written: bool) -> SendEnd:
    """Nothing sent, or maybe acted on: the one distinction that decides whether a retry is safe.

    `may_be_written` is False until the first byte of the request is handed to the connection."""
    if not may_be_written:
        return SendEnd.NOT_SENT
    if isinstance(exc, TimeoutError):
        return SendEnd.TIMEOUT
    if isinstance(exc, OSError | EOFError | h11.ProtocolError | h2.exceptions.ProtocolError):
        return SendEnd.RESET
    return SendEnd.ERROR


class Withheld(Exception):
    """The request, or over HTTP/2 the rest of its body, was not written after all: at the last look before its
    first byte (or before a DATA frame), it was no longer this proxy's to send (`may_send`)."""


class _Attempt:
    """What one send has done so far: what decides how a failure is classified and what is left to undo."""

    def __init__(self, timeouts: Timeouts, may_send: Callable[[], bool] | None = None):
        self.timeouts = timeouts
        self.may_send = may_send
        self.acquired = False  # holds a connection slot
        self.written = False  # a byte of the request may have reached the upstream
        self.reused = False
        self.resent: str | None = None
        self.h1: H1Connection | None = None  # the HTTP/1.1 connection in use, to abort on failure

    def last_look(self) -> None:
        """Just before the request's first byte is handed to a connection (after the wait for a slot and the
        connect, which may take up to connect_timeout): Withheld if it may no longer be sent."""
        if self.may_send is not None and not self.may_send():
            raise Withheld("not sent: at the last look before sending, the proxy may have been taken for dead")

    def look_before_data(self) -> None:
        """Before an HTTP/2 DATA frame sent after a wait: a body larger than the stream's flow-control window
        waits for the upstream's window updates, and a proxy frozen meanwhile may have been taken for dead,
        its receipt settled by a read that found nothing. The rest is kept back (the stream reset): the upstream
        never has the whole request. The receipt says outcome_unknown all the same: part of it went out."""
        if self.may_send is not None and not self.may_send():
            raise Withheld("the rest of the body was kept back: the proxy may have been taken for dead while sending it")

    def failed(self, e: Exception, deadline_expired: bool, started: float) -> SendResult:
        end = classify_exception(e, self.written)
        if self.h1 is not None:
            self.h1.stream.abort()
            if self.reused and end != SendEnd.NOT_SENT and self.h1.stream.received == 0:
                metrics.reused_connection_unknown()
        if isinstance(e, TimeoutError):
            e = TimeoutError(_timeout_text(self.timeouts, deadline_expired, self.written, self.acquired))
        error = _describe(e)
        return SendResult(end, error=error, elapsed=time.monotonic() - started, reused=self.reused, resent=self.resent)


class Sender(Protocol):
    """What the request path needs of a sender: one attempt whose ending is classified, and a close at shutdown.
    `UpstreamSender` is the one that reaches the network; tests give the handler one that answers from a script."""

    async def send_once(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        timeouts: Timeouts,
        may_send: Callable[[], bool] | None = None,
    ) -> SendResult: ...

    def close(self) -> None:
        """Close what is idle now; writes in flight finish on their connections."""
        ...

    async def aclose(self) -> None: ...


class UpstreamSender:
    def __init__(self, tls: TLSSettings, max_connections: int = 200, clock: Callable[[], float] = time.monotonic):
        self._tls = tls
        self._ssl = _ssl_context(tls, ["http/1.1"])  # fresh: today's one connection per write, HTTP/1.1
        self._ssl_reuse = _ssl_context(tls, ["h2", "http/1.1"])
        self._slots = asyncio.Semaphore(max_connections)
        self._clock = clock
        self._idle = IdleConnections(clock)
        self._h2: dict[Origin, H2Connection] = {}
        self._connecting: dict[Origin, asyncio.Future[H2Connection | H1Connection]] = {}  # to an origin that speaks h2

    async def send_once(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        timeouts: Timeouts,
        may_send: Callable[[], bool] | None = None,
    ) -> SendResult:
        """One attempt (and, only for a stream the upstream refused unprocessed, one more on a new connection).
        `may_send` is asked last, just before the first byte goes out: False ends it NOT_SENT (Withheld)."""
        started = time.monotonic()
        try:
            request = prepare(method, url, headers, content, keep_alive=timeouts.keepalive is not None)
        except (ValueError, h11.LocalProtocolError) as e:
            return SendResult(SendEnd.NOT_SENT, error=_describe(e), elapsed=time.monotonic() - started)
        attempt = _Attempt(timeouts, may_send)
        try:
            async with asyncio.timeout(timeouts.deadline) as deadline:
                try:
                    answer = await self._send(request, attempt)
                finally:
                    if attempt.acquired:
                        self._slots.release()
        except Exception as e:  # noqa: BLE001 - every failure is classified by when it happened
            return attempt.failed(e, deadline.expired(), started)
        except BaseException:
            if attempt.h1 is not None:
                attempt.h1.stream.abort()
            raise
        elapsed = time.monotonic() - started
        return SendResult(SendEnd.ANSWERED, answer, elapsed=elapsed, reused=attempt.reused, resent=attempt.resent)

    async def _send(self, request: PreparedRequest, attempt: _Attempt) -> UpstreamResponse:
        async with asyncio.timeout(attempt.timeouts.connect):
            await self._slots.acquire()
            attempt.acquired = True
            channel = await self._channel(request.origin, attempt)
        if isinstance(channel, H2Connection):
            return await self._over_h2(channel, request, attempt)
        return await self._over_h1(channel, request, attempt)

    async def _channel(self, origin: Origin, attempt: _Attempt) -> "H2Connection | H1Connection":
        """A connection to send on: the origin's HTTP/2 one (checked with a PING after upstream_keepalive of
        idleness), an idle HTTP/1.1 one fit for reuse, or a new one."""
        keepalive = attempt.timeouts.keepalive
        if keepalive is None:
            return await self._connect(origin, self._ssl)
        shared = self._h2.get(origin)
        fresh_enough = shared is not None and (not shared.idle or self._clock() - shared.idle_since < keepalive)
        if shared is not None and shared.usable and (fresh_enough or await _answers_ping(shared)):
            attempt.reused = True
            return shared
        kept = self._idle.take(origin)
        if kept is not None:
            attempt.reused = True
            return kept
        return await self._connect_shared(origin, shared)

    async def _connect_shared(self, origin: Origin, replaced: H2Connection | None) -> "H2Connection | H1Connection":
        """A new connection. To an origin known to speak HTTP/2 (`replaced` is its last connection), one for all the
        writes that want one at once: a GOAWAY mid-burst would otherwise make a connection per refused stream."""
        if replaced is None:
            return await self._connect(origin, self._ssl_reuse)
        pending = self._connecting.get(origin)
        if pending is None:
            pending = self._connecting[origin] = asyncio.ensure_future(self._connect(origin, self._ssl_reuse))
            pending.add_done_callback(lambda done: self._connecting.pop(origin, None))
            return await asyncio.shield(pending)  # what it made, whatever it speaks
        channel = await asyncio.shield(pending)
        if isinstance(channel, H2Connection) and channel.usable:
            return channel
        return await self._connect(origin, self._ssl_reuse)  # HTTP/1.1 after all: a connection of its own

    async def _over_h1(self, conn: H1Connection, request: PreparedRequest, attempt: _Attempt) -> UpstreamResponse:
        attempt.h1 = conn
        attempt.last_look()
        attempt.written = True  # from here on the upstream may receive the request and act on it
        conn.stream.received = 0
        head, body = await exchange(conn.stream, request.h, request.chunks, attempt.timeouts.idle)
        conn.uses += 1
        attempt.h1 = None
        self._after(request.origin, conn, request.h, head, attempt.timeouts.keepalive)
        return h1_answer(head, body)

    async def _over_h2(self, conn: H2Connection, request: PreparedRequest, attempt: _Attempt) -> UpstreamResponse:
        """One stream; if the upstream refused it unprocessed, once more on a new connection, and no more."""
        attempt.last_look()
        try:
            stream_id = conn.open_stream(request.h2_head, end_stream=not request.content)
        except h2.exceptions.H2Error as e:
            raise ValueError(f"HTTP/2 refused the request's head: {e}") from e  # nothing was sent
        attempt.written = True
        try:
            head, body = await conn.exchange(stream_id, request.content, attempt.timeouts.idle, attempt.look_before_data)
        except Refused as refused:
            if attempt.resent is not None:
                attempt.written = False  # refused twice, processed neither time: not sent
                raise
            attempt.resent = refused.reason
            attempt.written = False
            conn.retire()  # a new connection for the second try, and for the writes after it
            async with asyncio.timeout(attempt.timeouts.connect):
                shared = self._h2.get(request.origin)
                newer = shared is not None and shared is not conn and shared.usable
                channel = shared if newer and shared is not None else await self._connect_shared(request.origin, conn)
            if isinstance(channel, H2Connection):
                return await self._over_h2(channel, request, attempt)
            return await self._over_h1(channel, request, attempt)
        return h2_answer(head, body)

    async def _connect(self, origin: Origin, context: ssl.SSLContext) -> "H2Connection | H1Connection":
        """A new connection; over TLS, HTTP/2 when the upstream chose it by ALPN (it becomes the origin's shared one)."""
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        if scheme != "https":
            _, stream = await loop.create_connection(Stream, host, port)
            return H1Connection(stream)
        transport, stream = await loop.create_connection(Stream, host, port, ssl=context, server_hostname=host)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            return H1Connection(stream)
        conn = H2Connection(self._clock)
        transport.set_protocol(conn)
        conn.connection_made(transport)
        pending = stream.take_buffer()  # what arrived before the switch (the upstream's SETTINGS)
        if pending:
            conn.data_received(pending)
        replaced = self._h2.get(origin)
        self._h2[origin] = conn
        if replaced is not None:
            replaced.retire()
        return conn

    def _after(
        self, origin: Origin, conn: H1Connection, h: h11.Connection, head: h11.Response, keepalive: float | None
    ) -> None:
        """Keep an answered connection for the next write when both sides may go on with it; else close it: now,
        when the upstream would keep it open, or once it has closed its side (the TIME_WAIT stays with it)."""
        if not reusable(h, conn.stream):
            conn.stream.close_when_upstream_has()
            return
        idle_bound = usable_for(head, keepalive)
        if idle_bound > 0:
            self._idle.put(origin, conn, idle_bound)
        else:
            conn.stream.close()

    def close(self) -> None:
        """When the sender is replaced (new TLS settings, a new config): the idle connections closed, the HTTP/2
        ones once their streams in flight have ended."""
        self._idle.close()
        for conn in self._h2.values():
            conn.retire()
        self._h2.clear()

    async def aclose(self) -> None:
        """The addon's `done`: nothing kept past the proxy."""
        self._idle.close()
        for conn in self._h2.values():
            conn.close()
        self._h2.clear()


async def _answers_ping(conn: H2Connection) -> bool:
    """Whether an HTTP/2 connection idle for a while still answers (the caller's connect timeout bounds it)."""
    try:
        await conn.ping()
    except ConnectionError:
        return False
    return True


def _timeout_text(timeouts: Timeouts, deadline_expired: bool, written: bool, acquired: bool) -> str:
    if deadline_expired:
        return f"upstream_deadline passed ({timeouts.deadline:g}s)"
    if written:
        return f"no answer, or no progress in it, for {timeouts.idle:g}s (upstream_timeout)"
    return f"{'connect timeout' if acquired else 'no free upstream connection'} ({timeouts.connect:g}s)"


def _ssl_context(tls: TLSSettings, alpn: list[str]) -> ssl.SSLContext:
    if tls.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=tls.ca_file or certifi.where(), capath=tls.ca_dir)
    ctx.set_alpn_protocols(alpn)
    return ctx


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
