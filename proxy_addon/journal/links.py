"""How the journal writer is started and ended: a child process of the proxy (`WriterProcess`), or a thread of
this process for the in-process tests (`WriterThread`); the proxy holds its end of their socketpair."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


class WriterLink(Protocol):
    """A started writer: the proxy's end of their socketpair, and how to tell and end the writer's life."""

    sock: socket.socket

    def ended(self) -> str: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...


class WriterProcess:
    """The writer as a child process: `python -m proxy_addon.journal.writer`, given its end of a socketpair."""

    def __init__(self) -> None:
        self.sock, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        # -P: not the working directory first on the path, so that the writer runs this very proxy_addon
        cmd = [sys.executable, "-P", "-m", "proxy_addon.journal.writer", "--fd", str(child.fileno())]
        try:
            self.process = subprocess.Popen(cmd, pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            child.close()

    def ended(self) -> str:
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "its socket closed"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def stop(self) -> None:
        self.sock.close()  # the writer reads the end of its socket, finishes what it holds, and exits
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, which ends a stopped process too, and wait for it: nothing it held can be committed after."""
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.sock.close()


class WriterThread:
    """The writer's same loop in a thread of this process (the in-process tests; never the proxy's choice)."""

    def __init__(self) -> None:
        from proxy_addon.journal.writer import serve_socket

        self.sock, child = socket.socketpair()
        self.thread = threading.Thread(target=serve_socket, args=(child, False), name="receipts-journal-writer", daemon=True)
        self.thread.start()

    def ended(self) -> str:
        return "its thread ended"

    def stop(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)

    def kill(self) -> None:
        self.sock.close()  # a thread cannot be killed; its requests carry their deadlines (writer.py)


def stop_link(link: WriterLink, held_record: bool) -> None:
    """Kill the writer if it held a record (it must not commit it after its caller was failed), else stop it."""
    if held_record:
        link.kill()
    else:
        link.stop()
