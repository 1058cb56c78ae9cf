"""Clock skew between replicas breaks neither heartbeats nor leases: the database's clock is the reference.

Real processes whose clocks are two hours off, on one PostgreSQL: `receipts proxy` and `receipts reconcile`
run under libfaketime (LD_PRELOAD, FAKETIME="-2h" or "+2h"; the monotonic clock is left alone), beside a
proxy or a worker on the true clock. scripts/ensure-faketime (called by `make test`) installs libfaketime.

Heartbeats (every 0.5 s, dead after 4 s): while both proxies live, each has a write in flight for longer
than instance_dead_after, and neither recovers the other's receipt; a proxy judged by a skewed clock would
be. Then one of them freezes (SIGSTOP: its pid stays alive, so only its silent heartbeat can tell, as for a
replica on another machine), and the other recovers its in-flight receipt, not before instance_dead_after
and not much later.

Leases (6 s): a lease taken by a skewed worker (`reconcile --once`, killed during its read) expires by the
database's clock, so a true-clock worker neither takes it early nor fails to take it back once it ran out.
From the other side, a skewed `reconcile --loop` worker leaves alone the lease of a true-clock worker that
died (its claim made directly in the store) until it expired, then takes it back; meanwhile it takes a due
retry at once, leaves one that is not due, and retries a failed read after its backoff, by the database's
clock.
"""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import IN_CI, migrate
from sqlalchemy import func, select
from support.e2e import open_store, proxy_client, settled, stop_process, wait_for
from support.proxy import REPO, start_proxy_process
from support.store import recorded
from support.upstream import Upstream, start_upstream

from proxy_addon.config import parse_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.rules.records import Intent
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.instances import instances

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEWS = {"-2h": -7200.0, "+2h": 7200.0}
HEARTBEAT, DEAD_AFTER, LEASE = 0.5, 4.0, 6.0  # generous: the suite may share a busy machine


def faketime_env(skew: str) -> dict[str, str]:
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.fixture(scope="module")
def faketime() -> None:
    """libfaketime present and moving Python's wall clock (not its monotonic one) in a child process."""
    problem = None
    if not LIBFAKETIME.exists():
        problem = f"{LIBFAKETIME} is missing (scripts/ensure-faketime installs it)"
    else:
        probe = "import time; print(time.time(), time.monotonic())"
        for skew, offset in SKEWS.items():
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True,
                                 env={**os.environ, **faketime_env(skew)})
            wall, mono = (float(x) for x in out.stdout.split())
            if abs(wall - time.time() - offset) > 60 or abs(mono - time.monotonic()) > 60:
                problem = f"FAKETIME={skew} gave wall {wall - time.time():+.0f}s, monotonic {mono - time.monotonic():+.0f}s"
    if problem:
        if IN_CI:
            pytest.fail(f"libfaketime is required under CI=true: {problem}", pytrace=False)
        pytest.skip(problem)


@pytest.fixture
def pg(pg_url: str, faketime) -> Iterator[tuple[str, ReceiptStore]]:
    migrate(pg_url)
    with open_store(pg_url) as store:
        yield pg_url, store


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = start_upstream()
    up.absent = PROBE  # it holds every thing but the verifier controls' probe: its lookup rule is proven to see
    try:
        yield up
    finally:
        up.stop()


def db_now(store: ReceiptStore) -> datetime:
    with store.engine.connect() as c:
        return c.execute(select(func.now())).scalar_one()


# -- heartbeats -------------------------------------------------------------------------------------------------


def proxy_config(tmp: Path, name: str) -> Path:
    """Each replica its own file (replicas start in parallel); the same secret_file for both."""
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning, format: json}\n"
        "defaults: {upstream_timeout: 20s, connect_timeout: 2s}\n"
        f"proxy: {{heartbeat_interval: {HEARTBEAT}s, instance_dead_after: {DEAD_AFTER}s}}\n"
    )
    return path


class Replica:
    """A `receipts proxy` process, on the true clock or a skewed one."""

    def __init__(self, name: str, url: str, tmp: Path, skew: str | None):
        self.name, self.skew = name, skew
        self.log = tmp / f"{name}.log"
        self.proc, self.port = start_proxy_process(
            proxy_config(tmp, name), url, tmp / f"confdir-{name}", self.log, env=faketime_env(skew) if skew else None
        )
        self.answers: list[httpx.Response | Exception] = []

    def instance_id(self, store: ReceiptStore) -> str:
        with store.engine.connect() as c:
            found = wait_for(lambda: c.execute(select(instances.c.instance_id).where(instances.c.pid == self.proc.pid)).scalar(), 10)
        assert found, f"{self.name} never registered: {self.log.read_text()[-2000:]}"
        return found

    def post_in_background(self, url: str, body: dict) -> threading.Thread:
        def send() -> None:
            try:
                with proxy_client(f"http://127.0.0.1:{self.port}", timeout=30) as client:
                    self.answers.append(client.post(url, json=body))
            except httpx.HTTPError as e:  # the frozen replica is killed under its client
                self.answers.append(e)

        t = threading.Thread(target=send, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # also ends a SIGSTOPped process
            self.proc.wait(10)


def receipt_of(store: ReceiptStore, marker: str):
    for r in store.receipts.list(limit=None):
        if r.request_body and marker.encode() in r.request_body:
            return r
    return None


@pytest.mark.parametrize(
    ("skew", "frozen"),
    # the deaths a judge by its own clock would miss: a replica running ahead (its heartbeat would look fresh
    # for two hours), and one on the true clock seen from one running behind. The other two pairs would be
    # taken for dead while alive, which the live phase of these two already rules out, for both skews.
    [("+2h", "skewed"), ("-2h", "true")],
)
def test_heartbeats_use_database_time(pg, upstream, tmp_path, skew, frozen):
    url, store = pg
    replicas: dict[str, Replica] = {}
    try:
        starters = [threading.Thread(target=lambda n=n, s=s: replicas.__setitem__(n, Replica(n, url, tmp_path, s)))
                    for n, s in (("true", None), ("skewed", skew))]
        for t in starters:
            t.start()
        for t in starters:
            t.join(60)
        assert set(replicas) == {"true", "skewed"}, "a replica did not start"
        ids = {n: r.instance_id(store) for n, r in replicas.items()}

        # both alive, each with a write in flight for longer than instance_dead_after: nobody is recovered
        markers = {n: f"live-{n}-{uuid.uuid4().hex[:8]}" for n in replicas}
        senders = [r.post_in_background(upstream.base + f"/slow?seconds={DEAD_AFTER + 1.5}", {"m": markers[n]})
                   for n, r in replicas.items()]
        assert wait_for(lambda: all(receipt_of(store, m) for m in markers.values()), 10), "writes were not journaled"
        for t in senders:
            t.join(20)
        for n, r in replicas.items():
            answer = r.answers[-1]
            assert isinstance(answer, httpx.Response), (n, answer)
            assert answer.status_code == 201 and answer.headers["X-Receipt-State"] == "succeeded", (n, answer.text)
            receipt = settled(store, receipt_of(store, markers[n]).operation_id)
            assert receipt.state == State.SUCCEEDED and receipt.proxy_instance == ids[n]
            assert all(h.detail.get("error") != "proxy_interrupted" for h in store.receipts.history(receipt.operation_id))
        now = db_now(store)
        with store.engine.connect() as c:
            rows = {r.instance_id: r for r in c.execute(select(instances).where(instances.c.instance_id.in_(ids.values())))}
        for n, iid in ids.items():
            assert rows[iid].recovered_at is None, f"the live {n} replica was recovered"
            assert abs((now - rows[iid].heartbeat_at).total_seconds()) < 2, f"{n} heartbeat {rows[iid].heartbeat_at} vs db {now}"
        assert store.instances.dead(None, DEAD_AFTER) == []

        # one freezes with a write in flight; the other recovers it after instance_dead_after, by database time
        victim, survivor = replicas[frozen], replicas["skewed" if frozen == "true" else "true"]
        marker = f"frozen-{uuid.uuid4().hex[:8]}"
        victim.post_in_background(upstream.base + f"/slow?seconds={DEAD_AFTER + 6}", {"m": marker})
        assert wait_for(lambda: (r := receipt_of(store, marker)) and r.state == State.SUBMITTED, 10)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        recovered = wait_for(lambda: (r := receipt_of(store, marker)) and r.state != State.SUBMITTED and r, DEAD_AFTER + 10, 0.05)
        took = time.monotonic() - frozen_at
        assert recovered, f"the frozen {frozen} replica's receipt was never recovered"
        assert (recovered.state, recovered.error_code) == (State.OUTCOME_UNKNOWN, "proxy_interrupted")
        last = store.receipts.history(recovered.operation_id)[-1].detail
        assert last["who"] == ids[survivor.name] and last["dead_instance"] == ids[frozen]
        assert DEAD_AFTER - HEARTBEAT - 0.3 <= took <= DEAD_AFTER + 5, f"recovered {took:.2f}s after the freeze"
    finally:
        for r in replicas.values():
            r.stop()


# -- leases -----------------------------------------------------------------------------------------------------


BACKOFF = 2.0
PROBE = "receipts-probe-"  # in every field a negative control's probe looks up by (reconcile/controls.py)


def reconcile_config(tmp: Path, up: Upstream, read_path: str, name: str) -> Path:
    """A lookup rule for `things.create` whose read is GET {read_path} on the upstream; and `fails.create`,
    whose read always answers 500 (a failed read: back to the queue with backoff)."""
    def rule(op: str, path: str, read: str) -> dict:
        return {
            "name": op, "method": "POST", "path": path, "retry_safe": True,
            "reconcile": {"strategy": "lookup", "url": "{scheme}://{netloc}" + read, "settle": "0s", "timeout": "30s",
                          "attempts": 5},
        }
    doc = {
        "secret_file": str(tmp / "secret"),
        "logging": {"level": "warning", "format": "json"},
        "reconcile": {"lease": f"{LEASE}s", "concurrency": 4, "per_host_rate": 1000, "batch_size": 10,
                      "backoff": f"{BACKOFF}s", "interval": "200ms"},
        "proxy": {"heartbeat_interval": f"{HEARTBEAT}s", "instance_dead_after": f"{DEAD_AFTER}s"},
        "hosts": {f"127.0.0.1:{up.port}": {"operations": [
            rule("things.create", "/things", read_path), rule("fails.create", "/fails", "/status/500/{operation_id}"),
        ]}},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    parse_config(path.read_text())  # a config the worker accepts
    return path


def unknown_receipt(store: ReceiptStore, up: Upstream, next_attempt_at: datetime | None = None, op: str = "things") -> str:
    planned = recorded(store, 
        Intent(operation=f"{op}.create", method="POST", scheme="http", host="127.0.0.1", port=up.port,
                  path=f"/{op}", intent_fingerprint="sha256:" + uuid.uuid4().hex * 2, account="acct:skew",
                  request_body=b'{"n":1}', request_body_size=7)
    )
    op = planned.operation_id
    store.receipts.transition(op, State.PLANNED, State.SUBMITTED, {"who": "test"})
    store.receipts.transition(op, State.SUBMITTED, State.OUTCOME_UNKNOWN, {"who": "test"}, error_code="upstream_timeout",
                     next_attempt_at=next_attempt_at)
    return op


def reconcile_process(url: str, config: Path, tmp: Path, skew: str | None, log_name: str, mode: str = "--once"):
    env = {**os.environ, "RECEIPTS_DATABASE_URL": url, **(faketime_env(skew) if skew else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "proxy_addon.cli", "reconcile", mode, "--config", str(config)],
        stdout=open(tmp / f"{log_name}.log", "ab"), stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
    )


def reconcile_once(url: str, config: Path, tmp: Path, skew: str | None, log_name: str) -> None:
    proc = reconcile_process(url, config, tmp, skew, log_name)
    try:
        assert proc.wait(60) == 0, (tmp / f"{log_name}.log").read_text()[-2000:]
    finally:
        stop_process(proc)


def true_clock_pass(store: ReceiptStore, config: Path, worker: str) -> int:
    """One in-process pass of a worker on this process's (true) clock; returns how many it claimed."""
    reconciler = Reconciler(parse_config(config.read_text()), store, worker_id=worker)
    return asyncio.run(reconciler.run_once()).claimed


def wait_past(store: ReceiptStore, moment: datetime) -> None:
    """Until the database's clock is past `moment` (bounded)."""
    assert wait_for(lambda: db_now(store) > moment + timedelta(milliseconds=50), LEASE + 10, 0.1)


def lease_of(store: ReceiptStore, op: str) -> tuple[str, str | None, datetime | None]:
    r = store.receipts.get(op)
    return r.state, r.lease_owner, r.lease_expires_at


@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_workers_lease_expires_by_database_time(pg, upstream, tmp_path, skew):
    url, store = pg
    op = unknown_receipt(store, upstream)
    slow = reconcile_config(tmp_path, upstream, "/slow/{operation_id}?seconds=30", "slow")
    fast = reconcile_config(tmp_path, upstream, "/things/{operation_id}", "fast")

    # the skewed worker claims, starts its (slow) read, and dies holding the lease
    holder = reconcile_process(url, slow, tmp_path, skew, "skewed-holder")
    try:
        claimed = wait_for(lambda: lease_of(store, op)[0] == State.RECONCILING and upstream.count("GET") > 0, 30)
        assert claimed, (tmp_path / "skewed-holder.log").read_text()[-2000:]
        held = lease_of(store, op)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    finally:
        stop_process(holder)
    _, owner, expires = held
    ttl = (expires - db_now(store)).total_seconds()
    assert 0 < ttl <= LEASE, f"lease written {ttl:+.0f}s from the database's now: not from its clock"

    # a true-clock worker right away: the lease is not its to take
    assert true_clock_pass(store, fast, "true-worker") == 0
    assert db_now(store) < expires, "the check came too late to say anything: make LEASE longer"
    assert lease_of(store, op) == held

    # once it ran out by the database's clock: released and taken back, and settled
    wait_past(store, expires)
    assert true_clock_pass(store, fast, "true-worker") == 1
    receipt = store.receipts.get(op)
    assert receipt.state == State.SUCCEEDED, receipt
    steps = [(h.from_state, h.to_state, h.detail.get("who")) for h in store.receipts.history(op)][2:]
    assert steps == [
        ("submitted", "outcome_unknown", "test"),
        ("outcome_unknown", "reconciling", owner),
        ("reconciling", "outcome_unknown", "true-worker"),
        ("outcome_unknown", "reconciling", "true-worker"),
        ("reconciling", "succeeded", "true-worker"),
    ]


@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_worker_takes_a_dead_workers_lease_only_once_it_expired(pg, upstream, tmp_path, skew):
    url, store = pg
    fast = reconcile_config(tmp_path, upstream, "/things/{operation_id}", "fast")
    worker = reconcile_process(url, fast, tmp_path, skew, "skewed-loop", "--loop")
    try:
        # the skewed worker is up once it settled a first receipt
        first = unknown_receipt(store, upstream)
        assert wait_for(lambda: store.receipts.get(first).state == State.SUCCEEDED, 30), (tmp_path / "skewed-loop.log").read_text()
        # while it is paused, a true-clock worker claims a receipt and dies; a retry that is due, one that is
        # not, and one whose read fails join the queue
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            held = unknown_receipt(store, upstream)
            [claim] = store.queue.claim("dead-true-worker", LEASE, 10)
            assert claim.operation_id == held
            now = db_now(store)
            due = unknown_receipt(store, upstream, next_attempt_at=now - timedelta(seconds=1))
            later = unknown_receipt(store, upstream, next_attempt_at=now + timedelta(minutes=10))
            failing = unknown_receipt(store, upstream, op="fails")
        finally:
            os.kill(worker.pid, signal.SIGCONT)

        # until the lease runs out by the database's clock, the skewed worker's passes leave it alone
        first_retry_wait = None
        while (now := db_now(store)) < claim.lease_expires_at - timedelta(milliseconds=300):
            assert worker.poll() is None, (tmp_path / "skewed-loop.log").read_text()[-2000:]
            assert lease_of(store, held) == (State.RECONCILING, "dead-true-worker", claim.lease_expires_at)
            put_back = store.receipts.get(failing)
            if put_back.reconcile_attempts == 1 and put_back.state == State.OUTCOME_UNKNOWN and first_retry_wait is None:
                # the database's now read after the row: the failure may be recorded after `now` above was read
                first_retry_wait = (put_back.next_attempt_at - db_now(store)).total_seconds()
            time.sleep(0.05)
        assert store.receipts.get(due).state == State.SUCCEEDED, "a due retry was not taken by the skewed worker"
        assert first_retry_wait is not None and 0 < first_retry_wait <= BACKOFF, (
            f"a failed read's retry set {first_retry_wait}s from the database's now, for {BACKOFF}s of backoff")

        # once it ran out: released, taken back and settled by the skewed worker
        settled = wait_for(lambda: store.receipts.get(held).state == State.SUCCEEDED, 10, 0.05)
        assert settled, (store.receipts.get(held), (tmp_path / "skewed-loop.log").read_text()[-2000:])
    finally:
        stop_process(worker)
    released = [h for h in store.receipts.history(held) if h.detail.get("reason") == "lease expired"]
    assert len(released) == 1 and released[0].detail["lease_owner"] == "dead-true-worker"
    later_now = store.receipts.get(later)
    assert later_now.state == State.OUTCOME_UNKNOWN and later_now.lease_owner is None  # not due yet, by the database
    retried = store.receipts.get(failing)  # retried after its backoff, not at once nor two hours late
    assert retried.state == State.OUTCOME_UNKNOWN and 2 <= retried.reconcile_attempts <= 4, retried
