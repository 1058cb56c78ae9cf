"""The benchmark's load client: raw asyncio, HTTP/1.1 keep-alive, one connection per concurrent worker.

Sends POSTs with small JSON bodies, unique per request (run id and sequence number in both path and body),
so that the receipts proxy never refuses one as a duplicate. Against a proxy it speaks absolute-form
(`POST http://127.0.0.1:UP/path HTTP/1.1`); directly, origin-form. Every loop is bounded by the request
count and by --deadline; each request by --timeout. Prints one JSON document on stdout.

    python bench/core/loadgen.py --port P [--proxy --upstream-port UP] --requests N --concurrency C --prefix /bench/x
"""

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.http1 import ProtocolError, chunked_end

MAX_HEAD = 64 * 1024


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, dict[bytes, bytes], bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError(f"connection closed: {exc or 'EOF'}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            parsed = self._parse()
        except ProtocolError as e:
            self.waiter.set_exception(e)
            self.close()
            return
        if parsed is not None:
            self.waiter.set_result(parsed)

    def _parse(self) -> tuple[int, dict[bytes, bytes], bytes] | None:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            if len(self.buf) > MAX_HEAD:
                raise ProtocolError("response head too large")
            return None
        lines = bytes(self.buf[:head_end]).split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        start = head_end + 4
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            end = chunked_end(self.buf, start)
            if end is None:
                return None
            body = bytes(self.buf[start:end])
        elif b"content-length" in headers:
            end = start + int(headers[b"content-length"])
            if len(self.buf) < end:
                return None
            body = bytes(self.buf[start:end])
        elif status in (204, 304) or 100 <= status < 200:
            end, body = start, b""
        else:
            raise ProtocolError("response without a length (read-until-close is not supported)")
        del self.buf[:end]
        return status, headers, body

    def send(self, data: bytes) -> "asyncio.Future[tuple[int, dict[bytes, bytes], bytes]]":
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


class Phase:
    """One bounded batch of requests: `requests` of them, or fewer if the deadline passes first."""

    def __init__(self, args: argparse.Namespace, prefix: str, requests: int, deadline: float):
        self.args = args
        self.prefix = prefix
        self.requests = requests
        self.deadline = deadline
        self.next_index = 0
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.receipt_states: Counter[str] = Counter()
        host = f"127.0.0.1:{args.upstream_port or args.port}"
        self.host_header = host.encode()
        self.base = f"http://{host}".encode() if args.proxy else b""
        self.expect_header = None
        if args.expect_header:
            name, _, value = args.expect_header.partition("=")
            self.expect_header = (name.strip().lower().encode(), value.strip().encode())

    def take(self) -> int | None:
        if self.next_index >= self.requests or time.monotonic() >= self.deadline:
            return None
        i = self.next_index
        self.next_index += 1
        return i

    def build(self, i: int) -> bytes:
        path = f"{self.prefix}/{i}".encode()
        body = json.dumps(
            {"run": self.args.run_id, "phase": self.prefix, "seq": i, "title": f"bench item {i}", "amount": i % 997},
            separators=(",", ":"),
        ).encode()
        return (
            b"POST %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: receipts-bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (self.base, path, self.host_header, len(body), body)
        )

    async def worker(self) -> None:
        loop = asyncio.get_running_loop()
        conn: ClientConnection | None = None
        timeout = self.args.timeout
        try:
            while True:  # bounded by take(): the request count and the deadline
                i = self.take()
                if i is None:
                    return
                if conn is None or conn.closed:
                    try:
                        _, proto = await asyncio.wait_for(
                            loop.create_connection(ClientConnection, "127.0.0.1", self.args.port), timeout
                        )
                        conn = proto  # type: ignore[assignment]
                    except (OSError, TimeoutError) as e:
                        self.errors[f"connect: {type(e).__name__}"] += 1
                        conn = None
                        await asyncio.sleep(0.05)
                        continue
                request = self.build(i)
                started = time.perf_counter()
                try:
                    status, headers, _body = await asyncio.wait_for(conn.send(request), timeout)
                except (OSError, TimeoutError, ProtocolError, ValueError) as e:
                    self.errors[f"request: {type(e).__name__}"] += 1
                    conn.close()
                    conn = None
                    continue
                elapsed = time.perf_counter() - started
                self.statuses[status] += 1
                state = headers.get(b"x-receipt-state")
                if state is not None:
                    self.receipt_states[state.decode("latin-1")] += 1
                if status != self.args.expect_status:
                    self.errors[f"status {status}"] += 1
                elif self.expect_header and headers.get(self.expect_header[0]) != self.expect_header[1]:
                    self.errors[f"header {self.expect_header[0].decode()}={headers.get(self.expect_header[0])!r}"] += 1
                else:
                    self.latencies.append(elapsed)
                if b"close" in headers.get(b"connection", b"").lower():
                    conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    async def run(self, concurrency: int) -> dict[str, Any]:
        started = time.perf_counter()
        await asyncio.gather(*(self.worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        lat = sorted(self.latencies)
        ok = len(lat)
        not_sent = self.requests - self.next_index
        errors = sum(self.errors.values()) + not_sent
        if not_sent:
            self.errors["not sent before the deadline"] += not_sent

        def ms(v: float | None) -> float | None:
            return None if v is None else round(v * 1000, 3)

        return {
            "prefix": self.prefix,
            "requests": self.requests,
            "ok": ok,
            "errors": errors,
            "error_kinds": dict(self.errors),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "receipt_states": dict(self.receipt_states),
            "elapsed_s": round(elapsed, 4),
            "rps": round(ok / elapsed, 2) if elapsed > 0 else 0.0,
            "p50_ms": ms(percentile(lat, 50)),
            "p90_ms": ms(percentile(lat, 90)),
            "p99_ms": ms(percentile(lat, 99)),
            "max_ms": ms(lat[-1] if lat else None),
            "mean_ms": ms(sum(lat) / ok if ok else None),
        } | ({"latencies_ms": [ms(v) for v in lat]} if self.args.latencies else {})


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    start = time.monotonic()
    if args.warmup:
        warm = Phase(args, f"{args.prefix}/warmup", args.warmup, start + args.deadline)
        out["warmup"] = await warm.run(min(args.concurrency, args.warmup))
    phase = Phase(args, args.prefix, args.requests, time.monotonic() + args.deadline)
    out["measured"] = await phase.run(args.concurrency)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="where to connect on 127.0.0.1 (the upstream or a proxy)")
    p.add_argument("--proxy", action="store_true", help="speak absolute-form requests to a forward proxy")
    p.add_argument("--upstream-port", type=int, default=0, help="with --proxy: the upstream's port")
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests sent first (path prefix + /warmup)")
    p.add_argument("--prefix", default="/bench")
    p.add_argument("--run-id", default="run")
    p.add_argument("--timeout", type=float, default=30.0, help="per request and per connect, seconds")
    p.add_argument("--deadline", type=float, default=300.0, help="per phase: stop sending after this many seconds")
    p.add_argument("--expect-status", type=int, default=201)
    p.add_argument("--expect-header", default="", help="NAME=VALUE every answer must carry, else an error")
    p.add_argument("--latencies", action="store_true", help="add every successful request's latency, sorted, in ms")
    args = p.parse_args()
    if args.requests < 0 or args.concurrency < 1:
        p.error("--requests must be >= 0 and --concurrency >= 1")
    print(json.dumps(asyncio.run(amain(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
