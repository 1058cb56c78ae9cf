"""The Heartbeat addon (addons/heartbeat.py) on a real SQLite journal: at start it registers this instance and
recovers the dead ones' receipts; while it runs it settles this instance's own orphans and leaves the requests
still working alone; when it is done the instance is stopped, so that another recovers what it left. Which
instance is dead, and what recovery writes: test_recovery.py."""

import asyncio
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.store import S, intent, migrated_sqlite, recorded, store_copied_from, walk

from proxy_addon.addons.heartbeat import Heartbeat
from proxy_addon.config import parse_config
from proxy_addon.recovery import InstanceLiveness, process_namespace
from proxy_addon.store import ReceiptStore

HOUR = 3600.0


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return migrated_sqlite(tmp_path_factory.mktemp("heartbeat"))


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Iterator[ReceiptStore]:
    with store_copied_from(template, tmp_path / "receipts.db") as store:
        yield store


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


def journal_state(store: ReceiptStore, executor: ThreadPoolExecutor, in_flight: set[str]) -> SimpleNamespace:
    """The Receipts addon as Heartbeat sees it (addons/state.py, ReceiptsState): configured, with a handler whose
    in-flight set is this one."""
    config = parse_config("proxy: {heartbeat_interval: 1h, instance_dead_after: 1h}")
    return SimpleNamespace(config=config, store=store, executor=executor, handler=SimpleNamespace(in_flight=in_flight),
                           instance_id="me", journal=None, in_flight=lambda: frozenset(in_flight))


def at(store: ReceiptStore, instance: str, state: S) -> str:
    op = recorded(store, intent(proxy_instance=instance)).operation_id
    walk(store, op, state)
    return op


async def until(done: Callable[[], bool], within: float = 10.0) -> None:
    """Poll (bounded) for what a task does on its own."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not done():
        assert loop.time() < deadline, "not done in time"
        await asyncio.sleep(0.005)


def test_it_registers_recovers_the_dead_settles_its_orphans_and_stops(store, executor):
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.instances.register("killed", process_namespace(), dead.pid)
    killed_op = at(store, "killed", S.SUBMITTED)
    working, orphan = at(store, "me", S.SUBMITTED), at(store, "me", S.SUBMITTED)
    heartbeat = Heartbeat(journal_state(store, executor, {working}))

    async def life() -> None:
        await heartbeat.running()
        assert store.receipts.get(killed_op).state == "outcome_unknown"  # recovered before it goes on
        assert ("me", os.getpid()) in store.instances.on_host(process_namespace())
        await until(lambda: store.receipts.get(orphan).state == "outcome_unknown")
        assert store.receipts.get(working).state == "submitted"
        await heartbeat.done()

    asyncio.run(life())
    assert heartbeat._task is not None and heartbeat._task.cancelled()
    left = at(store, "me", S.PLANNED)  # written after it stopped: what another instance must settle
    assert InstanceLiveness(store, "other", 1.0, HOUR).sweep() == 2  # `working` and `left`: `me` stopped
    assert (store.receipts.get(working).state, store.receipts.get(left).state) == ("outcome_unknown", "rejected")


def test_before_the_journal_is_configured_it_does_nothing():
    unconfigured = SimpleNamespace(config=None, store=None, executor=None, handler=None, instance_id="me", journal=None,
                                   in_flight=frozenset)
    heartbeat = Heartbeat(unconfigured)

    async def life() -> None:
        await heartbeat.running()
        await heartbeat.done()

    asyncio.run(life())
    assert heartbeat.liveness is None and heartbeat._task is None


def test_it_heartbeats_on_a_thread_of_its_own_while_every_database_thread_is_busy(store, executor):
    """A stall that fills the database threads the requests share must not stop the heartbeat: a replica would
    take this live proxy for dead and recover its receipts under it."""
    release = threading.Event()
    heartbeat = Heartbeat(journal_state(store, executor, set()))
    for _ in range(2):  # both of the fixture's threads
        executor.submit(release.wait, 30)

    async def life() -> None:
        try:
            await asyncio.wait_for(heartbeat.running(), 10)  # registered and swept with the threads all busy
            assert ("me", os.getpid()) in store.instances.on_host(process_namespace())
        finally:
            release.set()
            await heartbeat.done()

    asyncio.run(life())


def test_its_heartbeats_after_the_start_are_on_its_own_thread_too(store, executor, monkeypatch):
    """Not only the registration: the heartbeats that follow run on the heartbeat's thread while every
    database thread the requests share is busy (else the first one waits for them, and a replica takes this
    live proxy for dead)."""
    release, beat = threading.Event(), threading.Event()
    heartbeat_of = store.instances.heartbeat

    def spied(instance_id: str) -> None:
        heartbeat_of(instance_id)
        beat.set()

    monkeypatch.setattr(store.instances, "heartbeat", spied)
    heartbeat = Heartbeat(journal_state(store, executor, set()))
    for _ in range(2):  # both of the fixture's threads
        executor.submit(release.wait, 30)

    async def life() -> None:
        try:
            await asyncio.wait_for(heartbeat.running(), 10)
            assert await asyncio.to_thread(beat.wait, 10), "no heartbeat while the database threads were busy"
        finally:
            release.set()
            await heartbeat.done()

    asyncio.run(life())
