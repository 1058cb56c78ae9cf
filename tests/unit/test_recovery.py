"""Proxy instances' liveness (recovery.py) on a real SQLite journal: which dead instances a sweep recovers (a dead
pid in this process namespace at once, a silent one elsewhere only after `dead_after`), and a live instance's own
orphans, settled while the requests still working are left alone. What recovery writes into each receipt, on both
databases: test_store_recovery.py."""

import asyncio
import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.store import S, intent, migrated_sqlite, recorded, store_copied_from, walk

from proxy_addon.recovery import InstanceLiveness, new_instance_id, pid_alive, process_namespace
from proxy_addon.store import ReceiptStore

HOUR = 3600.0


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return migrated_sqlite(tmp_path_factory.mktemp("recovery"))


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Iterator[ReceiptStore]:
    """A journal of its own for each test (instances are global to a journal), copied from one migrated file."""
    with store_copied_from(template, tmp_path / "receipts.db") as store:
        yield store


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not pid_alive(child.pid)
    return child.pid


def at(store: ReceiptStore, instance: str, state: S) -> str:
    op = recorded(store, intent(proxy_instance=instance)).operation_id
    walk(store, op, state)
    return op


def test_a_dead_pid_in_this_namespace_is_recovered_at_once_and_a_live_one_or_another_hosts_is_not(store, dead_pid):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=HOUR)
    here = me.hostname
    store.instances.register("me", here, os.getpid())
    store.instances.register("killed", here, dead_pid)
    store.instances.register("alive", here, os.getpid())
    store.instances.register("elsewhere", "another-host/boot/ns", dead_pid)  # its pids are not ours to check
    ops = {who: at(store, who, S.SUBMITTED) for who in ("me", "killed", "alive", "elsewhere")}

    assert me.sweep() == 1
    states = {who: store.receipts.get(op).state for who, op in ops.items()}
    assert states == {"me": "submitted", "killed": "outcome_unknown", "alive": "submitted", "elsewhere": "submitted"}
    assert store.receipts.history(ops["killed"])[-1].detail == {"who": "me", "error": "proxy_interrupted", "dead_instance": "killed"}
    assert me.sweep() == 0  # recovered once, not again


def test_in_an_unknown_namespace_no_pid_is_trusted(store, dead_pid):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=HOUR)
    me.hostname = "host/?/?"  # no boot id or pid namespace readable: a pid may be another machine's
    store.instances.register("killed", me.hostname, dead_pid)
    op = at(store, "killed", S.SUBMITTED)
    assert me.sweep() == 0 and store.receipts.get(op).state == "submitted"


def test_an_instance_that_stopped_is_recovered_wherever_it_ran(store):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=HOUR)
    store.instances.register("gone", "another-host/boot/ns", 4242)
    submitted, planned = at(store, "gone", S.SUBMITTED), at(store, "gone", S.PLANNED)
    store.instances.stop("gone")
    assert me.sweep() == 2
    assert (store.receipts.get(submitted).state, store.receipts.get(planned).state) == ("outcome_unknown", "rejected")


def test_a_sweep_never_recovers_the_sweeper_itself(store):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=0.0)  # everyone's heartbeat is stale
    store.instances.register("me", me.hostname, os.getpid())
    op = at(store, "me", S.SUBMITTED)
    store.instances.stop("me")
    assert me.sweep() == 0 and store.receipts.get(op).state == "submitted"


def test_own_orphans_are_settled_and_the_requests_still_working_are_left_alone(store):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=HOUR)
    working, orphan, unsent = at(store, "me", S.SUBMITTED), at(store, "me", S.SUBMITTED), at(store, "me", S.PLANNED)
    others = at(store, "other", S.SUBMITTED)
    done = at(store, "me", S.SUCCEEDED)

    with ThreadPoolExecutor(1) as pool:
        settled = asyncio.run(me.sweep_own_orphans(pool, lambda: frozenset({working})))

    assert settled == 2
    got = {op: store.receipts.get(op) for op in (working, orphan, unsent, others, done)}
    assert [got[op].state for op in (working, orphan, unsent, others, done)] == [
        "submitted", "outcome_unknown", "rejected", "submitted", "succeeded"]
    assert (got[orphan].error_code, got[unsent].error_code) == ("verdict_not_recorded", "not_sent")
    assert store.receipts.history(orphan)[-1].detail == {"who": "me", "error": "verdict_not_recorded", "orphaned_by": "me"}


def test_with_nothing_unsettled_the_in_flight_set_is_not_even_asked_for(store):
    me = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=HOUR)
    at(store, "me", S.SUCCEEDED)

    def in_flight() -> frozenset[str]:
        raise AssertionError("asked for the in-flight set with nothing to compare it with")

    with ThreadPoolExecutor(1) as pool:
        assert asyncio.run(me.sweep_own_orphans(pool, in_flight)) == 0


def test_instance_ids_pids_and_the_namespace():
    a, b = new_instance_id(), new_instance_id()
    assert a != b and re.fullmatch(rf".{{1,32}}-{os.getpid()}-[0-9a-f]{{8}}", a)
    assert pid_alive(os.getpid()) and pid_alive(1)  # pid 1: alive, though not ours to signal
    namespace = process_namespace()
    assert namespace == process_namespace() and len(namespace) <= 255 and namespace.count("/") >= 2


def test_an_instance_whose_heartbeats_stalled_may_have_been_taken_for_dead(store):
    """What the handler asks before each send (handler.py, `_stalled`), read off the monotonic clock, which goes on
    while the process is frozen: the last heartbeat began over instance_dead_after less one interval ago, or one
    came that late since the mark (a frozen process whose heartbeat thread beat again before the request went on)."""
    liveness = InstanceLiveness(store, "me", heartbeat_interval=1.0, dead_after=10.0)  # a stall: over 9 s
    assert liveness.stall_limit == 9.0
    assert InstanceLiveness(store, "me", heartbeat_interval=8.0, dead_after=10.0).stall_limit == 5.0
    mark = liveness.mark()
    assert not liveness.lost_since(mark)  # no heartbeat yet: registering is the first
    liveness.register()
    liveness.beat_at = time.monotonic() - 8.5
    assert not liveness.lost_since(mark)
    liveness.beat_at = time.monotonic() - 9.5
    assert liveness.lost_since(mark)
    liveness.beat()  # 9.5 s after the one before: a gap
    assert liveness.lost_since(mark) and not liveness.lost_since(liveness.mark())
    liveness.beat()
    assert not liveness.lost_since(liveness.mark())
