"""Several reconcile workers on one queue, on SQLite and on PostgreSQL: leases keep every receipt to one
worker at a time, and a dead worker's lease expires so that another one finishes its receipts.

The receipts are created directly in the store (planned -> submitted -> outcome_unknown); their rule is a
lookup against the real world API of tests/support/world.py, which counts every read it answers.
"""

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy import select
from support.store import recorded, transitioned
from support.world import World, start_world

from proxy_addon.config import ReceiptsConfig, parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import StaleStateError
from proxy_addon.journal.tables import ReceiptTransition
from proxy_addon.reconcile.worker import PassReport, Reconciler
from proxy_addon.rules.records import Intent, utcnow
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore

QUEUE = 40


@pytest.fixture
def world() -> Iterator[World]:
    w = start_world()
    w.read_delay = 0.02  # reads take a moment, so that the workers' passes overlap
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture
def url(migrated_url: str) -> str:
    return migrated_url


def config_for(world: World) -> ReceiptsConfig:
    rule = {
        "name": "articles.create",
        "method": "POST",
        "path": "/api/articles",
        "retry_safe": True,
        "reconcile": {
            "strategy": "lookup",
            "url": "{scheme}://{netloc}/api/articles/{body.id}",
            "match": {"$.title": "$.title"},
            "id": "$.id",
            "settle": "0s",
        },
    }
    return parse_config(
        yaml.safe_dump(
            {
                "reconcile": {"batch_size": 3, "concurrency": 3, "per_host_rate": 10000, "lease": "30s", "backoff": "50ms"},
                "logging": {"level": "warning", "format": "json"},
                "hosts": {world.netloc: {"operations": [rule]}},
            }
        )
    )


def unknown_receipt(store: ReceiptStore, world: World, present: bool) -> str:
    """An outcome_unknown receipt for a create; `present`: the world holds the article (the write committed)."""
    op, _ = submitted_create(store, world, present)
    store.receipts.transition(
        op, State.SUBMITTED, State.OUTCOME_UNKNOWN, {"who": "test", "end": "upstream_timeout"}, error_code="upstream_timeout"
    )
    return op


def known_success(store: ReceiptStore, world: World) -> str:
    """A create that succeeded, its article in the world: the known effect the rule's positive control is run on."""
    op, article_id = submitted_create(store, world, present=True)
    store.receipts.transition(op, State.SUBMITTED, State.SUCCEEDED, {"who": "test"}, status_code=201, external_id=article_id)
    return f"/api/articles/{article_id}"


def submitted_create(store: ReceiptStore, world: World, present: bool) -> tuple[str, str]:
    article_id, title = f"art-{uuid.uuid4().hex[:10]}", f"title {uuid.uuid4().hex[:6]}"
    if present:
        world.add_article(title, "b", article_id=article_id)
    body = json.dumps({"body_markdown": "b", "id": article_id, "title": title}, separators=(",", ":")).encode()
    planned = recorded(store, 
        Intent(
            operation="articles.create",
            method="POST",
            scheme="http",
            host="127.0.0.1",
            port=world.port,
            path="/api/articles",
            intent_fingerprint="sha256:" + uuid.uuid4().hex * 2,
            account="acct:workers",
            request_headers={"content-type": "application/json"},
            request_body=body,
            request_body_size=len(body),
        )
    )
    store.receipts.transition(planned.operation_id, State.PLANNED, State.SUBMITTED, {"who": "test"})
    return planned.operation_id, article_id


def verdict_reads(world: World, store: ReceiptStore) -> list[str]:
    """The reads the verdicts made, less the verifier controls' (a probe; a known success, which may be a receipt
    reconciled earlier in the pass: each positive control's run is one read of it)."""
    positives = Counter(
        urlsplit(r.evidence["read"]["url"]).path for r in store.controls.history(limit=1000) if r.control == "positive"
    )
    reads = Counter(r.path for r in world.received("GET") if "receipts-probe-" not in r.path)
    assert not positives - reads, "every positive control's read reached the world"
    return list((reads - positives).elements())


def run_workers(url: str, config: ReceiptsConfig, n: int = 2) -> list[PassReport]:
    """n workers, each with its own engine (its own connections), start one pass at the same moment."""
    engines = [make_engine(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    reports: list[PassReport | None] = [None] * n
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            reconciler = Reconciler(config, ReceiptStore(engines[i]), worker_id=f"racer-{i}")
            barrier.wait(10)
            reports[i] = asyncio.run(reconciler.run_once())
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a worker did not finish its pass in 60 s"
        assert not errors, errors
    finally:
        for e in engines:
            e.dispose()
    return [r for r in reports if r is not None]


def all_transitions(store: ReceiptStore) -> list[ReceiptTransition]:
    table = ReceiptTransition.__table__
    with store.engine.connect() as conn:
        return list(conn.execute(select(table).order_by(table.c.id)))


def wait_past(moment, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while utcnow() <= moment + timedelta(milliseconds=20):
        assert time.monotonic() < deadline
        time.sleep(0.02)


# -- racing workers -------------------------------------------------------------------------------------------


def test_two_workers_reconcile_each_receipt_exactly_once(url, store, world):
    known_success(store, world)
    present = {unknown_receipt(store, world, present=i % 2 == 0): i % 2 == 0 for i in range(QUEUE)}

    reports = run_workers(url, config_for(world))

    assert sum(r.claimed for r in reports) == QUEUE
    assert all(r.claimed > 0 for r in reports), [r.claimed for r in reports]  # both really took part
    rows = all_transitions(store)
    claims = Counter(r.operation_id for r in rows if r.to_state == "reconciling")
    verdicts = Counter(r.operation_id for r in rows if r.from_state == "reconciling")
    assert claims == verdicts == Counter(dict.fromkeys(present, 1))
    for op, there in present.items():
        receipt = store.receipts.get(op)
        assert receipt.state == ("succeeded" if there else "safe_to_retry"), op
        assert receipt.lease_owner is None
        claim = next(r for r in rows if r.operation_id == op and r.to_state == "reconciling")
        verdict = next(r for r in rows if r.operation_id == op and r.from_state == "reconciling")
        assert claim.detail["who"] == verdict.detail["who"]  # the worker that claimed it gave the verdict
    reads = Counter(verdict_reads(world, store))
    assert len(reads) == QUEUE and set(reads.values()) == {1}  # each receipt read once, by one worker


def test_workers_racing_over_expired_leases_release_each_once(url, store, world):
    ops = [unknown_receipt(store, world, present=True) for _ in range(QUEUE // 2)]
    dead = store.queue.claim(worker="dead", lease_seconds=0.3, limit=10)
    assert len(dead) == 10
    wait_past(max(r.lease_expires_at for r in dead))

    reports = run_workers(url, config_for(world))

    assert sum(r.claimed for r in reports) == len(ops)
    rows = all_transitions(store)
    released = Counter(r.operation_id for r in rows if r.from_state == "reconciling" and r.to_state == "outcome_unknown")
    assert released == Counter({r.operation_id: 1 for r in dead})
    for r in rows:
        if r.operation_id in released and r.from_state == "reconciling" and r.to_state == "outcome_unknown":
            assert (r.detail["reason"], r.detail["lease_owner"]) == ("lease expired", "dead")
    claims = Counter(r.operation_id for r in rows if r.to_state == "reconciling")
    assert claims == Counter({op: 2 if op in released else 1 for op in ops})
    assert {store.receipts.get(op).state for op in ops} == {"succeeded"}
    assert len(verdict_reads(world, store)) == len(ops)


def _in_threads(url: str, n: int, body) -> list:
    """`body(store, i)` in n threads at once, each with its own engine; returns their results."""
    engines = [make_engine(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = body(ReceiptStore(engines[i]), i)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads) and not errors, errors
    finally:
        for e in engines:
            e.dispose()
    return results


def test_concurrent_claims_take_disjoint_receipts(url, store, world):
    ops = {unknown_receipt(store, world, present=True) for _ in range(QUEUE)}

    def claim_all(s: ReceiptStore, i: int) -> list[str]:
        mine: list[str] = []
        for _ in range(QUEUE):  # bounded: at most one round per receipt
            batch = s.queue.claim(f"claimer-{i}", 30, 1 + i % 3)
            if not batch:
                break
            mine += [r.operation_id for r in batch]
        return mine

    taken = _in_threads(url, 6, claim_all)

    flat = [op for mine in taken for op in mine]
    assert sorted(flat) == sorted(ops)  # every receipt claimed, none twice
    claims = Counter(r.operation_id for r in all_transitions(store) if r.to_state == "reconciling")
    assert set(claims.values()) == {1}


def test_concurrent_releases_of_expired_leases_release_each_once(url, store, world):
    ops = [unknown_receipt(store, world, present=True) for _ in range(QUEUE // 2)]
    dead = store.queue.claim(worker="dead", lease_seconds=0.2, limit=len(ops))
    wait_past(max(r.lease_expires_at for r in dead))

    def release_and_claim(s: ReceiptStore, i: int) -> None:
        for _ in range(len(ops)):
            s.queue.release_expired(f"live-{i}")
            if not s.queue.claim(f"live-{i}", 30, 1):
                break

    _in_threads(url, 6, release_and_claim)

    rows = all_transitions(store)
    released = Counter(r.operation_id for r in rows if r.from_state == "reconciling" and r.to_state == "outcome_unknown")
    live_claims = Counter(
        r.operation_id for r in rows if r.to_state == "reconciling" and r.detail["who"].startswith("live-")
    )
    assert released == live_claims == Counter(dict.fromkeys(ops, 1))
    assert {store.receipts.get(op).lease_owner.split("-")[0] for op in ops} == {"live"}


def test_no_read_is_made_under_a_lease_that_ran_out_while_waiting(url, store, world):
    ops = [unknown_receipt(store, world, present=True) for _ in range(3)]
    config = config_for(world).model_copy(
        update={"reconcile": config_for(world).reconcile.model_copy(update={"lease": 0.5, "concurrency": 1})}
    )
    world.read_delay = 0.8  # the first read outlasts the leases of the two waiting behind it

    first = asyncio.run(Reconciler(config, store, worker_id="slow").run_once())

    assert (first.claimed, dict(first.verdicts)) == (3, {"succeeded": 1})
    assert len(verdict_reads(world, store)) == 1
    assert sorted(store.receipts.get(op).state for op in ops) == ["reconciling", "reconciling", "succeeded"]

    world.read_delay = 0.0
    second = asyncio.run(Reconciler(config, store, worker_id="next").run_once())

    assert dict(second.verdicts) == {"succeeded": 2}
    assert {store.receipts.get(op).state for op in ops} == {"succeeded"}
    assert Counter(verdict_reads(world, store)) == Counter(
        {f"/api/articles/{json.loads(store.receipts.get(op).request_body)['id']}": 1 for op in ops}
    )
    verdicts = Counter(r.operation_id for r in all_transitions(store) if r.from_state == "reconciling" and r.to_state == "succeeded")
    assert verdicts == Counter(dict.fromkeys(ops, 1))


# -- a worker killed mid-claim --------------------------------------------------------------------------------


def test_a_dead_workers_lease_expires_and_another_worker_finishes(url, store, world):
    op = unknown_receipt(store, world, present=True)
    config = config_for(world)
    (claimed,) = store.queue.claim(worker="dead", lease_seconds=1, limit=10)
    assert (claimed.operation_id, claimed.state, claimed.lease_owner) == (op, "reconciling", "dead")

    early = asyncio.run(Reconciler(config, store, worker_id="live").run_once())  # the lease still holds
    assert early.claimed == 0
    assert (store.receipts.get(op).state, store.receipts.get(op).lease_owner) == ("reconciling", "dead")
    assert world.received("GET") == []

    wait_past(claimed.lease_expires_at)
    other = make_engine(url)
    try:
        late = asyncio.run(Reconciler(config, ReceiptStore(other), worker_id="live").run_once())
    finally:
        other.dispose()

    assert (late.claimed, dict(late.verdicts)) == (1, {"succeeded": 1})
    receipt = store.receipts.get(op)
    assert (receipt.state, receipt.lease_owner) == ("succeeded", None)
    history = store.receipts.history(op)
    assert [(t.from_state, t.to_state, t.detail.get("who")) for t in history[2:]] == [
        ("submitted", "outcome_unknown", "test"),
        ("outcome_unknown", "reconciling", "dead"),
        ("reconciling", "outcome_unknown", "live"),
        ("outcome_unknown", "reconciling", "live"),
        ("reconciling", "succeeded", "live"),
    ]
    assert (history[4].detail["reason"], history[4].detail["lease_owner"]) == ("lease expired", "dead")

    with pytest.raises(StaleStateError):  # the dead worker wakes up with its verdict: refused
        store.receipts.transition(op, State.RECONCILING, State.SAFE_TO_RETRY, {"who": "dead"}, owned_by="dead")
    assert store.receipts.get(op).state == "succeeded"
    assert len(store.receipts.history(op)) == len(history)


def test_a_late_verdict_cannot_overwrite_the_successors_lease(store, world):
    op = unknown_receipt(store, world, present=False)
    (claimed,) = store.queue.claim(worker="dead", lease_seconds=0.5, limit=1)
    assert store.queue.release_expired("successor") == []  # not expired yet
    wait_past(claimed.lease_expires_at)
    assert store.queue.release_expired("successor") == [op]
    assert store.queue.release_expired("third") == []  # released once
    (taken,) = store.queue.claim(worker="successor", lease_seconds=30, limit=1)
    assert taken.operation_id == op

    with pytest.raises(StaleStateError):
        store.receipts.transition(op, State.RECONCILING, State.SUCCEEDED, {"who": "dead"}, owned_by="dead", external_id="x")
    receipt = store.receipts.get(op)
    assert (receipt.state, receipt.lease_owner, receipt.external_id) == ("reconciling", "successor", None)

    done = transitioned(store, 
        op, State.RECONCILING, State.SAFE_TO_RETRY, {"who": "successor"}, owned_by="successor", lease_owner=None
    )
    assert (done.state, done.lease_owner) == ("safe_to_retry", None)


def test_a_claim_takes_only_receipts_due_and_due_by_the_pass_start(store, world):
    op = unknown_receipt(store, world, present=True)
    store.queue.claim("w", 30, 1)
    retry_at = utcnow() + timedelta(milliseconds=150)
    store.receipts.transition(
        op, State.RECONCILING, State.OUTCOME_UNKNOWN, {"who": "w"}, owned_by="w",
        lease_owner=None, lease_expires_at=None, next_attempt_at=retry_at,
    )  # fmt: skip
    pass_started = utcnow()
    assert store.queue.claim("w", 30, 10) == []  # not due yet
    wait_past(retry_at)
    assert store.queue.claim("w", 30, 10, due_by=pass_started) == []  # put back after this pass began
    assert [r.operation_id for r in store.queue.claim("w", 30, 10)] == [op]
