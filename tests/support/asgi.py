"""Serving an ASGI application (Starlette, an MCP server, a GraphQL app) with uvicorn on a free loopback port,
in a daemon thread, optionally behind TLS; and a gate that lets a test prove a stream arrives as it is sent."""

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from support.server import free_port

GATE_WAIT = 5.0  # how long a server waits for the client to have seen a piece before it notes it as late


@dataclass
class AsgiServer:
    server: uvicorn.Server
    thread: threading.Thread
    port: int
    scheme: str = "http"

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve_asgi(app: Any, tls_dir: Path | None = None) -> AsgiServer:
    """`app` on 127.0.0.1 at a free port; over TLS with a fresh self-signed certificate when `tls_dir` is given."""
    port = free_port()
    tls: dict[str, Any] = {}
    if tls_dir is not None:
        from support.e2e import self_signed_server_context

        self_signed_server_context(tls_dir)  # writes the certificate and key files
        tls = {"ssl_certfile": str(tls_dir / "upstream-cert.pem"), "ssl_keyfile": str(tls_dir / "upstream-key.pem")}
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **tls)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the ASGI server did not start")
        time.sleep(0.02)
    return AsgiServer(server, thread, port, "https" if tls_dir else "http")


@dataclass
class Gate:
    """A stream in pieces, each sent only once the other side has seen the one before.

    The sender sends piece i, then `sent(i)` waits until the receiver has called `arrived(i)`. Streamed
    through the proxy, each piece reaches the receiver before the next is sent, so nothing is late. Buffered,
    the receiver sees nothing until the end: the sender waits in vain and notes each piece late."""

    pieces: int
    seen: list[threading.Event] = field(default_factory=list)
    late: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen = [threading.Event() for _ in range(self.pieces)]

    def arrived(self, i: int) -> None:
        self.seen[i].set()

    def sent(self, i: int) -> None:
        """Blocking: on a server, run it off the event loop (asyncio.to_thread)."""
        if not self.seen[i].wait(GATE_WAIT):
            self.late.append(i)
