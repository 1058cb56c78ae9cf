"""Two proxy replicas and a reconcile worker on one PostgreSQL, as docker-compose.yml runs them, started by
scripts/topology.py (its `Topology`, the very code docs/operations.md describes) on loopback ports.

Bursts of one intent are sent to both replicas at the same moment (five agents on each, behind a barrier):
the upstream sees each intent exactly once; every other agent, on either replica, is refused
(409 duplicate-open) or answered from the receipt (replayed), always naming the one receipt. The worker
settles the reset one by reading the upstream. Then mixed, duplicate-prone load goes to both replicas while
one of them is SIGKILLed while it holds a write: the other one (or the worker) recovers its receipts
without a restart, and the invariants hold.
"""

import os
import signal
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import select
from support.e2e import open_store, wait_for
from support.recording_upstream import RESET, SLOW, SUCCESS

from faults.fault_harness import MIXED, Agents, Intent, answered_ids, burst, fault_config, intent_pool, load_topology
from faults.invariants import check_scenario
from proxy_addon.db import make_engine
from proxy_addon.journal.tables import ProxyInstance

BURST_MODES = [SUCCESS, SLOW, RESET, SLOW]  # no reject: a rejected receipt invites a retry
PER_PROXY = 5
HELD_SECONDS = 8.0  # how long the upstream holds the write proxy-1 is killed under: far longer than the kill takes


def slow(receipts: list) -> list:
    """The receipts of slow writes: still in the upstream's hands for a while."""
    return [r for r in receipts if b'"mode":"slow"' in (r.request_body or b"")]


def test_bursts_to_both_replicas_are_forwarded_once_and_a_dead_replica_is_recovered(pg_server, upstream, tmp_path):
    Topology = load_topology().Topology
    config = fault_config(tmp_path, upstream)
    sent = []
    with Topology(config=config, workdir=tmp_path / "topology", server_url=pg_server) as topology:
        database = topology.database_url
        proxies = topology.proxy_urls
        assert len(proxies) == 2 and topology.services["reconcile"].alive

        reset_receipt = None
        for i, mode in enumerate(BURST_MODES):
            intent = Intent(f"burst-{i}-{time.monotonic_ns()}", mode, 0.5)
            results = burst(proxies, upstream.items_url, intent, PER_PROXY)
            sent += results
            assert upstream.count(intent.tag) == 1, f"{mode} burst: the upstream saw it {upstream.count(intent.tag)} times"
            first = [s for s in results if s.problem != "duplicate-open" and not s.replayed]
            assert len(first) == 1, f"{mode} burst: {len(first)} answers not refused: {first}"
            expected = {SUCCESS: (201, None), SLOW: (201, None), RESET: (504, "outcome-unknown")}[mode]
            assert (first[0].status, first[0].problem) == expected, first[0]
            assert {s.receipt_id for s in results} == {first[0].receipt_id}, "an answer names another receipt"
            other = [s for s in results if s.proxy != first[0].proxy]
            assert len(other) == PER_PROXY and all(s.problem == "duplicate-open" or s.replayed for s in other)
            if mode == RESET:
                reset_receipt = first[0].receipt_id

        with open_store(database) as store:
            settled = wait_for(lambda: store.receipts.get(reset_receipt).state == "succeeded", 20, 0.2)
            assert settled, f"the worker did not settle the reset write: {store.receipts.get(reset_receipt).state}"
            assert store.receipts.history(reset_receipt)[-1].detail.get("result") == "present"

        # mixed load on both; one replica dies under it and is recovered by the survivor or the worker
        agents = Agents(proxies, upstream.items_url, intent_pool(20, MIXED, seed=5, slow_seconds=0.6), threads=6,
                        per_thread=60, seconds=12, seed=21).start()
        victim = topology.services["proxy-1"]
        try:
            with open_store(database) as store:
                def in_flight(states=("planned", "submitted")) -> list:
                    receipts = store.receipts.list(states=list(states), limit=None)
                    return [r for r in receipts if r.proxy_instance and f"-{victim.proc.pid}-" in r.proxy_instance]

                # kill it while the upstream holds a write it sent. The load's slow writes are held 0.6 s: one
                # seen `submitted` may have been answered already, its verdict still being committed, by the kill
                held = Intent(f"held-{time.monotonic_ns()}", SLOW, HELD_SECONDS)
                holder = threading.Thread(target=lambda: sent.extend(burst([victim.url], upstream.items_url, held, 1)))
                holder.start()
                holding = wait_for(lambda: upstream.count() >= len(BURST_MODES) + 8 and upstream.count(held.tag) == 1 and any(
                    held.tag.encode() in (r.request_body or b"") for r in in_flight(["submitted"])), 10, 0.02)
                assert holding, "proxy-1 never sent the held write"
                victim.kill()
                holder.join(30)
                recovered = wait_for(lambda: not in_flight(), 30, 0.2)
                assert recovered, f"the dead replica's receipts were not recovered: {in_flight()}"
                [held_receipt] = [r for r in store.receipts.list(limit=None) if held.tag.encode() in (r.request_body or b"")]
                steps = [(h.from_state, h.to_state, h.detail.get("error")) for h in store.receipts.history(held_receipt.operation_id)]
        finally:
            sent += agents.stop()
        assert ("submitted", "outcome_unknown", "proxy_interrupted") in steps, f"the held write was not recovered: {steps}"
        with open_store(database) as store:
            assert wait_for(lambda: not store.receipts.list(states=["planned", "submitted"], limit=None), 10, 0.1)
        check_scenario("two replicas, bursts and a replica killed (postgresql)", database, upstream.received(),
                       len(sent), answered_ids(sent))


def instance_row(database: str, pid: int) -> dict | None:
    engine = make_engine(database)
    try:
        with engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(select(ProxyInstance.__table__).where(ProxyInstance.pid == pid))]
    finally:
        engine.dispose()
    return rows[-1] if rows else None


def test_a_replica_stalled_past_dead_after_and_later_killed_is_recovered_again(pg_server, upstream, tmp_path):
    """proxy-1 is frozen (SIGSTOP) for longer than `instance_dead_after`: the other replica and the worker
    cannot tell it from a dead one, and recover its receipts. It wakes up (SIGCONT), heartbeats and serves
    again. When it is SIGKILLed later, holding a write, its receipts must be recovered once more, within 30 s."""
    Topology = load_topology().Topology
    config = fault_config(tmp_path, upstream)
    sent = []
    with Topology(config=config, workdir=tmp_path / "topology", server_url=pg_server) as topology:
        database = topology.database_url
        victim = topology.services["proxy-1"]
        pid = victim.proc.pid
        # the load while proxy-1 is frozen and wakes; stop() ends it when done
        agents = Agents(topology.proxy_urls, upstream.items_url, intent_pool(30, MIXED, seed=9, slow_seconds=0.6),
                        threads=6, per_thread=200, seconds=60, seed=33).start()
        try:
            with open_store(database) as store:
                def holding(since: datetime | None = None) -> list:
                    return [r for r in store.receipts.list(states=["submitted"], limit=None)
                            if r.proxy_instance and f"-{pid}-" in r.proxy_instance and (since is None or r.created_at > since)]

                def recovered(ops: list[str]) -> bool:
                    """Each went submitted -> outcome_unknown as proxy_interrupted (the worker may have settled it since)."""
                    step = ("submitted", "outcome_unknown", "proxy_interrupted")
                    return all(
                        any((t.from_state, t.to_state, t.detail.get("error")) == step for t in store.receipts.history(op)) for op in ops
                    )

                assert wait_for(holding, 10, 0.02), "proxy-1 never held a write"
                os.kill(pid, signal.SIGSTOP)
                try:
                    taken_for_dead = wait_for(lambda: (instance_row(database, pid) or {}).get("recovered_at"), 15, 0.2)
                finally:
                    os.kill(pid, signal.SIGCONT)
                assert taken_for_dead, "nobody took the frozen replica for dead"
                woke = datetime.now(UTC)

                def sent_after_waking() -> list:
                    """Its slow writes journaled since it woke and at the upstream: the ones it journaled before
                    its first heartbeat after waking are not sent (a replica may still recover them: handler.py)."""
                    at_upstream = {r.operation_id for r in upstream.received()}
                    return [r for r in slow(holding(woke)) if r.operation_id in at_upstream]

                # slow writes of their own to proxy-1 from now on, whether or not the first load is still going
                awake = Agents([victim.url], upstream.items_url, intent_pool(12, {SLOW: 1.0}, seed=10, slow_seconds=0.6),
                               threads=3, per_thread=100, seconds=60, seed=34).start()  # fmt: skip
                try:
                    held = wait_for(sent_after_waking, 15, 0.02)
                    victim.kill()
                finally:
                    sent += awake.stop()
                assert held, "proxy-1 did not take a write again after waking up"
                assert wait_for(lambda: not holding() and recovered([r.operation_id for r in held]), 30, 0.2), (
                    f"the killed replica's receipts not recovered 30 s later: {[r.operation_id for r in holding()]}, "
                    f"{[(op, store.receipts.get(op).state) for op in (r.operation_id for r in held)]}; "
                    f"its instance row: {instance_row(database, pid)}"
                )
        finally:
            sent += agents.stop()
        with open_store(database) as store:
            assert wait_for(lambda: not store.receipts.list(states=["planned", "submitted"], limit=None), 10, 0.1)
        check_scenario("replica frozen past dead_after, then killed (postgresql)", database, upstream.received(),
                       len(sent), answered_ids(sent))
