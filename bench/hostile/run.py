"""Hostile inputs: what the worst bodies cost the proxy, measured, not asserted in a test's timing.

    .venv/bin/python bench/hostile/run.py canonical            # analyse_body on the worst inputs found, in-process
    .venv/bin/python bench/hostile/run.py stall                # a real proxy: GET latency while {"a":1e999999} is journaled
    .venv/bin/python bench/hostile/run.py memory --size 200    # a real proxy: peak RSS around one large journaled body
    .venv/bin/python bench/hostile/run.py memory --tree /path/to/another/checkout   # the same against other code

`canonical` times fingerprint.analyse_body (best of 3) on inputs built to cost the most within its bounds:
as many floats, keys, secret fields, containers or form pairs as fit under MAX_ITEMS, numbers at their
length limits, nesting at its depth limit, and the pathological numbers that once held the proxy.
`stall` and `memory` start `receipts proxy` (SQLite, in a temporary directory) and an upstream that reads
and discards bodies, both as processes of their own; `--tree` runs the proxy from another checkout (for a
before/after), `--max-body` sets proxy.max_body (omitted: the checkout's default).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


# -- canonical ------------------------------------------------------------------------------------------------


def hostile_bodies() -> dict[str, tuple[str, bytes]]:
    from proxy_addon.rules.fingerprint import MAX_ITEMS, MAX_JSON_DEPTH, MAX_NUMBER_CHARS

    n = MAX_ITEMS - 16
    return {
        "floats at the item bound": ("application/json", b"[" + b",".join([b"1.5e3"] * n) + b"]"),
        "ints at the item bound": ("application/json", b"[" + b",".join([b"1"] * n) + b"]"),
        "keys at the item bound": ("application/json", json.dumps({f"k{i}": i for i in range(n // 2)}).encode()),
        "secret fields at the item bound": ("application/json", json.dumps([{"password": f"p{i}"} for i in range(n // 3)]).encode()),
        "escaped strings, 1 MiB": ("application/json", json.dumps(["\u00e9\n\t\"" * 40] * 1900).encode()),
        "4300-digit ints, 1 MiB": ("application/json", b"[" + b",".join([b"9" * 4300] * 240) + b"]"),
        f"numbers of {MAX_NUMBER_CHARS} chars": ("application/json", b"[" + b",".join([b"1." + b"7" * (MAX_NUMBER_CHARS - 2)] * 3900) + b"]"),
        f"depth {MAX_JSON_DEPTH}, repeated": ("application/json", b"[" + b",".join([b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH] * (n // (MAX_JSON_DEPTH + 1))) + b"]"),
        '{"a":1e999999}': ("application/json", b'{"a":1e999999}'),
        '{"a":1e1000000}': ("application/json", b'{"a":1e1000000}'),
        "exponents 1e999999, 40k": ("application/json", b"[" + b",".join([b"1e999999"] * 40_000) + b"]"),
        "nesting 100k (over the bound)": ("application/json", b"[" * 100_000 + b"]" * 100_000),
        "form pairs at the item bound": ("application/x-www-form-urlencoded", b"&".join(b"f%d=v" % i for i in range(n))),
        "multipart, parts at the item bound": _multipart(n),
        "multipart, 300k parts (over the bound)": _multipart(300_000),
        "32 MiB JSON (over the size bound)": ("application/json", b'{"a":"' + b"x" * (32 * MIB) + b'"}'),
        "32 MiB binary": ("application/octet-stream", os.urandom(32 * MIB)),
    }


def _multipart(parts: int) -> tuple[str, bytes]:
    from mitmproxy.net.http.multipart import encode_multipart

    ct = "multipart/form-data; boundary=bench"
    return ct, encode_multipart(ct, [(b"f%d" % i, b"v" * 8) for i in range(parts)])


def canonical(_args: argparse.Namespace) -> None:
    from proxy_addon.rules.account import AccountHasher
    from proxy_addon.rules.fingerprint import analyse_body

    keyed = AccountHasher(b"k" * 32).digest
    print("| input | bytes | seconds (best of 3) | kind | note |\n|---|---:|---:|---|---|")
    for name, (ct, body) in hostile_bodies().items():
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            got = analyse_body(ct, body, frozenset(), None, keyed)
            best = min(best, time.perf_counter() - started)
        print(f"| {name} | {len(body)} | {best:.3f} | {got.kind} | {(got.note or '').split(';')[0]} |")


# -- processes -----------------------------------------------------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            left -= len(self.rfile.read(min(left, MIB)))
        self.send_response(201)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


class Proxy:
    """`receipts proxy` from `tree` on a fresh SQLite file, and a sink upstream in a thread of this process."""

    def __init__(self, tree: Path, max_body: str | None):
        self.dir = Path(tempfile.mkdtemp(prefix="hostile-"))
        self.tree, self.max_body = tree, max_body
        self.sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        threading.Thread(target=self.sink.serve_forever, daemon=True).start()

    def __enter__(self) -> "Proxy":
        env = {**os.environ, "PYTHONPATH": str(self.tree), "RECEIPTS_SECRET": "hostile-bench-secret-0123456789abcdef"}
        db = f"sqlite:///{self.dir / 'r.db'}"
        config = self.dir / "config.yaml"
        config.write_text(f"database: {{url: '{db}'}}\n" + (f"proxy: {{max_body: {self.max_body}}}\n" if self.max_body else ""))
        subprocess.run([sys.executable, "-m", "proxy_addon.cli", "db", "upgrade", "--config", str(config)], env=env,
                       check=True, capture_output=True, cwd=self.tree)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy_addon.cli", "proxy", "--config", str(config), "--listen-port", str(self.port),
             "--confdir", str(self.dir / "confdir")],
            env=env, cwd=self.tree, stdout=open(self.dir / "proxy.log", "ab"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the proxy did not start: {(self.dir / 'proxy.log').read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.sink.shutdown()

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.sink.server_address[1]}"

    def client(self, timeout: float = 120):
        import httpx

        return httpx.Client(proxy=f"http://127.0.0.1:{self.port}", trust_env=False, timeout=timeout)


def stall(args: argparse.Namespace) -> None:
    """While one hostile body is journaled, GETs through the same proxy every 50 ms: their worst latency."""
    for body in (b'{"a":1e999999}', b'{"a":1e1000000}'):
        with Proxy(args.tree, args.max_body) as proxy, proxy.client() as c, proxy.client(timeout=120) as other:
            other.get(proxy.upstream + "/warm")
            box: dict = {}

            def send(c=c, body=body, proxy=proxy, box=box) -> None:
                started = time.perf_counter()
                r = c.post(proxy.upstream + "/hostile", content=body, headers={"Content-Type": "application/json"})
                box.update(status=r.status_code, seconds=time.perf_counter() - started)

            t = threading.Thread(target=send)
            t.start()
            worst = 0.0
            while t.is_alive():
                started = time.perf_counter()
                other.get(proxy.upstream + "/meanwhile")
                worst = max(worst, time.perf_counter() - started)
                time.sleep(0.05)
            t.join()
        print(f"{body.decode()}: answered {box['status']} in {box['seconds']:.3f} s; worst GET meanwhile {worst:.3f} s")


def memory(args: argparse.Namespace) -> None:
    """Peak RSS (VmHWM) of the proxy around one large journaled body, and RSS after it."""
    size = int(args.size * MIB)
    body = b'{"items":["' + b"x" * (size - 14) + b'"]}'
    with Proxy(args.tree, args.max_body) as proxy, proxy.client() as c:
        c.post(proxy.upstream + "/warm", json={"w": 1})
        before = _status(proxy.proc.pid)
        kinds = {"declared": body, "chunked": (body[i : i + MIB] for i in range(0, len(body), MIB))}
        r = c.post(proxy.upstream + f"/large/{args.body}", content=kinds[args.body], headers={"Content-Type": "application/json"})
        time.sleep(1.0)
        after = _status(proxy.proc.pid)
    print(
        f"{args.body} JSON body of {args.size:g} MiB -> {r.status_code}: RSS before {before['VmRSS']} MiB, "
        f"peak {after['VmHWM']} MiB (+{after['VmHWM'] - before['VmRSS']} MiB, {(after['VmHWM'] - before['VmRSS']) * MIB / size:.2f}x "
        f"the body), after {after['VmRSS']} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["canonical", "stall", "memory"])
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose proxy_addon runs the proxy")
    parser.add_argument("--max-body", default=None, help="proxy.max_body (omitted: the checkout's default)")
    parser.add_argument("--size", type=float, default=30.0, help="memory: the body's size in MiB")
    parser.add_argument("--body", choices=["declared", "chunked"], default="declared", help="memory: Content-Length or chunked")
    args = parser.parse_args()
    {"canonical": canonical, "stall": stall, "memory": memory}[args.what](args)


if __name__ == "__main__":
    main()
