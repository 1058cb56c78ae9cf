#!/usr/bin/env python3
"""docker-compose.yml's topology without Docker: the same processes, on loopback ports, against PostgreSQL.

    scripts/topology.py [--database-url URL] [--config config.yaml] [--proxies 2] [--workdir DIR]

Like the compose file, it migrates once (`receipts db upgrade`), then starts the proxy replicas
(`receipts proxy`, each on a free 127.0.0.1 port) and one `receipts reconcile --loop`, all with the same
`RECEIPTS_DATABASE_URL` and `RECEIPTS_SECRET`. Without `--database-url` it creates a fresh database on the
local PostgreSQL server (`--server-url`, default `RECEIPTS_TEST_POSTGRES_URL` or postgres@127.0.0.1:5432) and
drops it on exit unless `--keep-database`. It prints one JSON document (ports, proxy URLs, database, logs),
restarts a service that died (compose's `restart: unless-stopped`), and stops everything on SIGINT/SIGTERM.

The fault tests import it (`Topology`, a context manager), so they run the very code described here.
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
START_TIMEOUT = 30.0  # seconds a proxy has to accept connections
STOP_TIMEOUT = 10.0  # seconds a service has after SIGTERM before SIGKILL
RESTART_BACKOFF = 2.0  # a service that died is started again at most this often


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receipts_command() -> list[str]:
    """The `receipts` console script of this Python, else the same entry point through `-m`."""
    script = Path(sys.executable).parent / "receipts"
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy_addon.cli"]


def _libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(server_url: str, prefix: str = "receipts_topology") -> str:
    """A new, empty database on the server; returns its SQLAlchemy URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(server_url), autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    server = parsed.set(database="postgres")
    with psycopg.connect(_libpq(server.render_as_string(hide_password=False)), autocommit=True, connect_timeout=5) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (parsed.database,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{parsed.database}"')


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class Service:
    """One process of the topology: its command line, its port (proxies), its log file."""

    def __init__(self, name: str, args: list[str], log_path: Path, port: int | None = None):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._last_start = 0.0

    @property
    def url(self) -> str | None:
        return None if self.port is None else f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, env: dict[str, str], cwd: Path) -> None:
        with open(self.log_path, "ab") as log:  # appended: a restart keeps the history
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(cwd)
            )
        self._last_start = time.monotonic()
        if self.port is not None:
            deadline = time.monotonic() + START_TIMEOUT
            while not _accepts(self.port):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"{self.name} did not accept connections within {START_TIMEOUT:.0f} s")
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to say it stopped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Topology:
    """migrate, `proxies` replicas of `receipts proxy`, one `receipts reconcile --loop`; same database and secret.

    with Topology() as t:
        t.proxy_urls   # ["http://127.0.0.1:PORT", ...]
        t.kill("proxy-1"); t.start_service("proxy-1")   # SIGKILL and restart one service (same port)
    """

    def __init__(
        self,
        database_url: str | None = None,
        config: str | Path | None = None,
        proxies: int = 2,
        reconcile: bool = True,
        workdir: str | Path | None = None,
        secret: str | None = None,
        server_url: str | None = None,
        keep_database: bool = False,
        env: dict[str, str] | None = None,
    ):
        if proxies < 1:
            raise ValueError("a topology needs at least one proxy")
        self.config = Path(config or REPO / "config.yaml").resolve()
        self.server_url = server_url or os.environ.get("RECEIPTS_TEST_POSTGRES_URL") or DEFAULT_SERVER_URL
        self.database_url = database_url
        self.keep_database = keep_database
        self.secret = secret or os.environ.get("RECEIPTS_SECRET") or secrets.token_hex(32)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="receipts-topology-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra_env = env or {}
        self._created_database = False
        self.services: dict[str, Service] = {}
        cli = receipts_command()
        confdir = self.workdir / "mitmproxy"  # shared, like compose's mitmproxy-ca volume: one CA for all
        for i in range(1, proxies + 1):
            name = f"proxy-{i}"
            port = free_port()
            self.services[name] = Service(
                name,
                [*cli, "proxy", "--config", str(self.config), "--listen-host", "127.0.0.1",
                 "--listen-port", str(port), "--confdir", str(confdir)],
                self.workdir / f"{name}.log",
                port,
            )
        if reconcile:
            self.services["reconcile"] = Service(
                "reconcile", [*cli, "reconcile", "--loop", "--config", str(self.config)], self.workdir / "reconcile.log"
            )
        self._migrate_args = [*cli, "db", "upgrade", "--config", str(self.config)]

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        assert self.database_url is not None
        return {
            **os.environ,
            **self.extra_env,
            "RECEIPTS_DATABASE_URL": self.database_url,
            "RECEIPTS_SECRET": self.secret,
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> "Topology":
        try:
            if self.database_url is None:
                self.database_url = create_database(self.server_url)
                self._created_database = True
            self.migrate()
            for service in self.services.values():  # one after the other: the first proxy creates the CA
                service.start(self.env, self.workdir)
        except BaseException:
            self.stop()
            raise
        return self

    def migrate(self) -> None:
        """The compose file's one-shot `migrate` service."""
        result = subprocess.run(
            self._migrate_args, capture_output=True, text=True, env=self.env, cwd=str(self.workdir), timeout=120
        )
        (self.workdir / "migrate.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"receipts db upgrade failed ({result.returncode}): {(result.stdout + result.stderr).strip()}")

    def stop(self) -> None:
        """Stop every service (the worker first, then the proxies), then drop the database this topology
        created, unless told to keep it."""
        for service in sorted(self.services.values(), key=lambda s: s.port is not None):
            try:
                service.stop()
            except Exception:  # keep stopping the others
                service.kill()
        if self._created_database and not self.keep_database and self.database_url:
            try:
                drop_database(self.database_url)
            except Exception as e:  # the server went away: nothing left to drop
                print(f"topology: could not drop {self.database_url}: {e}", file=sys.stderr)
            self._created_database = False
        if self._own_workdir and not self.keep_database:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Topology":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- one service ----------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        self.services[name].kill()

    def start_service(self, name: str) -> None:
        self.services[name].start(self.env, self.workdir)

    def restart_dead(self) -> list[str]:
        """Start again every service that exited (not more often than RESTART_BACKOFF); returns their names."""
        restarted = []
        for service in self.services.values():
            if service.proc is not None and not service.alive and time.monotonic() - service._last_start >= RESTART_BACKOFF:
                service.restarts += 1
                service.start(self.env, self.workdir)
                restarted.append(service.name)
        return restarted

    # -- what it runs ---------------------------------------------------------------------------------------

    @property
    def proxy_ports(self) -> list[int]:
        return [s.port for s in self.services.values() if s.port is not None]

    @property
    def proxy_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.proxy_ports]

    def describe(self) -> dict[str, Any]:
        from sqlalchemy.engine import make_url

        assert self.database_url is not None
        return {
            "proxies": {name: s.port for name, s in self.services.items() if s.port is not None},
            "proxy_urls": self.proxy_urls,
            "pids": {name: s.proc.pid for name, s in self.services.items() if s.proc is not None},
            "database_url": make_url(self.database_url).render_as_string(hide_password=True),
            "config": str(self.config),
            "workdir": str(self.workdir),
            "logs": {name: str(s.log_path) for name, s in self.services.items()},
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL URL to use (default: a fresh database on --server-url)")
    parser.add_argument("--server-url", help=f"PostgreSQL server for the fresh database (default {DEFAULT_SERVER_URL})")
    parser.add_argument("--config", default=str(REPO / "config.yaml"), help="config file, as compose mounts it")
    parser.add_argument("--proxies", type=int, default=2, help="proxy replicas (default 2)")
    parser.add_argument("--no-reconcile", action="store_true", help="do not start the reconcile worker")
    parser.add_argument("--workdir", help="where logs and the mitmproxy CA go (default a new temporary directory)")
    parser.add_argument("--keep-database", action="store_true", help="do not drop the fresh database (nor the workdir) on exit")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    topology = Topology(
        database_url=args.database_url,
        config=args.config,
        proxies=args.proxies,
        reconcile=not args.no_reconcile,
        workdir=args.workdir,
        server_url=args.server_url,
        keep_database=args.keep_database,
    )
    try:
        topology.start()
    except Exception as e:
        print(f"topology: {e}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(topology.describe()), flush=True)
        while not stop.wait(1.0):
            try:
                for name in topology.restart_dead():
                    print(f"topology: {name} had exited; started it again", file=sys.stderr, flush=True)
            except RuntimeError as e:  # it failed to start again: say so, try again later
                print(f"topology: {e}", file=sys.stderr, flush=True)
    finally:
        topology.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
