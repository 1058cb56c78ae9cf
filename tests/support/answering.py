"""An HTTP/1.1 upstream on 127.0.0.1 (asyncio and h11, on a thread of its own) that answers the way real ones
do, chosen by the request's path, and records every request it received:

- `/gzip/...`, `/br/...`: 201, pretty-printed JSON compressed with that Content-Encoding, two `Link` headers,
  `Vary` and a `Set-Cookie` (a secret header the proxy does not store); `/pretty/...`: the same uncompressed;
- `/secret/...`: 201, gzip-compressed JSON with a `token` field (a secret the proxy must not store);
- `/see-other/...`: 303 with `Location: /things/<n>`; `/found/...`: 302 with a Location;
- `/trickle/...?chunks=N&every=S`: 201 whose chunked body arrives one chunk every S seconds;
- `/early/<status>/...`: answers <status> as soon as it has the head, before reading the body, then closes
  with the body unread (the kernel resets the connection);
- `/hold/<key>/...[?status=S]`: waits until `release(key)`, then answers S (default 201) with JSON;
- `/hold-stream/<key>/...`: 200 with a chunked body whose first chunk comes at once, the rest after `release(key)`;
- anything else: 201 with `{"id": n}`, or `?status=S`.

`idle_timeout` is an upstream that closes keep-alive connections idle that long (as uvicorn or Node.js do):
it closes the connection when no request has begun in that time; a request that crosses the close on the wire
is reset by the kernel, never read. `keep_alive_header` is sent as `Keep-Alive` in every answer. `accepted` and
`open` count its connections (accepted in all; open now), so a test can wait for its idle close, not guess it.
"""

import asyncio
import contextlib
import gzip
import json
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import brotli
import h11


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    body: bytes


@dataclass
class AnsweringUpstream:
    idle_timeout: float | None = None
    keep_alive_header: str | None = None
    seen: list[Seen] = field(default_factory=list)
    accepted: int = 0
    open: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _holds: dict[str, asyncio.Event] = field(default_factory=dict)
    _arrived: threading.Condition = field(default_factory=threading.Condition)
    _next_id: int = 1000
    _stop: asyncio.Event | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "AnsweringUpstream":
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await self._stop.wait()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(10), "the upstream did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            for key in list(self._holds):
                self.release(key)
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)

    def release(self, key: str) -> None:
        """Let every request held under `key` be answered (now, or at once when it comes)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(lambda: self._hold(key).set())

    def _hold(self, key: str) -> asyncio.Event:
        return self._holds.setdefault(key, asyncio.Event())

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s.path.split("?")[0] == path)

    def wait_for(self, path: str, n: int = 1, timeout: float = 10.0) -> bool:
        """Until `n` requests for `path` have arrived (their heads), bounded by `timeout`."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.count(path) >= n, timeout)

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """Until no connection is open (the idle close happened), bounded by `timeout`."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.open == 0, timeout)

    def _count_connection(self, change: int) -> None:
        with self._arrived:
            if change > 0:
                self.accepted += 1
            self.open += change
            self._arrived.notify_all()

    # -- serving ------------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        h = h11.Connection(h11.SERVER)
        self._count_connection(+1)
        try:
            while True:
                request, body = await self._read_request(h, reader)
                if request is None:
                    return
                await self._answer(h, request, body, reader, writer)
                if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                    return
                h.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, TimeoutError):
            return  # TimeoutError: idle for idle_timeout, closed (a request crossing the close is reset unread)
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()
            self._count_connection(-1)

    async def _read_request(
        self, h: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request | None, bytes | None]:
        """The next request's head; its body too, unless the path answers early (then None). Raises TimeoutError
        when no request began within idle_timeout."""
        request: h11.Request | None = None
        index = -1
        chunks: list[bytes] = []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                idle = self.idle_timeout if h.their_state is h11.IDLE and not any(h.trailing_data) else None
                async with asyncio.timeout(idle):
                    data = await reader.read(65536)
                h.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None, None
            if isinstance(event, h11.Request):
                request = event
                index = self._record(event)
                if _path(event).startswith("/early/"):
                    return request, None
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                body = b"".join(chunks)
                with self.lock:
                    self.seen[index] = Seen(self.seen[index].method, self.seen[index].path, body)
                return request, body

    def _record(self, request: h11.Request) -> int:
        """A request has arrived (its head): count it, and wake whoever waits for it."""
        with self._arrived:
            with self.lock:
                self.seen.append(Seen(request.method.decode(), _path(request), b""))
                self._next_id += 1
                index = len(self.seen) - 1
            self._arrived.notify_all()
        return index

    async def _answer(
        self, h: h11.Connection, request: h11.Request, body: bytes | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        url = urlsplit(_path(request))
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        kind = parts[0]
        with self.lock:
            n = self._next_id
        document = {"id": n, "kind": kind, "note": "pretty printed, as many APIs answer"}
        pretty = json.dumps(document, indent=2).encode() + b"\n"
        headers = [(b"Content-Type", b"application/json; charset=utf-8")]
        if kind in ("gzip", "br", "pretty"):
            if kind != "pretty":
                pretty = gzip.compress(pretty) if kind == "gzip" else brotli.compress(pretty)
                headers += [(b"Content-Encoding", kind.encode()), (b"Vary", b"Accept-Encoding")]
            headers += [
                (b"Link", b'</things/1>; rel="first"'),
                (b"Link", b'</things/9>; rel="last"'),
                (b"Set-Cookie", b"session=upstream-cookie-secret"),
                (b"X-Request-Id", f"req-{n}".encode()),
            ]
            return await self._send(h, writer, 201, headers, pretty)
        if kind == "secret":
            secret = gzip.compress(json.dumps({**document, "token": "resp-secret-in-gzip"}, indent=2).encode())
            return await self._send(h, writer, 201, [*headers, (b"Content-Encoding", b"gzip")], secret)
        if kind == "see-other":
            return await self._send(h, writer, 303, [(b"Location", f"/things/{n}".encode())], b"")
        if kind == "found":
            return await self._send(h, writer, 302, [(b"Location", f"/elsewhere/{n}".encode())], b"")
        if kind == "trickle":
            return await self._trickle(h, writer, int(query.get("chunks", ["6"])[0]), float(query.get("every", ["0.5"])[0]))
        if kind == "early":
            status = int(parts[1])
            await self._send(h, writer, status, [*headers, (b"Connection", b"close")], json.dumps({"error": status}).encode())
            await writer.drain()
            writer.close()  # the body is unread: the kernel answers it with a reset
            return
        if kind == "hold-stream":
            writer.write(h.send(h11.Response(status_code=200, headers=[(b"Content-Type", b"text/plain")])))
            writer.write(h.send(h11.Data(data=b"first chunk\n")))
            await writer.drain()
            await self._hold(parts[1]).wait()
            writer.write(h.send(h11.Data(data=b"the rest\n")) + h.send(h11.EndOfMessage()))
            return await writer.drain()
        if kind == "hold":
            await self._hold(parts[1]).wait()
            status = int(query.get("status", ["201"])[0])
            return await self._send(h, writer, status, headers, json.dumps(document).encode())
        return await self._send(h, writer, int(query.get("status", ["201"])[0]), headers, json.dumps(document).encode())

    async def _trickle(self, h: h11.Connection, writer: asyncio.StreamWriter, chunks: int, every: float) -> None:
        writer.write(h.send(h11.Response(status_code=201, headers=[(b"Content-Type", b"application/json")])))
        writer.write(h.send(h11.Data(data=b'{"chunks": [')))
        await writer.drain()
        for i in range(chunks):
            await asyncio.sleep(every)  # the behaviour under test: a slow but steady answer
            writer.write(h.send(h11.Data(data=(b"," if i else b"") + str(i).encode())))
            await writer.drain()
        writer.write(h.send(h11.Data(data=b"]}")) + h.send(h11.EndOfMessage()))
        await writer.drain()

    async def _send(self, h: h11.Connection, writer: asyncio.StreamWriter, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await _send(h, writer, status, [*headers, *self._keep_alive()], body)

    def _keep_alive(self) -> list[tuple[bytes, bytes]]:
        return [] if self.keep_alive_header is None else [(b"Keep-Alive", self.keep_alive_header.encode())]


async def _send(h: h11.Connection, writer: asyncio.StreamWriter, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"Content-Length", str(len(body)).encode())]
    writer.write(h.send(h11.Response(status_code=status, headers=headers)) + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage()))
    await writer.drain()


def _path(request: h11.Request) -> str:
    return request.target.decode()


@dataclass(frozen=True)
class RawAnswer:
    """An answer as it came over the wire: status, headers in order as named, body undecoded."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def raw_exchange(proxy_port: int, method: str, url: str, body: bytes = b"", headers: list[tuple[str, str]] | None = None) -> RawAnswer:
    """One request through the proxy (absolute form), and its answer exactly as the proxy sent it."""
    host = urlsplit(url).netloc
    h = h11.Connection(h11.CLIENT)
    fields = [("Host", host), ("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])]
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=30) as sock:
        sock.sendall(h.send(h11.Request(method=method, target=url, headers=fields)) + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage()))
        status, got, chunks = 0, [], []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                h.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status, got = event.status_code, [(k.decode(), v.decode("latin-1")) for k, v in event.headers.raw_items()]
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return RawAnswer(status, got, b"".join(chunks))
