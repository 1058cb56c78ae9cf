"""What tracing costs per journaled write, off and on (proxy_addon/tracing.py).

Off: the hot path's only trace of it is the module-level flag, checked three times per write (the addon's hook
around the handler, the handler once the operation is named, and once at the verdict); measured as those checks.

On: `tracing.traced_write` around a handler that does what the real one adds when tracing is on (names the
span, writes its traceparent into the verdict's detail), with the SDK's BatchSpanProcessor and the OTLP/HTTP
exporter sending to a sink in another process (so its CPU is not counted here). Per write: the time on the event
loop (what a write waits for), and this process's CPU (the loop's and the exporter thread's, after the final
flush). The handler's own work (journal, send, verdict) is left out: this is what tracing adds to it.

    PYTHONPATH=$PWD .venv/bin/python bench/tracing/run.py --writes 20000 --runs 3
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def off_ns_per_write(writes: int) -> float:
    """The three flag checks a write makes while tracing is off, in ns."""
    from proxy_addon import tracing

    assert not tracing.enabled
    seconds = timeit.timeit("t.enabled; t.enabled; t.enabled", globals={"t": tracing}, number=writes)
    return seconds / writes * 1e9


async def on_run(writes: int) -> tuple[float, float, float]:
    """Per write, in µs: the time on the event loop, the event loop thread's CPU, and this process's CPU (the
    exporter thread's included, after the final flush)."""
    from proxy_addon import tracing
    from proxy_addon.protocols.facts import RequestFacts
    from proxy_addon.request.handler import Handled
    from proxy_addon.rules.answers import answer

    done = answer(201, b'{"id": 1}', {"Content-Type": "application/json"})

    async def handle(facts: RequestFacts) -> Handled:
        tracing.name_write(facts, "articles.create")
        tracing.write_traceparent()
        return Handled(done, {"operation_id": "0190c9f4-0000-7000-8000-000000000000", "state": "succeeded"})

    assert tracing.set_up(), "tracing did not turn on"
    cpu, thread_cpu, loop = time.process_time(), time.thread_time(), 0.0
    for i in range(writes):
        headers = [("content-type", "application/json"), ("traceparent", f"00-{i + 1:032x}-{i + 1:016x}-01")]
        facts = RequestFacts("POST", "https", "api.example.com", 443, "/api/articles", [], headers, "application/json", b"{}")
        started = time.perf_counter()
        await tracing.traced_write(facts, handle)
        loop += time.perf_counter() - started
    thread_cpu = time.thread_time() - thread_cpu
    tracing.shut_down()  # the queued spans exported: their cost counted
    return loop / writes * 1e6, thread_cpu / writes * 1e6, (time.process_time() - cpu) / writes * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]
    off = statistics.median(off_ns_per_write(args.writes * 10) for _ in range(args.runs))
    port = free_port()
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(port)])
    try:
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.environ.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_BSP_MAX_QUEUE_SIZE=str(args.writes),  # nothing dropped: every span's export is counted
        )
        asyncio.run(on_run(min(args.writes, 500)))  # warm-up: imports, the exporter's connection
        runs = [asyncio.run(on_run(args.writes)) for _ in range(args.runs)]
    finally:
        sink.terminate()
        sink.wait(5)
    loop_us, loop_cpu_us, cpu_us = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"off: {off:.0f} ns per write (the flag checked three times), median of {args.runs}")
    print(f"on:  per write {loop_us:.1f} µs on the event loop ({loop_cpu_us:.1f} µs of its CPU), "
          f"{cpu_us:.1f} µs CPU in all with its export (median of {args.runs} runs of {args.writes} writes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
