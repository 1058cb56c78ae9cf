"""An upstream on 127.0.0.1 that records every request it received, and acts as each request asks.

Writes go to `POST /items` with a JSON body `{"tag": T, "mode": M, ...}`: the tag names the intent (the same
tag is the same request body, hence the same fingerprint), the mode says how this upstream ends it:
- `success`: stores the item, answers 201 `{"id", "tag"}`;
- `slow`: stores the item, waits `seconds` (default `slow_seconds`), then answers 201;
- `reset`: stores the item, then resets the connection (the server acted; the client cannot know);
- `reject`: stores nothing, answers 422 (a terminal refusal: a retry is allowed).
Every write is recorded when its body has been read, before the upstream acts on it, with the tag, the
sender's `X-Fault-Send` header (one per client send) and the `Idempotency-Key` the proxy injects (its
operation id). `GET /items/{tag}` reads an item back (200 or 404) after `read_delay` seconds, for the
reconcile worker; reads are recorded apart. Every wait ends when `stop()` is called.
"""

import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.server import Served, send_json, serve, stop

SUCCESS, SLOW, RESET, REJECT = "success", "slow", "reset", "reject"
MODES = (SUCCESS, SLOW, RESET, REJECT)
SEND_HEADER = "X-Fault-Send"
KEY_HEADER = "Idempotency-Key"
MAX_WAIT = 10.0  # no handler waits longer than this, whatever a request asks


@dataclass(frozen=True)
class Reception:
    """One write the upstream received."""

    method: str
    path: str
    tag: str | None
    mode: str | None
    send_id: str | None  # the client's X-Fault-Send
    operation_id: str | None  # the Idempotency-Key the proxy injected: the receipt it was sent under
    at: float  # time.monotonic()


@dataclass(frozen=True)
class Read:
    path: str
    at: float


@dataclass
class RecordingUpstream(Served):
    slow_seconds: float = 1.0
    read_delay: float = 0.0
    idle_timeout: float | None = None  # closes a keep-alive connection idle this long (as servers do)
    receptions: list[Reception] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)
    in_progress: Counter[str] = field(default_factory=Counter)  # writes recorded and not finished yet, by mode
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    _next_id: int = 1000

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> "RecordingUpstream":
        handler = type("RecordingHandler", (_Handler,), {"upstream": self, "timeout": self.idle_timeout})
        self.server, self.thread = serve(handler)
        return self

    def stop(self) -> None:
        self.released.set()
        stop(self.server, self.thread)

    def __enter__(self) -> "RecordingUpstream":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def items_url(self) -> str:
        return f"http://{self.netloc}/items"

    # -- what it saw ----------------------------------------------------------------------------------------

    def received(self) -> list[Reception]:
        with self.lock:
            return list(self.receptions)

    def count(self, tag: str | None = None, mode: str | None = None) -> int:
        with self.lock:
            return sum(1 for r in self.receptions if (tag is None or r.tag == tag) and (mode is None or r.mode == mode))

    def busy(self, mode: str | None = None) -> int:
        """Writes the upstream holds right now (read, not yet answered), of one mode or of all."""
        with self.lock:
            return self.in_progress[mode] if mode else sum(self.in_progress.values())

    def read_count(self, probes: bool = True) -> int:
        """GETs received; without the verifier controls' probes (an item that cannot exist) when `probes` is false."""
        with self.lock:
            return len([r for r in self.reads if probes or "receipts-probe-" not in r.path])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: RecordingUpstream

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        up = self.upstream
        with up.lock:
            up.reads.append(Read(self.path, time.monotonic()))
        if up.read_delay:
            up.released.wait(min(up.read_delay, MAX_WAIT))
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "items":
            with up.lock:
                item = up.items.get(parts[1])
            return self._send(200, item) if item else self._send(404, {"error": "no such item"})
        self._send(404, {"error": "no such route"})

    def _write(self) -> None:
        up = self.upstream
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            document = json.loads(body) if body else {}
        except ValueError:
            document = {}
        document = document if isinstance(document, dict) else {}
        tag, mode = document.get("tag"), document.get("mode", SUCCESS)
        with up.lock:
            up.receptions.append(
                Reception(
                    self.command,
                    self.path,
                    None if tag is None else str(tag),
                    mode,
                    self.headers.get(SEND_HEADER),
                    self.headers.get(KEY_HEADER),
                    time.monotonic(),
                )
            )
            up.in_progress[mode] += 1
            up._next_id += 1
            item = {"id": str(up._next_id), "tag": tag}
            if mode != REJECT and tag is not None:
                up.items[str(tag)] = item
        try:
            if mode == RESET:
                # the request was read and acted on; then the connection is reset: the server may have acted
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if mode == REJECT:
                return self._send(422, {"error": "rejected", "tag": tag})
            if mode == SLOW:
                up.released.wait(min(float(document.get("seconds", up.slow_seconds)), MAX_WAIT))
            self._send(201, item)
        finally:
            with up.lock:
                up.in_progress[mode] -= 1

    do_POST = do_PUT = do_PATCH = do_DELETE = _write

    def _send(self, status: int, document: Any) -> None:
        send_json(self, status, document)
