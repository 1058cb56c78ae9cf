"""An HTTP/1.1 relay on 127.0.0.1 in front of a real server (moto, Azurite, a small upstream) that makes the
server's answer get lost after the server has acted: what provokes an SDK's own retry.

For the first `times` requests matching an armed fault's predicate, the relay forwards the request, reads the
real server's whole answer (so the effect has happened), and then, by the fault's kind:
- `DELAY`: holds the answer for `delay` seconds, then sends it (past the SDK's read timeout);
- `RESET`: resets the client's connection (SO_LINGER 0) without answering;
- `ERROR_500`: answers 500 with an empty body (as a load balancer does) instead of the server's answer.
`LOST` is the other ambiguity: the request never reaches the server (held for `delay` seconds, then the client's
connection is reset), which the client cannot tell from a lost answer.
With `next_second`, a reset or a 500 comes only once the wall clock has passed into the next second after the
request arrived: an SDK that signs each attempt with a date to the second (SigV4's `X-Amz-Date`, Azure's
`x-ms-date`) then signs its retry with another date, as any retry a second or more later is. Every other request
passes untouched. `forwarded` counts the requests that reached the real server.

One thread per client connection (h11 parses what the client sends; the server is asked with http.client on a
connection of its own per request); every hold waits on the stop event, so `stop()` ends them at once.
"""

import http.client
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import h11

DELAY = "delay"
RESET = "reset"
ERROR_500 = "500"
KINDS = (DELAY, RESET, ERROR_500)
LOST = "lost"  # not in KINDS: the server never acts, so an SDK's retry is one write
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
MAX_REQUEST = 64 * 1024 * 1024


@dataclass(frozen=True)
class Seen:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]  # lower-case names, in order
    body: bytes
    fault: str | None  # the fault applied to it, if any

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


Predicate = Callable[[str, str, bytes], bool]  # method, target, body


@dataclass
class Fault:
    kind: str
    matches: Predicate
    times: int = 1
    delay: float = 2.0
    next_second: bool = False


@dataclass
class FaultyFront:
    target_port: int
    target_host: str = "127.0.0.1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _busy: int = 0  # requests being relayed (a held answer among them)
    _stop: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _clients: set[socket.socket] = field(default_factory=set)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultyFront":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener, self.port = listener, listener.getsockname()[1]
        self._spawn(self._accept)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close() alone does not
            except OSError:
                pass
            self._listener.close()
        with self._changed:
            clients = list(self._clients)
        for c in clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(5)

    def arm(self, kind: str, matches: Predicate, times: int = 1, delay: float = 2.0, next_second: bool = False) -> Fault:
        """The next `times` requests for which `matches(method, target, body)` holds get this fault."""
        assert kind in (*KINDS, LOST), kind
        fault = Fault(kind, matches, times, delay, next_second)
        with self._changed:
            self._faults.append(fault)
        return fault

    def disarm(self) -> None:
        with self._changed:
            self._faults.clear()

    def count(self, matches: Predicate) -> int:
        """Requests matching `matches` that reached the real server."""
        with self._changed:
            return sum(1 for s in self.seen if matches(s.method, s.target, s.body))

    def matching(self, matches: Predicate) -> list[Seen]:
        with self._changed:
            return [s for s in self.seen if matches(s.method, s.target, s.body)]

    def wait_for(self, matches: Predicate, n: int = 1, timeout: float = 10.0) -> bool:
        """Until at least n matching requests have reached the real server; bounded."""
        with self._changed:
            return self._changed.wait_for(lambda: sum(1 for s in self.seen if matches(s.method, s.target, s.body)) >= n, timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Until no request is being relayed (every held answer delivered or dropped); bounded."""
        with self._changed:
            return self._changed.wait_for(lambda: self._busy == 0, timeout)

    # the relay

    def _spawn(self, target: Callable, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name="faulty-front")
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._changed:
                self._clients.add(conn)
            self._spawn(self._serve, conn)

    def _take_fault(self, method: str, target: str, body: bytes) -> Fault | None:
        with self._changed:
            for fault in self._faults:
                if fault.times > 0 and fault.matches(method, target, body):
                    fault.times -= 1
                    return fault
        return None

    def _serve(self, conn: socket.socket) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
        try:
            while not self._stop.is_set():
                request, body = self._read_request(conn, h)
                if request is None:
                    return
                if not self._relay(conn, h, request, body):
                    return
                if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
                    return
                h.start_next_cycle()
        except (OSError, h11.ProtocolError):
            return
        finally:
            with self._changed:
                self._clients.discard(conn)
            conn.close()

    def _read_request(self, conn: socket.socket, h: h11.Connection) -> tuple[h11.Request | None, bytes]:
        request, chunks = None, []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                data = conn.recv(65536)
                if not data:
                    return None, b""
                h.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    def _relay(self, conn: socket.socket, h: h11.Connection, request: h11.Request, body: bytes) -> bool:
        method, target = request.method.decode(), request.target.decode()
        headers = [(k.decode().lower(), v.decode("latin-1")) for k, v in request.headers]
        arrived = time.time()
        fault = self._take_fault(method, target, body)
        with self._changed:
            self._busy += 1
        try:
            if fault is not None and fault.kind == LOST:
                with self._changed:
                    self.seen.append(Seen(method, target, tuple(headers), body, fault.kind))
                    self._changed.notify_all()
                self._stop.wait(fault.delay)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False  # never forwarded; closed by _serve with an RST
            status, reason, answer_headers, answer = self._ask_server(method, target, request.headers, body)
            with self._changed:
                self.seen.append(Seen(method, target, tuple(headers), body, fault.kind if fault else None))
                self._changed.notify_all()
            if fault is not None and fault.kind == DELAY and self._stop.wait(fault.delay):
                return False
            if fault is not None and fault.next_second and self._stop.wait(max(0.0, math.floor(arrived) + 1 - time.time())):
                return False
            if fault is not None and fault.kind == RESET:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False  # closed by _serve: an RST, no answer
            if fault is not None and fault.kind == ERROR_500:
                status, reason, answer, answer_headers = 500, b"Internal Server Error", b"", []  # as a load balancer's
            answer_headers = [*answer_headers, (b"content-length", str(len(answer)).encode())]
            conn.sendall(h.send(h11.Response(status_code=status, headers=answer_headers, reason=reason)))
            conn.sendall(h.send(h11.Data(data=answer)) + h.send(h11.EndOfMessage()))
            return True
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()

    def _ask_server(self, method: str, target: str, headers: list, body: bytes) -> tuple[int, bytes, list, bytes]:
        server = http.client.HTTPConnection(self.target_host, self.target_port, timeout=30)
        try:
            server.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP and k.lower() != b"content-length":
                    server.putheader(k.decode(), v.decode("latin-1"))
            server.putheader("Content-Length", str(len(body)))
            server.endheaders(body)
            response = server.getresponse()
            answer = response.read()
            kept = [
                (k.lower().encode(), v.encode("latin-1"))
                for k, v in response.getheaders()
                if k.lower().encode() not in HOP_BY_HOP and k.lower() != "content-length"
            ]
            return response.status, response.reason.encode("latin-1"), kept, answer
        finally:
            server.close()


@contextmanager
def fronts_before(ports: dict) -> Iterator[dict]:
    """A started front per name, before the server on its port; all stopped on leaving."""
    started = {name: FaultyFront(port).start() for name, port in ports.items()}
    try:
        yield started
    finally:
        for front in started.values():
            front.stop()
