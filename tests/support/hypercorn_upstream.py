"""hypercorn (HTTP/2 and HTTP/1.1 over TLS, by ALPN) on 127.0.0.1, in a thread of its own, serving a small ASGI
app that records each request's HTTP version and the client port it came from (one port: one connection), once its
whole body arrived; a request cut short before its body's end is recorded apart."""

import asyncio
import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config

from support.e2e import self_signed_server_context
from support.server import free_port


@dataclass(frozen=True)
class Seen:
    path: str
    http_version: str
    client_port: int


@dataclass
class HypercornUpstream:
    keep_alive_timeout: float = 5.0
    hold_until: int = 0  # requests to `/hold/...` wait until this many have arrived
    seen: list[Seen] = field(default_factory=list)  # the requests whose whole body arrived
    cut_short: list[str] = field(default_factory=list)  # the paths of those ended before their body's end
    port: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None
    _all_held: asyncio.Event | None = None

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        with self._changed:
            return len({s.client_port for s in self.seen})

    def wait_cut_short(self, path: str, timeout: float = 10.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: path in self.cut_short, timeout)

    def start(self) -> "HypercornUpstream":
        directory = Path(tempfile.mkdtemp(prefix="hypercorn-"))
        self_signed_server_context(directory)
        config = Config()
        self.port = free_port()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.certfile, config.keyfile = str(directory / "upstream-cert.pem"), str(directory / "upstream-key.pem")
        config.keep_alive_timeout = self.keep_alive_timeout
        config.graceful_timeout = 1.0  # stop() need not wait out a connection the test left open
        config.accesslog = config.errorlog = None
        ready = threading.Event()

        async def main() -> None:
            self._loop, self._stop, self._all_held = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()
            ready.set()
            await serve(self._app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(10), "hypercorn did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (message := await receive()).get("more_body"):
            pass
        if message["type"] == "http.disconnect":  # the client reset the stream (or closed) before the body's end
            with self._changed:
                self.cut_short.append(scope["path"])
                self._changed.notify_all()
            return
        with self._changed:
            self.seen.append(Seen(scope["path"], scope["http_version"], scope["client"][1]))
            held = sum(1 for s in self.seen if s.path.startswith("/hold/"))
            self._changed.notify_all()
        assert self._all_held is not None
        if scope["path"].startswith("/hold/"):
            if held >= self.hold_until:
                self._all_held.set()
            await self._all_held.wait()
        body = json.dumps({"path": scope["path"], "http_version": scope["http_version"]}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
