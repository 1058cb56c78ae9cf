"""Parts the fault scenarios share: the config they run with, agents that send duplicate-prone writes from
several threads, a private PostgreSQL server that a test may stop, a SQLite file made unwritable, and
scripts/topology.py loaded as a module. Every loop here is bounded in count and in time."""

import importlib.util
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import yaml
from support.e2e import open_store
from support.recording_upstream import REJECT, RESET, SEND_HEADER, SLOW, SUCCESS, RecordingUpstream

from faults.invariants import Told

REPO = Path(__file__).resolve().parents[2]
PG_BIN = Path(os.environ.get("RECEIPTS_PG_BIN", "/usr/lib/postgresql/15/bin"))
PROBLEM_JSON = "application/problem+json"


def load_topology() -> ModuleType:
    """scripts/topology.py (not a package) as the module `topology`."""
    if "topology" in sys.modules:
        return sys.modules["topology"]
    spec = importlib.util.spec_from_file_location("topology", REPO / "scripts" / "topology.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["topology"] = module
    spec.loader.exec_module(module)
    return module


# -- config ---------------------------------------------------------------------------------------------------


def fault_config(
    tmp_path: Path,
    upstream: RecordingUpstream,
    proxy: dict[str, Any] | None = None,
    reconcile: dict[str, Any] | None = None,
    upstream_timeout: str = "5s",
    read_timeout: str = "10s",
) -> Path:
    """A config for the recording upstream: its writes are the rule `faults.items`, sent with the receipt's
    operation id as Idempotency-Key (so the upstream knows which receipt each write came under), and
    reconciled by looking the item up by its tag."""
    document = {
        "secret_file": str(tmp_path / "secret"),
        "logging": {"level": "info", "format": "json"},
        "proxy": {"heartbeat_interval": "500ms", "instance_dead_after": "3s", **(proxy or {})},
        "reconcile": {"interval": "300ms", "lease": "3s", "concurrency": 8, "per_host_rate": 1000, "backoff": "200ms",
                      **(reconcile or {})},
        "hosts": {
            upstream.netloc: {
                "upstream_timeout": upstream_timeout,
                "inject_idempotency_key": True,
                "operations": [
                    {
                        "name": "faults.items",
                        "method": "POST",
                        "path": "/items",
                        "external_id": "$.id",
                        "retry_safe": True,
                        "reconcile": {
                            "strategy": "lookup",
                            "url": "{scheme}://{netloc}/items/{body.tag}",
                            "match": {"$.tag": "$.tag"},
                            "id": "$.id",
                            "settle": "0s",
                            "timeout": read_timeout,
                        },
                    }
                ],
            }
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# -- agents ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    tag: str
    mode: str
    seconds: float = 0.0

    def body(self) -> dict[str, Any]:
        document: dict[str, Any] = {"tag": self.tag, "mode": self.mode}
        if self.mode == SLOW:
            document["seconds"] = self.seconds
        return document


def intent_pool(n: int, mix: dict[str, float], seed: int, slow_seconds: float = 0.8) -> list[Intent]:
    """n intents with modes drawn by weight from `mix` (success, slow, reset, reject)."""
    rng = random.Random(seed)
    modes, weights = zip(*mix.items())
    prefix = uuid.uuid4().hex[:6]
    return [Intent(f"{prefix}-{i}", rng.choices(modes, weights)[0], slow_seconds) for i in range(n)]


MIXED = {SUCCESS: 0.5, SLOW: 0.25, RESET: 0.15, REJECT: 0.10}


@dataclass(frozen=True)
class Sent:
    send_id: str
    tag: str
    proxy: str
    status: int | None  # None: the connection to the proxy failed (it was killed, or not there)
    receipt_id: str | None
    receipt_state: str | None
    problem: str | None  # the problem+json type's last segment
    detail: str | None
    replayed: bool
    error: str | None
    started: float  # time.monotonic() when it was sent
    ended: float  # ... and when its answer (or error) came


def send(client: httpx.Client, proxy: str, url: str, intent: Intent) -> Sent:
    send_id = uuid.uuid4().hex
    started = time.monotonic()
    try:
        r = client.post(url, json=intent.body(), headers={SEND_HEADER: send_id})
    except httpx.HTTPError as e:
        error = f"{type(e).__name__}: {e}"
        return Sent(send_id, intent.tag, proxy, None, None, None, None, None, False, error, started, time.monotonic())
    problem = detail = None
    if r.headers.get("content-type", "").startswith(PROBLEM_JSON):
        document = r.json()
        problem, detail = document.get("type", "").rsplit(":", 1)[-1], document.get("detail")
    return Sent(
        send_id,
        intent.tag,
        proxy,
        r.status_code,
        r.headers.get("X-Receipt-Id"),
        r.headers.get("X-Receipt-State"),
        problem,
        detail,
        r.headers.get("X-Receipt-Replayed") == "true",
        None,
        started,
        time.monotonic(),
    )


def proxy_client(proxy_url: str, timeout: float = 15.0) -> httpx.Client:
    return httpx.Client(proxy=proxy_url, trust_env=False, timeout=timeout)


@dataclass
class Agents:
    """`threads` agents, each sending at most `per_thread` writes, picked at random from `intents` (so that
    several agents send the same intent at once), to a proxy picked at random, until `stop()` or `seconds`."""

    proxies: list[str]
    url: str
    intents: list[Intent]
    threads: int = 6
    per_thread: int = 60
    seconds: float = 20.0
    seed: int = 1
    pause_after_error: float = 0.05
    sent: list[Sent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "Agents":
        self._stop.clear()
        deadline = time.monotonic() + self.seconds
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(random.Random(self.seed * 1000 + i), deadline), daemon=True)
            self._workers.append(t)
            t.start()
        return self

    def _run(self, rng: random.Random, deadline: float) -> None:
        clients = {p: proxy_client(p) for p in self.proxies}
        try:
            for _ in range(self.per_thread):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                proxy = rng.choice(self.proxies)
                result = send(clients[proxy], proxy, self.url, rng.choice(self.intents))
                with self._lock:
                    self.sent.append(result)
                if result.status is None or result.status == 503:  # the proxy or its journal is down
                    self._stop.wait(self.pause_after_error)
        finally:
            for c in clients.values():
                c.close()

    def join(self, timeout: float = 20.0) -> list[Sent]:
        """Wait for the agents to finish on their own (count or `seconds` reached); returns what they sent."""
        for t in self._workers:
            t.join(self.seconds + timeout)
        return self.stop(timeout)

    def stop(self, timeout: float = 20.0) -> list[Sent]:
        self._stop.set()
        for t in self._workers:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._workers), "an agent thread did not finish"
        self._workers.clear()
        return self.results()

    def results(self) -> list[Sent]:
        with self._lock:
            return list(self.sent)


REFUSALS = frozenset({"duplicate-open", "duplicate-succeeded", "idempotency-key-mismatch"})


def answered_ids(sent: list[Sent]) -> list[Told]:
    """The receipts the agents were answered with, and what each answer told of its own receipt (a refusal or a
    replay names another write's receipt, in whatever state it had then: it tells nothing of its own)."""
    return [
        Told(s.receipt_id, None if s.replayed or s.problem in REFUSALS else s.receipt_state)
        for s in sent
        if s.receipt_id
    ]


def burst(proxies: list[str], url: str, intent: Intent, per_proxy: int) -> list[Sent]:
    """`per_proxy` agents on each proxy send the same intent at the same moment (a barrier); bounded by the
    client timeout."""
    n = per_proxy * len(proxies)
    barrier = threading.Barrier(n, timeout=15)
    results: list[Sent] = []
    lock = threading.Lock()

    def one(proxy: str) -> None:
        with proxy_client(proxy) as client:
            client.get(url.rsplit("/", 1)[0] + "/warm-up")  # connect first: the POSTs then leave together
            barrier.wait()
            result = send(client, proxy, url, intent)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in proxies for _ in range(per_proxy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a burst agent did not finish"
    return results


# -- a private PostgreSQL server --------------------------------------------------------------------------------


def private_postgres_problem() -> str | None:
    """Why a private PostgreSQL cannot be run here, or None."""
    if os.geteuid() != 0:
        return "the tests do not run as root, so they cannot run initdb as the postgres user"
    if shutil.which("runuser") is None:
        return "runuser is missing"
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        return f"no initdb/pg_ctl in {PG_BIN} (set RECEIPTS_PG_BIN)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no postgres user"
    return None


class PrivatePostgres:
    """A PostgreSQL server of its own, in a temporary directory owned by the postgres user, on a free
    loopback port (and a Unix socket in that directory): this test may stop it and start it again."""

    def __init__(self) -> None:
        from support.server import free_port

        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="receipts-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True, timeout=timeout, cwd=str(self.dir)
        )
        if result.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(result.stdout + result.stderr).strip()[-1500:]}")

    def init(self) -> "PrivatePostgres":
        initdb = str(PG_BIN / "initdb")
        self._as_postgres(initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        pg_ctl = str(PG_BIN / "pg_ctl")
        self._as_postgres(pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop: `fast` ends every session at once (the proxy's pooled connections die with it)."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- a SQLite file that cannot be written ------------------------------------------------------------------------


@contextmanager
def unwritable_sqlite(db_path: Path) -> Iterator[str]:
    """While inside, nobody, root included, can write the SQLite database: `chattr +i` (immutable) on the
    database file, its write-ahead log and their directory (so no new journal file can be made either).
    The -shm index is left alone: SQLite maps it into memory, and an immutable mapping kills the process
    with SIGBUS. Where chattr is not possible (no chattr, a file system without the flag), a trigger that
    refuses every new receipt stands in. Yields which one: "chattr +i" or "trigger"."""
    targets = [p for p in (db_path, Path(f"{db_path}-wal"), db_path.parent) if p.exists()]
    chattr = shutil.which("chattr")
    applied: list[Path] = []
    try:
        if chattr is not None:
            for p in targets:
                if subprocess.run([chattr, "+i", str(p)], capture_output=True).returncode != 0:
                    break
                applied.append(p)
        if chattr is not None and len(applied) == len(targets):
            yield "chattr +i"
            return
    finally:
        for p in reversed(applied):
            subprocess.run([chattr or "chattr", "-i", str(p)], capture_output=True)
    from support.e2e import failing_receipt_writes

    with failing_receipt_writes(f"sqlite:///{db_path}", "INSERT"):  # no new receipt can be written
        yield "trigger"


def unsettled(database: str) -> list:
    """The receipts still `planned` or `submitted`."""
    with open_store(database) as store:
        return store.receipts.list(states=["planned", "submitted"], limit=None)


def journaled_since(agents: Agents, since: float) -> list[Sent]:
    """The agents' writes sent after `since` (time.monotonic()) that were journaled and answered by the upstream."""
    return [s for s in agents.results() if s.started > since and s.receipt_id and s.status in (201, 422)]
