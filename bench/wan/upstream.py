"""bench/wan/run.py's HTTPS upstream: hypercorn on 127.0.0.1, HTTP/1.1 or HTTP/2 and HTTP/1.1 by ALPN.

    python bench/wan/upstream.py --cert server.pem --key server-key.pem [--alpn h1|h2] [--keep-alive 75]

Answers every request `201 Created` with a small JSON body once it has read the body (a write API's
answer). `--alpn h1` offers only http/1.1; `h2` offers h2 first, then http/1.1 (as most APIs do), so each
client speaks what it prefers. Idle connections are closed after --keep-alive seconds (hypercorn's
`keep_alive_timeout`; 75 s, nginx's default, rather than hypercorn's 5 s). Prints `LISTENING <port>` once it
accepts connections; stops on SIGTERM, when its parent dies, or after --max-lifetime seconds.
"""

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config

_count = 0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _count
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:  # bounded by the request body, which the server limits
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        more = message.get("more_body", False)
    _count += 1
    body = b'{"id":%d,"ok":true,"http":"%s"}' % (_count, scope["http_version"].encode())
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def main_async(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(1024)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.certfile = args.cert
    config.keyfile = args.key
    config.alpn_protocols = ["http/1.1"] if args.alpn == "h1" else ["h2", "http/1.1"]
    config.keep_alive_timeout = args.keep_alive
    config.accesslog = None
    config.errorlog = logging.getLogger("wan_upstream")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    deadline = loop.time() + args.max_lifetime

    async def until_stopped() -> None:
        # bounded: wakes once a second, ends on a signal, with the parent or at the deadline
        while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    server = asyncio.create_task(serve(app, config, shutdown_trigger=until_stopped))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    if server.done():
        server.result()
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    await server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--alpn", choices=["h1", "h2"], default="h2")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--keep-alive", type=float, default=75.0)
    p.add_argument("--max-lifetime", type=float, default=3600.0)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main_async(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
