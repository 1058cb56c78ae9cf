"""Running the real proxy for tests: in-process (a DumpMaster on its own thread) or as a `receipts proxy` process."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from mitmproxy import options
from mitmproxy.tools.dump import DumpMaster

from proxy_addon.addons.receipts import Receipts, make_addons
from support.procfs import pids, process_state
from support.server import free_port, listens

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunningProxy:
    port: int
    addon: Receipts
    master: DumpMaster
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Shut it down (its addons' `done`: the verdicts still committing are waited for); again, nothing."""
        if self.thread.is_alive() and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.master.shutdown)
        self.thread.join(15)


def start_inprocess_proxy(config_path: Path, database_url: str, confdir: Path, **extra_options) -> RunningProxy:
    """A real mitmproxy with the receipts addon, listening on a free loopback port, in a background thread."""
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        async def main() -> None:
            opts = options.Options(listen_host="127.0.0.1", listen_port=0, confdir=str(confdir))
            master = DumpMaster(opts, with_termlog=False, with_dumper=False)
            addon, *beside = make_addons()
            master.addons.add(addon, *beside)
            opts.update(
                receipts_config=str(config_path),
                receipts_database_url=database_url,
                connection_strategy="lazy",
                **extra_options,
            )
            box.update(master=master, addon=addon, loop=asyncio.get_running_loop())
            task = asyncio.create_task(master.run())
            for _ in range(200):
                addrs = master.addons.get("proxyserver").listen_addrs()
                if addrs:
                    box["port"] = addrs[0][1]
                    break
                await asyncio.sleep(0.025)
            ready.set()
            await task

        try:
            asyncio.run(main())
        except BaseException as e:  # surfaced to the test below
            box["error"] = e
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(20) or "error" in box or "port" not in box:
        raise RuntimeError(f"proxy did not start: {box.get('error')!r}")
    return RunningProxy(box["port"], box["addon"], box["master"], thread, box["loop"])


def start_proxy_process(
    config_path: Path, database_url: str, confdir: Path, log_path: Path, port: int | None = None, env: dict | None = None,
    args: tuple[str, ...] = (),
):
    """`receipts proxy` as its own process (with `env` added to its environment, `args` to its command line);
    returns (Popen, port) once it listens. On a port of its choosing, another is tried when the one `free_port`
    gave was taken by another test's server before the proxy bound it."""
    for _ in range(3):
        chosen = port or free_port()
        proc = _proxy_process(config_path, database_url, confdir, log_path, chosen, env, args)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text()[-2000:]
                if port is None and "address already in use" in tail:
                    break
                raise RuntimeError(f"receipts proxy exited with {proc.returncode}: {tail}")
            if listens(proc.pid, chosen):
                return proc, chosen
            time.sleep(0.1)
        else:
            proc.send_signal(signal.SIGKILL)
            raise RuntimeError("receipts proxy did not start listening within 30 s")
    raise RuntimeError(f"receipts proxy found its port taken three times: {log_path.read_text()[-2000:]}")


def _proxy_process(
    config_path: Path, database_url: str, confdir: Path, log_path: Path, port: int, env: dict | None, args: tuple[str, ...]
) -> subprocess.Popen:
    env = {**os.environ, "RECEIPTS_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "proxy_addon.cli", "proxy", "--config", str(config_path),
             "--listen-port", str(port), "--confdir", str(confdir), *args],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(config_path.parent),
        )


def writer_pid(proxy_pid: int) -> int | None:
    """The proxy's journal writer: its child process running proxy_addon.journal.writer."""
    for pid in pids():
        state = process_state(pid)
        if state is None or state[1] != proxy_pid or state[0] == "Z":
            continue
        try:
            if b"proxy_addon.journal.writer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def process_gone(pid: int) -> bool:
    """The process has exited (no longer there, or a zombie waiting to be reaped)."""
    state = process_state(pid)
    return state is None or state[0] == "Z"


@contextmanager
def warmed_inprocess_proxy(config_path: Path, database_url: str, confdir: Path, first_write_url: str) -> Iterator[RunningProxy]:
    """An in-process proxy that has journaled one write already, so that no test's first write pays for its warm-up."""
    running = start_inprocess_proxy(config_path, database_url, confdir)
    try:
        warm = requests.post(first_write_url, proxies={"http": running.url}, timeout=30)
        assert "X-Receipt-Id" in warm.headers
        yield running
    finally:
        running.stop()
