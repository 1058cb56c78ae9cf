"""Loopback plumbing every test server shares: a free port, "is this process listening on it", and a threaded
HTTP server on 127.0.0.1 (optionally behind TLS) that is quiet about clients that went away."""

import json
import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.procfs import process_tree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes in LISTEN on this TCP port (/proc/net/tcp and tcp6: this network namespace)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` (or one it started) listens on this loopback port. `accepts` would be fooled when
    another test's server took the port between `free_port` and this process's bind, which then failed: a
    connection to the port would be answered, by the other server."""
    try:  # cheap first: most calls come before anything listens (reading /proc/net/tcp takes ~10 ms)
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    inodes = _listening_inodes(port)
    for process in process_tree(pid):  # a server may listen in a child: `make run`'s proxy, npm's node
        try:
            fds = os.listdir(f"/proc/{process}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{process}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a proxy killed mid-request, a hang it stopped waiting for): expected here


def send_json(handler: BaseHTTPRequestHandler, status: int, document: Any) -> None:
    """Answer with `document` as JSON; a client that already left only closes the connection."""
    payload = json.dumps(document).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
    except OSError:
        handler.close_connection = True


def serve(
    handler: type[BaseHTTPRequestHandler], port: int = 0, ssl_context: ssl.SSLContext | None = None
) -> tuple[LoopbackServer, threading.Thread]:
    """`handler` served on 127.0.0.1:`port` (0: a free one) in a daemon thread; stop with `stop(server, thread)`."""
    server = LoopbackServer(("127.0.0.1", port), handler)
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def stop(server: ThreadingHTTPServer | None, thread: threading.Thread | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(5)


class Served:
    """Where a server of `serve` listens, for the classes that hold one in `server`."""

    server: ThreadingHTTPServer | None

    @property
    def port(self) -> int:
        assert self.server is not None, "not started"
        return self.server.server_address[1]

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://{self.netloc}"
