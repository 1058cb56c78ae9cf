"""A TCP relay on 127.0.0.1 that puts a round-trip time between its clients and one upstream (bench/wan/run.py).

    python bench/wan/relay.py --target 127.0.0.1:PORT --rtt 20ms [--port 0] [--trace FILE] [--no-handshake]

Every connection it accepts gets a connection of its own to the target. Bytes pass in both directions in
order, each chunk delivered rtt/2 after it arrived (one-way delay), and so do the ends of the streams (a
half-close is passed on as one). Nothing is reordered, merged away or dropped: each direction is one queue
read by one writer.

The TCP handshake. On loopback the kernel completes a client's handshake at once, so a client may write
before a round trip has passed; over a real link its first byte leaves one RTT after connect() (SYN out,
SYN-ACK back). The relay models that: a connection's first RTT is its handshake, and what the client sends
before the handshake would have completed is delivered as if sent at its end (rtt + rtt/2 after the
accept). `--no-handshake` leaves that out (each chunk rtt/2 after it arrived, whenever that was).

What the relay cannot model: TCP's own behaviour over the long link (Nagle waiting for the far end's ACK,
delayed ACKs, slow start, loss). Each leg is loopback TCP with TCP_NODELAY, terminated at the relay.

`--trace FILE` writes one JSON line per event: a connection accepted (`open`, with the client's port),
connected to the target (`connected`), a chunk arrived (`c2u` client to upstream, `u2c` back; `n` bytes,
`at` when it is delivered), an end of stream (`eof_c2u`, `eof_u2c`), the connection closed (`close`).
Times are `time.monotonic()` (CLOCK_MONOTONIC, one clock for every process on the machine). It prints
`LISTENING <port>` on stdout once it accepts connections, and stops when its parent dies, on SIGTERM, or
after --max-lifetime seconds.
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import IO, Any

READ_CHUNK = 65536


def parse_duration_ms(text: str) -> float:
    """'20ms', '0.02s', '20' (milliseconds) -> milliseconds."""
    t = text.strip().lower()
    if t.endswith("ms"):
        return float(t[:-2])
    if t.endswith("s"):
        return float(t[:-1]) * 1000.0
    return float(t)


class Trace:
    """The events, buffered and written out at most every 0.2 s (and at the end)."""

    def __init__(self, file: IO[str] | None) -> None:
        self.file = file
        self.lines: list[str] = []
        self.last_flush = time.monotonic()

    def event(self, **fields: Any) -> None:
        if self.file is None:
            return
        self.lines.append(json.dumps(fields, separators=(",", ":")))
        now = time.monotonic()
        if now - self.last_flush > 0.2:
            self.flush()

    def flush(self) -> None:
        if self.file is not None and self.lines:
            self.file.write("\n".join(self.lines) + "\n")
            self.file.flush()
            self.lines.clear()
        self.last_flush = time.monotonic()


class Relay:
    def __init__(self, target: tuple[str, int], rtt_ms: float, handshake: bool, trace: Trace) -> None:
        self.target = target
        self.half = rtt_ms / 2000.0  # seconds, one way
        self.rtt = rtt_ms / 1000.0
        self.handshake = handshake
        self.trace = trace
        self.next_id = 0
        self.open_connections = 0

    async def handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        accepted = time.monotonic()
        self.next_id += 1
        conn = self.next_id
        self.open_connections += 1
        peer = c_writer.get_extra_info("peername")
        self.trace.event(t=accepted, conn=conn, ev="open", port=peer[1] if peer else None)
        # the client's bytes leave no earlier than the end of its handshake (one RTT after the accept)
        established = accepted + (self.rtt if self.handshake else 0.0)
        u_writer: asyncio.StreamWriter | None = None
        try:
            try:
                u_reader, u_writer = await asyncio.open_connection(*self.target)
            except OSError as e:
                self.trace.event(t=time.monotonic(), conn=conn, ev="connect_failed", error=str(e))
                return
            self.trace.event(t=time.monotonic(), conn=conn, ev="connected")
            await asyncio.gather(
                self.pipe(conn, "c2u", c_reader, u_writer, established),
                self.pipe(conn, "u2c", u_reader, c_writer, 0.0),
            )
        finally:
            self.open_connections -= 1
            self.trace.event(t=time.monotonic(), conn=conn, ev="close")
            for w in (c_writer, u_writer):
                if w is not None:
                    w.close()

    async def pipe(
        self, conn: int, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, not_before: float
    ) -> None:
        """One direction: a reader that stamps each chunk with its delivery time, a writer that keeps it."""
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def read() -> None:
            while True:
                try:
                    data = await reader.read(READ_CHUNK)
                except OSError:
                    data = b""
                now = time.monotonic()
                at = max(now, not_before) + self.half
                if data:
                    self.trace.event(t=now, conn=conn, ev=direction, n=len(data), at=at)
                    queue.put_nowait((at, data))
                else:
                    self.trace.event(t=now, conn=conn, ev="eof_" + direction, at=at)
                    queue.put_nowait((at, None))
                    return

        async def write() -> None:
            while True:
                at, data = await queue.get()
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    if data is None:
                        if writer.can_write_eof():
                            writer.write_eof()
                        return
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    return

        reading = asyncio.create_task(read())
        try:
            await write()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


async def serve(args: argparse.Namespace, trace: Trace) -> None:
    host, _, port = args.target.rpartition(":")
    relay = Relay((host or "127.0.0.1", int(port)), parse_duration_ms(args.rtt), not args.no_handshake, trace)
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(relay.handle, "127.0.0.1", args.port, backlog=1024, reuse_address=True)
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    deadline = loop.time() + args.max_lifetime
    try:
        async with server:
            # bounded: wakes every 0.2 s (and writes the trace out), ends on a signal, with the parent, at the deadline
            while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
                trace.flush()
    finally:
        trace.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="HOST:PORT the relay connects to")
    p.add_argument("--rtt", default="20ms", help="round-trip time added (each direction delayed by half), e.g. 20ms")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--trace", help="append one JSON line per event to this file")
    p.add_argument("--no-handshake", action="store_true", help="do not model the TCP handshake's round trip")
    p.add_argument("--max-lifetime", type=float, default=3600.0)
    args = p.parse_args()
    trace_file = open(args.trace, "a") if args.trace else None  # open for the relay's life
    try:
        asyncio.run(serve(args, Trace(trace_file)))
    finally:
        if trace_file is not None:
            trace_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
