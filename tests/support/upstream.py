"""A real HTTP upstream on 127.0.0.1 whose paths model what upstreams do, and which records what it received."""

import json
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from support.server import Served, serve, stop


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream(Served):
    server: ThreadingHTTPServer
    thread: threading.Thread
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_id: int = 1000
    gates: dict[str, threading.Event] = field(default_factory=dict)
    absent: str | None = None  # a GET whose path holds this text answers 404; any other path is answered (a catch-all)

    def gate(self, path: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(path, threading.Event())

    def release(self, path: str) -> None:
        """Let every request held at `path` (`/held/...`) be answered: the test says when, not a clock."""
        self.gate(path).set()

    def count(self, method: str | None = None, path: str | None = None) -> int:
        with self.lock:
            return sum(
                1 for r in self.received if (method is None or r.method == method) and (path is None or r.path.split("?")[0] == path)
            )

    def stop(self) -> None:
        stop(self.server, self.thread)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: Upstream
    idle_timeout: float | None = None

    def setup(self) -> None:
        super().setup()
        if self.idle_timeout:
            self.connection.settimeout(self.idle_timeout)

    def log_message(self, *args) -> None:  # quiet
        pass

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._read_body()
        up = self.upstream
        with up.lock:
            up.received.append(Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            up.next_id += 1
            new_id = up.next_id
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        if self.command == "GET" and up.absent is not None and up.absent in url.path:
            return self._send(404, {"error": "no such thing"})
        if parts[0] == "reset":
            # read the request, then reset the connection: the server may have acted
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if parts[0] == "slow":
            time.sleep(float(q.get("seconds", ["5"])[0]))
        if parts[0] == "held":  # answered once the test releases it (bounded, so a test that forgets cannot hang)
            up.gate(url.path).wait(60)
        if parts[0] == "status":
            status = int(parts[1])
            return self._send(status, {"error": f"status {status}"})
        if parts[0] == "location":
            return self._send(201, {"ok": True}, {"Location": f"/things/{new_id}"})
        echo = {}
        try:
            echo = json.loads(body) if body and "json" in (self.headers.get("Content-Type") or "") else {}
        except ValueError:
            pass
        self._send(201 if self.command == "POST" else 200, {"id": new_id, "echo": echo, "token": "resp-secret-token"})

    def _send(self, status: int, document: dict, extra: dict | None = None) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Set-Cookie", "session=upstream-cookie-secret")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET = _handle


def start_upstream(idle_timeout: float | None = None, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> Upstream:
    """On a free port (or `port`), optionally behind TLS."""
    handler = type("Handler", (_Handler,), {"idle_timeout": idle_timeout})
    up = Upstream(*serve(handler, port, ssl_context))
    handler.upstream = up
    return up
