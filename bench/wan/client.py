"""bench/wan/run.py's agent: one httpx client, kept alive as SDKs keep theirs, writing over HTTPS through a proxy.

    python bench/wan/client.py --proxy-port P --url https://127.0.0.1:R/wan/... --proxy-ca CA.pem \
        [--http2] [--requests 50] [--warmup 5] [--concurrency 1] [--expect-header x-receipt-state=succeeded]

One `httpx.AsyncClient` (`trust_env=False`, the proxy given explicitly, the proxy's CA trusted): each HTTPS
request goes through a CONNECT tunnel and TLS with the proxy, which the client keeps alive between writes
(HTTP/1.1: one tunnel per concurrent request in flight, reused; `--http2`: h2 in the tunnel, one connection
that carries every concurrent stream). `--concurrency K` runs K tasks on that one client, each sending its
next write when the previous one was answered. The warm-up opens the tunnels and is not measured.

Every POST has a unique path and JSON body (the receipts proxy never refuses one as a duplicate). Prints one
JSON document: the measured window (`time.monotonic()`, a clock shared by every process on the machine),
each write's start and end, latencies, failures, and the HTTP versions the client spoke.
"""

import argparse
import asyncio
import json
import ssl
import sys
import time
from typing import Any

import httpx


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=args.proxy_ca)
    expect: tuple[str, str] | None = None
    if args.expect_header:
        name, _, value = args.expect_header.partition("=")
        expect = (name.lower(), value)
    limits = httpx.Limits(max_connections=max(args.concurrency, 1) + 4, max_keepalive_connections=max(args.concurrency, 1) + 4)
    timeout = httpx.Timeout(args.timeout)
    writes: list[dict[str, Any]] = []
    failures: list[str] = []
    versions: dict[str, int] = {}
    proxy = f"http://127.0.0.1:{args.proxy_port}"
    async with httpx.AsyncClient(
        proxy=proxy, verify=ctx, http2=args.http2, http1=True, trust_env=False, limits=limits, timeout=timeout
    ) as client:

        async def one(phase: str, i: int) -> None:
            url = f"{args.url}/{phase}/{i}"
            body = {"run": args.url, "phase": phase, "n": i, "note": "a write through a WAN"}
            started = time.monotonic()
            try:
                r = await client.post(url, json=body, headers={"content-type": "application/json"})
            except httpx.HTTPError as e:
                failures.append(f"{phase} {i}: {type(e).__name__}: {e}")
                return
            ended = time.monotonic()
            versions[r.http_version] = versions.get(r.http_version, 0) + 1
            ok = r.status_code == 201 and (expect is None or r.headers.get(expect[0]) == expect[1])
            if not ok:
                failures.append(f"{phase} {i}: {r.status_code} {dict(r.headers)!r} {r.text[:200]!r}")
            if phase == "m":
                writes.append({"i": i, "start": started, "end": ended, "ok": ok})

        async def worker(phase: str, next_index: list[int], total: int) -> None:
            while next_index[0] < total:  # bounded by `total`
                i = next_index[0]
                next_index[0] += 1
                await one(phase, i)

        async def phase(name: str, total: int) -> None:
            next_index = [0]
            await asyncio.gather(*(worker(name, next_index, total) for _ in range(args.concurrency)))

        started = time.monotonic()
        async with asyncio.timeout(args.deadline):
            # the warm-up: every concurrent tunnel opened and used before the measured writes
            await phase("w", max(args.warmup, args.concurrency))
            window_start = time.monotonic()
            await phase("m", args.requests)
            window_end = time.monotonic()
    writes.sort(key=lambda w: w["start"])
    latencies = sorted((w["end"] - w["start"]) * 1000.0 for w in writes if w["ok"])
    return {
        "started": started,  # before the warm-up: its tunnels (CONNECT) and the upstream connections they open
        "window": [window_start, window_end],
        "requests": args.requests,
        "ok": sum(1 for w in writes if w["ok"]),
        "failures": failures[:20],
        "failed": len(failures),
        "http_versions": versions,
        "latencies_ms": latencies,
        "writes": writes,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy-port", type=int, required=True)
    p.add_argument("--proxy-ca", required=True, help="the proxy's CA certificate (PEM)")
    p.add_argument("--url", required=True, help="https://HOST:PORT/prefix; each write goes to URL/PHASE/N")
    p.add_argument("--http2", action="store_true")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--expect-header", help="NAME=VALUE every answer must carry")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--deadline", type=float, default=600.0)
    result = asyncio.run(run(p.parse_args()))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
