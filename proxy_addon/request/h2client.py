"""An HTTP/2 connection to an upstream, for the sender (request/sender.py says when and why): one multiplexed
connection shared by concurrent writes, each a stream, on the `h2` library mitmproxy itself uses.

What a stream's end says is kept exact. An answer that ended the stream stands, whatever follows it (a reset
after an early answer included). A stream the upstream closed before processing it (REFUSED_STREAM, RFC 9113
8.7; or a stream above a GOAWAY's last-stream-id, 6.8) raises `Refused`: provably not acted on, so the sender
may send it once more. Every other end without an answer (a reset with another code, a GOAWAY that covers the
stream, the connection lost, a protocol error) raises an error the sender classifies as "may have acted".
"""

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

Headers = list[tuple[bytes, bytes]]


class Refused(ConnectionError):
    """The upstream closed the stream before processing it: it may be sent again (`reason` says how)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason  # "refused_stream" | "goaway"


class _Client(h2.connection.H2Connection):
    """h2's client connection, which goes on taking the frames of the streams a graceful GOAWAY still covers (RFC
    9113 6.8: the upstream finishes them); h2 itself would refuse every frame after a GOAWAY."""

    def _receive_goaway_frame(self, frame: Any) -> Any:
        state = self.state_machine.state
        received = super()._receive_goaway_frame(frame)
        if frame.error_code == h2.errors.ErrorCodes.NO_ERROR:
            self.state_machine.state = state
        return received


class _Stream:
    """One request's stream: the answer as it comes, or the error that ended it, and a flag for any progress."""

    def __init__(self) -> None:
        self.head: Headers | None = None
        self.chunks: list[bytes] = []
        self.ended = False  # the answer is complete
        self.error: BaseException | None = None
        self.progress = asyncio.Event()

    def fail(self, error: BaseException) -> None:
        if not self.ended and self.error is None:
            self.error = error
        self.progress.set()

    async def wait(self, idle: float) -> None:
        """Until something happens on the stream (data, a window update, its end), for at most `idle` seconds."""
        async with asyncio.timeout(idle):
            await self.progress.wait()
        self.progress.clear()

    def check(self) -> bool:
        """Whether the answer is complete; raises the error that ended the stream without one."""
        if self.ended:
            return True
        if self.error is not None:
            raise self.error
        return False


class H2Connection(asyncio.Protocol):
    """A client HTTP/2 connection; `usable` while it may take a new stream."""

    def __init__(self, clock: Callable[[], float]):
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = _Client(config)
        self._clock = clock
        self.transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self._pings: dict[bytes, asyncio.Future[None]] = {}
        self.closed = False  # no new stream: GOAWAY received, the connection gone, or retired
        self._retired = False  # closed by us once its last stream ends
        self.idle_since = clock()

    # -- asyncio.Protocol -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._h2.local_settings.enable_push = 0
        self._h2.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._lost(e)
            if self.transport is not None:
                self.transport.abort()
            return
        for event in events:
            self._on(event)
        self._flush()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc or ConnectionResetError("the upstream closed the HTTP/2 connection"))

    # -- events -----------------------------------------------------------------------------------------------

    def _on(self, event: h2.events.Event) -> None:
        stream = self._streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.head = list(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            if stream is not None:
                stream.chunks.append(event.data or b"")
            with contextlib.suppress(h2.exceptions.H2Error):  # a closed stream's data counts for the connection only
                self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.fail(self._reset_error(event, stream))
        elif isinstance(event, h2.events.WindowUpdated) and not event.stream_id:
            for each in self._streams.values():
                each.progress.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event)
        elif isinstance(event, h2.events.PingAckReceived):
            waiter = self._pings.pop(event.ping_data or b"", None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if stream is not None:
            stream.progress.set()

    @staticmethod
    def _reset_error(event: h2.events.StreamReset, stream: _Stream) -> BaseException:
        code = event.error_code
        if code == h2.errors.ErrorCodes.REFUSED_STREAM and stream.head is None:
            return Refused("refused_stream", "the upstream refused the stream before processing it (REFUSED_STREAM)")
        name = code.name if isinstance(code, h2.errors.ErrorCodes) else str(code)
        return ConnectionResetError(f"the upstream reset the stream ({name})")

    def _goaway(self, event: h2.events.ConnectionTerminated) -> None:
        """No new streams. Those above last-stream-id were not processed. Those at or under it may have been: after a
        graceful GOAWAY (NO_ERROR) the upstream finishes them, so they go on (the h2 library would take no frame
        after a GOAWAY: `_Client` keeps its state open, and `closed` keeps new streams off); after an error, they end
        without an answer (outcome unknown)."""
        self.closed = True
        last = event.last_stream_id or 0
        graceful = event.error_code == h2.errors.ErrorCodes.NO_ERROR
        code = event.error_code.name if isinstance(event.error_code, h2.errors.ErrorCodes) else event.error_code
        for stream_id, stream in self._streams.items():
            if stream_id > last:
                stream.fail(Refused("goaway", f"the upstream sent GOAWAY ({code}, last stream {last}) before processing it"))
            elif not graceful:
                stream.fail(ConnectionResetError(f"the upstream sent GOAWAY ({code}, last stream {last}) before answering"))
        self._retired = True  # closed from our side once what it still answers has ended (now, when nothing is)
        if not self._streams:
            self.close()

    def _lost(self, error: BaseException) -> None:
        self.closed = True
        for stream in self._streams.values():
            stream.fail(error)
        for waiter in self._pings.values():
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("the upstream closed the HTTP/2 connection"))
        self._pings.clear()

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- use --------------------------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        return self._h2.open_outbound_streams < self._h2.remote_settings.max_concurrent_streams

    @property
    def idle(self) -> bool:
        return not self._streams

    async def ping(self) -> None:
        """Until the upstream acknowledges a PING: the connection is alive (the caller bounds the wait)."""
        data = os.urandom(8)
        waiter = self._pings[data] = asyncio.get_running_loop().create_future()
        self._h2.ping(data)
        self._flush()
        await waiter

    def open_stream(self, headers: Headers, end_stream: bool) -> int:
        """Send a request's head on a new stream; raises (nothing sent) if h2 refuses the head."""
        stream_id = self._h2.get_next_available_stream_id()
        self._h2.send_headers(stream_id, headers, end_stream=end_stream)
        self._streams[stream_id] = _Stream()
        self._flush()
        return stream_id

    async def exchange(
        self, stream_id: int, body: bytes, idle: float, before_data: Callable[[], None] | None = None
    ) -> tuple[Headers, bytes]:
        """Send the body as flow control allows, read the whole answer; `idle` bounds every wait for progress.
        `before_data` is called before each DATA frame that follows a wait for the upstream's window, and may
        raise to keep the rest of the body back (the stream is then reset: the upstream never has the whole
        request)."""
        stream = self._streams[stream_id]
        try:
            await self._send_body(stream_id, stream, body, idle, before_data)
            while not stream.check():
                await stream.wait(idle)
            assert stream.head is not None
            return stream.head, b"".join(stream.chunks)
        finally:
            del self._streams[stream_id]
            self._end_stream(stream_id, stream)
            if not self._streams:
                self.idle_since = self._clock()
                if self._retired:
                    self.close()

    async def _send_body(
        self, stream_id: int, stream: _Stream, body: bytes, idle: float, before_data: Callable[[], None] | None
    ) -> None:
        view = memoryview(body)
        sent, waited = 0, False
        while sent < len(body):
            if stream.check():
                return  # an early answer: the rest of the body is not needed
            window = min(self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size)
            if window <= 0:
                await stream.wait(idle)  # a window update (or the answer) is progress
                waited = True
                continue
            if waited and before_data is not None:  # between frames sent without a wait, no time passes here
                before_data()
            waited = False
            chunk = view[sent : sent + window]
            sent += len(chunk)
            self._h2.send_data(stream_id, chunk.tobytes(), end_stream=sent == len(body))
            self._flush()

    def _end_stream(self, stream_id: int, stream: _Stream) -> None:
        """A stream still open on our side (a timeout, an early answer) is reset: CANCEL, or NO_ERROR after an answer."""
        if self.closed:
            return
        try:
            if not self._h2.streams.get(stream_id) or self._h2.streams[stream_id].closed:
                return
            code = h2.errors.ErrorCodes.NO_ERROR if stream.ended else h2.errors.ErrorCodes.CANCEL
            self._h2.reset_stream(stream_id, code)
            self._flush()
        except h2.exceptions.H2Error:
            pass

    def retire(self) -> None:
        """No new streams; closed once the streams in flight have ended (another connection takes its place)."""
        self.closed = self._retired = True
        if not self._streams:
            self.close()

    def close(self) -> None:
        """GOAWAY, then close, whatever is in flight (at the proxy's shutdown)."""
        if self.transport is None or self.transport.is_closing():
            return
        self.closed = True
        with contextlib.suppress(h2.exceptions.H2Error):
            self._h2.close_connection()
            self._flush()
        self.transport.close()
