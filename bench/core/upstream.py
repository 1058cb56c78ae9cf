"""The benchmark's upstream: a fast HTTP/1.1 keep-alive server in raw asyncio, on 127.0.0.1 only.

It answers every request `201 Created` with a small JSON body and keeps the connection open (unless the
client sends `Connection: close`). It runs in its own process so that it does not share a GIL with the
load client, prints `LISTENING <port>` on stdout once it accepts connections, and stops by itself when
its parent dies or after --max-lifetime seconds.

    python bench/core/upstream.py [--port 0] [--max-lifetime 3600] [--tls-cert CERT --tls-key KEY]

With --tls-cert and --tls-key it serves HTTPS (bench/costs/keepalive.py measures TLS connections with it).
"""

import argparse
import asyncio
import contextlib
import os
import signal
import ssl
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.http1 import chunked_end

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


class _Counter:
    n = 0


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        # a bounded loop: each pass consumes one whole request, or returns
        while self.transport is not None and not self.transport.is_closing():
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buf) > MAX_HEAD:
                    self._fail(b"431 Request Header Fields Too Large")
                return
            lines = bytes(self.buf[:head_end]).split(b"\r\n")
            length = 0
            chunked = False
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        self._fail(b"400 Bad Request")
                        return
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"connection" and b"close" in value.lower():
                    close = True
            if length > MAX_BODY:
                self._fail(b"413 Content Too Large")
                return
            if chunked:
                end = chunked_end(self.buf, head_end + 4)
                if end is None:
                    return
            else:
                end = head_end + 4 + length
                if len(self.buf) < end:
                    return
            del self.buf[:end]
            _Counter.n += 1
            body = b'{"id":%d,"ok":true}' % _Counter.n
            self.transport.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                % (len(body), b"Connection: close\r\n" if close else b"", body)
            )
            if close:
                self.transport.close()
                return

    def _fail(self, status: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        self.transport.close()


async def serve(port: int, max_lifetime: float, tls: ssl.SSLContext | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=1024, reuse_address=True, ssl=tls)
    bound = server.sockets[0].getsockname()[1]
    print(f"LISTENING {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    deadline = loop.time() + max_lifetime
    async with server:
        # bounded: wakes once a second, ends on a signal, when the parent is gone, or at the deadline
        while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-lifetime", type=float, default=3600.0)
    p.add_argument("--tls-cert", help="PEM certificate: serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    args = p.parse_args()
    tls = None
    if args.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    asyncio.run(serve(args.port, args.max_lifetime, tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
