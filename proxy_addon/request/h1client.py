"""HTTP/1.1 upstream connections: one connection's bytes in order, one exchange on it, and the idle pool.

Reuse must never turn into a second send on a guess. A kept-alive connection that the upstream closes while
idle fails exactly like "read the request, then reset" when its close crosses our request on the wire, and
nothing afterwards can tell the two apart. So a connection is used again only while that crossing cannot
happen: idle for less than the host's `upstream_keepalive` (under the common servers' idle timeouts) and than
the upstream's advertised `Keep-Alive: timeout` less KEEPALIVE_MARGIN (its idle clock started before ours,
and our request takes time to reach it), and with nothing pending on it just before the write (an EOF or a
stray byte that has arrived means it is being closed: it is dropped, and a new one made). One request at a
time on a connection, never pipelined. Idle connections are bounded (MAX_IDLE_PER_ORIGIN, each closed when
its bound passes).
"""

import asyncio
import select
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import h11

LINGER = 2.0  # seconds an answered connection waits for the upstream to close first
KEEPALIVE_MARGIN = 1.0  # seconds taken off an upstream's advertised Keep-Alive timeout: more than any round trip
MAX_IDLE_PER_ORIGIN = 16  # idle HTTP/1.1 connections kept per origin; more are closed


class Stream(asyncio.Protocol):
    """One upstream connection's incoming bytes in order: the data first, then the EOF or the error that
    ended it (asyncio's StreamReader raises a stored error before the data buffered ahead of it, which
    would lose an early answer followed by a reset)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self.received = 0  # bytes received since the last `expect_answer`: 0 means no byte of an answer
        self._ended = False  # EOF or connection lost
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self.received += len(data)
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

    def take_buffer(self) -> bytes:
        """What arrived and was not read yet (for the protocol that takes the connection over)."""
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

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def quiet(self) -> bool:
        """Open, and nothing pending on it: no EOF, no error, no stray byte, neither read yet nor waiting in the
        socket (the upstream's idle close may be there before the event loop has seen it)."""
        transport = self.transport
        if self._ended or self._buffer or transport is None or transport.is_closing():
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        try:
            return not poll.poll(0)  # readable: data or EOF; an error or hang-up shows too
        except OSError:
            return False


async def exchange(stream: "Stream", h: h11.Connection, request: list[bytes], idle: float) -> tuple[h11.Response, bytes]:
    """Write the whole request, read the whole answer. The write proceeds in the background (the transport
    flushes it as the upstream takes it) while the answer is read, so an answer that comes early is read.
    Returns the answer's head as received (its Keep-Alive header says how long the connection may idle) and body."""
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
    return response, b"".join(chunks)


@dataclass(eq=False)
class H1Connection:
    """An HTTP/1.1 connection; between writes, since when it has been idle and how long it may stay so."""

    stream: Stream
    uses: int = 0
    idle_since: float = 0.0
    usable_for: float = 0.0
    expiry: asyncio.TimerHandle | None = None

    def settle(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


class IdleConnections:
    """HTTP/1.1 connections at rest, by origin (and TLS settings: one pool per sender), the most recent last.

    A connection is taken only while idle for less than its bound and with nothing pending on it; each is
    closed when its bound passes, and past MAX_IDLE_PER_ORIGIN the oldest is."""

    def __init__(self, clock: Callable[[], float], per_origin: int = MAX_IDLE_PER_ORIGIN):
        self._clock, self._per_origin = clock, per_origin
        self._idle: dict[Hashable, list[H1Connection]] = {}

    def take(self, origin: Hashable) -> H1Connection | None:
        idle = self._idle.get(origin)
        now = self._clock()
        while idle:
            conn = idle.pop()
            conn.settle()
            if now - conn.idle_since < conn.usable_for and conn.stream.quiet():
                return conn
            conn.stream.close()  # idle too long, or the upstream closed it (or sent what no request asked for)
        return None

    def put(self, origin: Hashable, conn: H1Connection, usable_for: float) -> None:
        conn.idle_since, conn.usable_for = self._clock(), usable_for
        idle = self._idle.setdefault(origin, [])
        idle.append(conn)
        if len(idle) > self._per_origin:
            self._drop(origin, idle[0])
        conn.expiry = asyncio.get_running_loop().call_later(usable_for, self._drop, origin, conn)

    def _drop(self, origin: Hashable, conn: H1Connection) -> None:
        conn.settle()
        idle = self._idle.get(origin, [])
        if conn in idle:
            idle.remove(conn)
        conn.stream.close()

    def close(self) -> None:
        for origin, idle in list(self._idle.items()):
            for conn in list(idle):
                self._drop(origin, conn)
        self._idle.clear()


def reusable(h: h11.Connection, stream: Stream) -> bool:
    """Both sides finished this exchange and may go on (no `Connection: close`, no HTTP/1.0, no answer delimited by
    the close), the whole request has left, and nothing came after the answer."""
    return (
        h.our_state is h11.DONE
        and h.their_state is h11.DONE
        and not any(h.trailing_data)
        and stream.unsent == 0
        and stream.quiet()
    )


def usable_for(head: h11.Response, keepalive: float | None) -> float:
    """How long the connection may idle and still be used: `upstream_keepalive`, and less than the upstream's
    advertised `Keep-Alive: timeout=N` by KEEPALIVE_MARGIN (its idle clock started before ours, and our request
    takes time to reach it); 0 when `max=0` says it takes no more requests, or when reuse is off."""
    if keepalive is None:
        return 0.0
    bound = keepalive
    for name, value in head.headers:
        if name != b"keep-alive":  # h11 lower-cases header names
            continue
        for param in value.decode("latin-1").split(","):
            key, _, number = param.strip().partition("=")
            try:
                parsed = float(number.strip().strip('"'))
            except ValueError:
                continue
            if key.strip().lower() == "timeout":
                bound = min(bound, parsed - KEEPALIVE_MARGIN)
            elif key.strip().lower() == "max" and parsed <= 0:
                bound = 0.0
    return max(bound, 0.0)
