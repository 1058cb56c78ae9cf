"""What a keep-alive connection buys the sender, against the fresh connection per write it uses.

    .venv/bin/python bench/costs/keepalive.py [--requests 2000] [--runs 3]

Starts bench/core/upstream.py twice in processes of their own (http, and https with a throw-away
certificate, bench/core/certs.py) and sends the same small POST many times, at concurrency 1 and 16, through
`UpstreamSender.send_once` as the proxy sends journaled writes: `fresh` (`upstream_connections: fresh`, a
connection per write) and `reused` (`reuse`, the default: idle connections kept for `upstream_keepalive`).
Prints CPU milliseconds per request in this process (the sender's cost; the upstream's is in its own
process), the median latency and the rate, each the median of --runs runs (docs/performance.md quotes them).
"""

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.certs import throwaway_ca
from proxy_addon.request.sender import SendEnd, Timeouts, TLSSettings, UpstreamSender

BODY = b'{"title": "keep-alive or not"}'
HEADERS = [(b"content-type", b"application/json")]
MODES = {"fresh": Timeouts(connect=5.0, idle=5.0), "reused": Timeouts(connect=5.0, idle=5.0, keepalive=30.0)}


def start_upstream(tls: tuple[Path, Path] | None) -> tuple[subprocess.Popen, int]:
    args = [sys.executable, str(Path(__file__).resolve().parents[1] / "core" / "upstream.py")]
    if tls:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline().split()[1])


async def worker(sender: UpstreamSender, url: str, timeouts: Timeouts, n: int, latencies: list[float]) -> None:
    for _ in range(n):
        t = time.perf_counter()
        result = await sender.send_once("POST", url, HEADERS, BODY, timeouts)
        latencies.append(time.perf_counter() - t)
        assert result.end == SendEnd.ANSWERED, result


async def measure(scheme: str, port: int, mode: str, n: int, concurrency: int) -> tuple[float, float, float]:
    sender = UpstreamSender(TLSSettings(insecure=True))
    url = f"{scheme}://127.0.0.1:{port}/x"
    timeouts = MODES[mode]
    try:
        await asyncio.gather(*(worker(sender, url, timeouts, 50 // concurrency + 1, []) for _ in range(concurrency)))
        latencies: list[float] = []
        per = n // concurrency
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(sender, url, timeouts, per, latencies) for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await sender.aclose()
    done = per * concurrency
    return cpu / done * 1000, statistics.median(latencies) * 1000, done / wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    print("| upstream | concurrency | connection | CPU ms/request | p50 ms | req/s |")
    print("|---|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        cert = throwaway_ca(Path(tmp))[1:]  # the server's certificate and key; the sender verifies nothing
        for scheme in ("http", "https"):
            proc, port = start_upstream(cert if scheme == "https" else None)
            try:
                for concurrency in (1, 16):
                    for mode in ("reused", "fresh"):
                        runs = [asyncio.run(measure(scheme, port, mode, args.requests, concurrency)) for _ in range(args.runs)]
                        cpu, p50, rate = (statistics.median(r[i] for r in runs) for i in range(3))
                        print(f"| {scheme} | {concurrency} | {mode} | {cpu:.2f} | {p50:.2f} | {rate:.0f} |", flush=True)
            finally:
                proc.terminate()
                proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
