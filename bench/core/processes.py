"""Starting and stopping the benchmark's processes: the upstream, the targets, the load client."""

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORE = Path(__file__).resolve().parent  # the shared core: the upstream and the load client run from here
BENCH = CORE.parent
REPO = BENCH.parent
BIN = Path(sys.executable).parent
BENCH_SECRET = "receipts-bench-secret-0123456789abcdef0123456789"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

Process = subprocess.Popen[Any]


class BenchError(Exception):
    pass


class Processes:
    """Every process this run starts, so that the finally block can stop each one by its own pid."""

    def __init__(self) -> None:
        self.running: list[Process] = []

    def start(self, cmd: list[str], log: Path | None, env: dict[str, str] | None = None, stdout: Any = None) -> Process:
        log_file = open(log, "ab") if log is not None else subprocess.DEVNULL  # closed below, once the child has it
        try:
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else log_file,
                stderr=log_file,
                env=env,
                cwd=REPO,
                start_new_session=True,  # a Ctrl-C of the benchmark does not hit them before the finally block
            )
        finally:
            if log is not None:
                log_file.close()  # type: ignore[union-attr]
        self.running.append(proc)
        return proc

    def stop(self, proc: Process, grace: float = 10.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        if proc in self.running:
            self.running.remove(proc)

    def stop_all(self) -> None:
        for proc in list(reversed(self.running)):
            self.stop(proc, grace=5.0)


def bench_env(database_url: str | None = None) -> dict[str, str]:
    """The children's environment: no proxy variables, and this checkout's code first on the path.

    The `receipts` script next to the interpreter imports `proxy_addon` through the venv's editable install,
    which may point at another checkout (a git worktree sharing the venv); PYTHONPATH takes precedence over it.
    """
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env["RECEIPTS_SECRET"] = BENCH_SECRET
    env["PYTHONUNBUFFERED"] = "1"
    if database_url:
        env["RECEIPTS_DATABASE_URL"] = database_url
    return env


def receipts_cmd() -> list[str]:
    exe = BIN / "receipts"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from proxy_addon.cli import main; sys.exit(main())"]


def tool(name: str) -> str:
    exe = BIN / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if not found:
        raise BenchError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: Process, timeout: float, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"process exited with {proc.returncode} before listening on {port}{log_tail(log)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise BenchError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s{log_tail(log)}")


def log_tail(log: Path | None, lines: int = 8) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").strip().splitlines()[-lines:]
    return ("\n  " + "\n  ".join(text)) if text else ""


def read_line(proc: Process, timeout: float) -> str:
    """The first stdout line of a process, waiting at most `timeout` seconds."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise BenchError(f"no output within {timeout:.0f}s")
        return proc.stdout.readline().decode().strip()
    finally:
        sel.close()


def start_upstream(procs: Processes, logs: Path, max_runtime: float, port: int = 0) -> int:
    """Starts bench/core/upstream.py (on `port`, or any free one) and returns its port."""
    log = logs / "upstream.log"
    cmd = [sys.executable, str(CORE / "upstream.py"), "--port", str(port), "--max-lifetime", str(max_runtime)]
    proc = procs.start(cmd, log, env=bench_env(), stdout=subprocess.PIPE)
    line = read_line(proc, 15)
    if not line.startswith("LISTENING "):
        raise BenchError(f"upstream said {line!r}{log_tail(log)}")
    return int(line.split()[1])


def start_mitmdump(procs: Processes, log: Path, confdir: Path) -> tuple[Process, int]:
    port = free_port()
    cmd = [tool("mitmdump"), "-q", "--listen-host", "127.0.0.1", "-p", str(port), "--set", f"confdir={confdir}"]
    proc = procs.start(cmd, log, env=bench_env())
    wait_port(port, proc, 60, log)
    return proc, port


def start_receipts_proxy(procs: Processes, log: Path, confdir: Path, config: Path, database_url: str) -> tuple[Process, int]:
    port = free_port()
    cmd = [
        *receipts_cmd(),
        "proxy",
        "--config",
        str(config),
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
        "--confdir",
        str(confdir),
    ]
    proc = procs.start(cmd, log, env=bench_env(database_url))
    wait_port(port, proc, 60, log)
    return proc, port


def write_proxy_config(tmp: Path, target_key: str, database_url: str, answer_first: bool = True) -> Path:
    """The defaults, a fresh database, a throw-away secret file (and `proxy.answer_first: false` when asked)."""
    path = tmp / f"config-{target_key}.yaml"
    path.write_text(
        "# written by bench/loopback/run.py: the defaults, a fresh database, a throw-away secret file\n"
        f"database:\n  url: {json.dumps(database_url)}\n"
        f"secret_file: {json.dumps(str(tmp / 'secret'))}\n"
        "logging:\n  level: info\n  format: json\n"
        + ("" if answer_first else "proxy:\n  answer_first: false\n")
    )
    return path


@dataclass(frozen=True)
class LoadSpec:
    """One load client's share of a level: where it sends, how much, how concurrently, under which path prefix."""

    port: int
    requests: int
    concurrency: int
    prefix: str


def loadgen_cmd(spec: LoadSpec, run_id: str, upstream_port: int | None, expect_receipt: bool, latencies: bool) -> list[str]:
    cmd = [
        sys.executable,
        str(CORE / "loadgen.py"),
        *("--port", str(spec.port), "--requests", str(spec.requests), "--concurrency", str(spec.concurrency)),
        *("--prefix", spec.prefix, "--run-id", run_id, "--deadline", str(loadgen_deadline(spec.requests)), "--timeout", "30"),
    ]
    if upstream_port is not None:
        cmd += ["--proxy", "--upstream-port", str(upstream_port)]
    if expect_receipt:
        cmd += ["--expect-header", "x-receipt-state=succeeded"]
    if latencies:
        cmd.append("--latencies")
    return cmd


def loadgen_deadline(requests: int) -> float:
    return max(60.0, requests * 0.05)


def run_loadgen(
    port: int, *, requests: int, concurrency: int, prefix: str, run_id: str, upstream_port: int | None, expect_receipt: bool
) -> dict[str, Any]:
    """bench/core/loadgen.py's measured phase; `upstream_port` makes it talk to `port` as a forward proxy."""
    spec = LoadSpec(port, requests, concurrency, prefix)
    return run_loadgens([spec], run_id=run_id, upstream_port=upstream_port, expect_receipt=expect_receipt)[0]


def run_loadgens(
    specs: list[LoadSpec], *, run_id: str, upstream_port: int | None, expect_receipt: bool, latencies: bool = False
) -> list[dict[str, Any]]:
    """One load client per spec, all at the same time; their measured phases, in order.

    `latencies` adds each client's sorted latencies (`latencies_ms`), so that percentiles can be taken over
    several clients' requests together.
    """
    timeout = max(loadgen_deadline(s.requests) for s in specs) + 60
    clients: list[Process] = []
    try:
        for spec in specs:
            cmd = loadgen_cmd(spec, run_id, upstream_port, expect_receipt, latencies)
            clients.append(
                subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=REPO, env=bench_env()
                )
            )
        limit = time.monotonic() + timeout
        outputs = []
        for client in clients:
            try:
                outputs.append(client.communicate(timeout=max(1.0, limit - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise BenchError(f"load client did not finish within {timeout:.0f}s") from None
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.communicate()
    results = []
    for client, (stdout, stderr) in zip(clients, outputs):
        if client.returncode != 0:
            raise BenchError(f"load client failed ({client.returncode}): {stderr.decode(errors='replace')[-800:]}")
        results.append(json.loads(stdout)["measured"])
    return results
