"""A real HTTP/2 upstream over TLS on 127.0.0.1 (asyncio and the `h2` library, on a thread of its own) that can
refuse streams on demand, which general servers do not: the ways an HTTP/2 stream ends, chosen by the path.

- `/refuse/<key>/...?times=N`: the first N streams for <key> are refused (RST_STREAM REFUSED_STREAM) unprocessed;
  later ones are answered;
- `/goaway-below/<key>/...`: the first stream for <key> gets a GOAWAY whose last-stream-id is below it (it was not
  processed), and the connection closes; later ones are answered;
- `/goaway-above/...`: processed, then a GOAWAY whose last-stream-id covers it, and the connection closes unanswered;
- `/goaway-after/...`: processed and answered, then a GOAWAY with it as the last stream;
- `/drain/...`: processed, a GOAWAY covering it (a graceful shutdown), then answered, and the connection closes;
- `/reset-after/...`: processed, then RST_STREAM INTERNAL_ERROR;
- `/hold/<key>/...`: processed, answered once `release(key)` is called;
- anything else: processed, 201 `{"id": n}`.
`goaway_every=N`: after every Nth processed stream on a connection, answered, a GOAWAY with that stream as the last
(the streams after it on that connection are not processed) and the connection closes. `idle_timeout`: a
connection without streams that long gets a GOAWAY and is closed. `processed` lists what it acted on, `refused`
what it turned away; `accepted` and `open` count connections.
"""

import asyncio
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events

from support.e2e import self_signed_server_context

CLOSE_AFTER_GOAWAY = 1.0  # seconds a connection that sent GOAWAY waits for the client to close first


@dataclass(frozen=True)
class Processed:
    path: str
    body: bytes
    connection: int
    idempotency_key: str | None
    at: float  # time.monotonic()


@dataclass
class H2Upstream:
    idle_timeout: float | None = None
    goaway_every: int | None = None
    processed: list[Processed] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    accepted: int = 0
    open: int = 0
    port: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None
    _holds: dict[str, asyncio.Event] = field(default_factory=dict)
    _seen_keys: dict[str, int] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> "H2Upstream":
        context = self_signed_server_context(Path(tempfile.mkdtemp(prefix="h2-upstream-")))
        context.set_alpn_protocols(["h2"])
        ready = threading.Event()

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            server = await self._loop.create_server(lambda: _Connection(self), "127.0.0.1", 0, ssl=context)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await self._stop.wait()
            server.close()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(10), "the HTTP/2 upstream did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)

    def release(self, key: str) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(lambda: self._hold(key).set())

    def _hold(self, key: str) -> asyncio.Event:
        return self._holds.setdefault(key, asyncio.Event())

    def count(self, path: str) -> int:
        with self._changed:
            return sum(1 for p in self.processed if p.path == path)

    def wait_until(self, predicate, timeout: float = 10.0) -> bool:
        """Until `predicate(self)` holds (checked whenever a connection or a stream changes), bounded by `timeout`."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def _note(self, change) -> None:
        with self._changed:
            change()
            self._changed.notify_all()

    def _first(self, key: str) -> int:
        """How many streams for `key` came before this one."""
        seen = self._seen_keys.get(key, 0)
        self._seen_keys[key] = seen + 1
        return seen


class _Connection(asyncio.Protocol):
    def __init__(self, up: H2Upstream):
        self.up = up
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self.heads: dict[int, dict[bytes, bytes]] = {}
        self.bodies: dict[int, bytearray] = {}
        self.served = 0
        self.idle_close: asyncio.TimerHandle | None = None
        self.number = 0
        self.going_away = False
        self.last = 0  # after a GOAWAY, the last stream it processes

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.h2.initiate_connection()
        self.flush()

        def opened() -> None:
            self.up.accepted += 1
            self.up.open += 1
            self.number = self.up.accepted

        self.up._note(opened)
        self.idle_soon()

    def connection_lost(self, exc) -> None:
        self.up._note(lambda: setattr(self.up, "open", self.up.open - 1))

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def idle_soon(self) -> None:
        if self.idle_close is not None:
            self.idle_close.cancel()
        if self.up.idle_timeout is not None and not self.heads:
            self.idle_close = asyncio.get_running_loop().call_later(self.up.idle_timeout, self.goaway, None)

    def goaway(self, last: int | None, close_now: bool = False) -> None:
        """GOAWAY (last: the highest stream it processed, or the last it took), then close: once the client has
        (or after CLOSE_AFTER_GOAWAY), as servers do, or at once (a crash: what was in flight is cut off)."""
        if self.transport is None or self.transport.is_closing() or self.going_away:
            return
        self.going_away = True
        self.last = self.h2.highest_inbound_stream_id if last is None else last
        self.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=last)
        self.flush()
        if close_now:
            self.transport.close()
        else:
            asyncio.get_running_loop().call_later(CLOSE_AFTER_GOAWAY, self.transport.close)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            if not self.going_away:  # after its GOAWAY, h2 takes no frame: what the client still sends is ignored
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.heads[event.stream_id] = dict(event.headers)
                self.bodies[event.stream_id] = bytearray()
                if self.idle_close is not None:
                    self.idle_close.cancel()
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.handle(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.heads.pop(event.stream_id, None)
        self.flush()

    def handle(self, stream_id: int) -> None:
        path = self.heads[stream_id][b":path"].decode()
        if self.going_away and stream_id > self.last:  # as its GOAWAY said: not processed
            self.up._note(lambda: self.up.refused.append(path))
            return None
        url = urlsplit(path)
        parts = url.path.strip("/").split("/")
        kind, key = parts[0], (parts[1] if len(parts) > 1 else "")
        if kind == "refuse" and self.up._first(key) < int(parse_qs(url.query).get("times", ["1"])[0]):
            return self.refuse(stream_id, path)
        if kind == "goaway-below" and self.up._first(key) == 0:
            self.up._note(lambda: self.up.refused.append(path))
            self.heads.pop(stream_id)
            return self.goaway(max(stream_id - 2, 0))
        body = bytes(self.bodies.pop(stream_id))
        key_header = self.heads[stream_id].get(b"idempotency-key")
        seen = Processed(url.path, body, self.number, key_header.decode() if key_header else None, time.monotonic())
        self.up._note(lambda: self.up.processed.append(seen))
        if kind == "goaway-above":
            return self.goaway(stream_id, close_now=True)
        if kind == "drain":  # a graceful shutdown: GOAWAY covering this stream, which is still answered
            self.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=stream_id)
            self.h2.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN  # h2 sends nothing after a GOAWAY
            self.answer(stream_id, then_close=True)
            return None
        if kind == "reset-after":
            self.heads.pop(stream_id)
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return self.idle_soon()
        if kind == "goaway-after":  # answered, then a GOAWAY with it as the last: the streams after it are refused
            self.answer(stream_id)
            return self.goaway(stream_id)
        if kind == "hold":
            asyncio.get_running_loop().create_task(self.answer_when_released(stream_id, key))
            return None
        return self.answer(stream_id)

    def refuse(self, stream_id: int, path: str) -> None:
        self.up._note(lambda: self.up.refused.append(path))
        self.heads.pop(stream_id)
        self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        self.idle_soon()

    async def answer_when_released(self, stream_id: int, key: str) -> None:
        await self.up._hold(key).wait()
        self.answer(stream_id)
        self.flush()

    def answer(self, stream_id: int, then_close: bool = False) -> None:
        self.heads.pop(stream_id, None)
        if self.transport is None or self.transport.is_closing():
            return
        body = json.dumps({"id": stream_id, "connection": self.number}).encode()
        head = [(b":status", b"201"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        self.h2.send_headers(stream_id, head)
        self.h2.send_data(stream_id, body, end_stream=True)
        self.served += 1
        if then_close:
            self.flush()
            self.transport.close()
            return None
        if self.up.goaway_every is not None and self.served % self.up.goaway_every == 0:
            return self.goaway(stream_id)
        self.idle_soon()
