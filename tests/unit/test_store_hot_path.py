"""The store's general write path: record_and_submit (the receipt as `submitted`, both history rows, one
commit), transition, concurrent writers, and surviving a restarted PostgreSQL without pool_pre_ping."""

from datetime import timedelta

import psycopg
import pytest
from sqlalchemy.engine import make_url
from support.store import S, fp, intent, recorded, walk

from proxy_addon.db import make_engine
from proxy_addon.exceptions import (
    DuplicateOpenError,
    DuplicateSucceededError,
    IdempotencyKeyMismatchError,
    StaleStateError,
)
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.store import ReceiptStore


@pytest.fixture
def fast_store(migrated_url: str):
    engine = make_engine(migrated_url, pool_pre_ping=False)
    try:
        yield ReceiptStore(engine)
    finally:
        engine.dispose()


def history(store: ReceiptStore, op: str) -> list[tuple[str | None, str]]:
    return [(t.from_state, t.to_state) for t in store.receipts.history(op)]


def test_record_and_submit_commits_submitted_with_its_planned_row(fast_store: ReceiptStore):
    it = intent(proxy_instance="me")
    fast_store.receipts.record_and_submit(it, None, "me")
    rec = fast_store.receipts.get(it.operation_id)
    assert rec.state == S.SUBMITTED and rec.submitted_at is not None and rec.proxy_instance == "me"
    assert history(fast_store, it.operation_id) == [(None, "planned"), ("planned", "submitted")]
    fast_store.receipts.transition(it.operation_id, S.SUBMITTED, S.SUCCEEDED, {"who": "me"}, status_code=201)
    rec = fast_store.receipts.get(it.operation_id)
    assert (rec.state, rec.status_code) == ("succeeded", 201) and rec.completed_at is not None
    with pytest.raises(StaleStateError):
        fast_store.receipts.transition(it.operation_id, S.SUBMITTED, S.REJECTED)


def test_record_and_submit_refuses_like_record_intent(fast_store: ReceiptStore):
    f = fp()
    first = intent(f, idempotency_key="k-1")
    fast_store.receipts.record_and_submit(first, None, "me")
    with pytest.raises(DuplicateOpenError) as e:
        fast_store.receipts.record_and_submit(intent(f), None, "me")
    assert e.value.operation_id == first.operation_id and e.value.intent is not None
    with pytest.raises(IdempotencyKeyMismatchError):
        fast_store.receipts.record_and_submit(intent(idempotency_key="k-1"), None, "me")
    fast_store.receipts.transition(first.operation_id, S.SUBMITTED, S.SUCCEEDED, status_code=201)
    policy = AfterSuccess(policy="refuse", window=timedelta(hours=1).total_seconds())
    with pytest.raises(DuplicateSucceededError) as e:
        fast_store.receipts.record_and_submit(intent(f), policy, "me")
    assert e.value.blocker.receipt.operation_id == first.operation_id and e.value.blocker.receipt.status_code == 201
    fast_store.receipts.record_and_submit(intent(f), AfterSuccess(policy="allow"), "me")  # allowed: a new receipt


def test_an_open_receipt_wins_over_a_recent_success(fast_store: ReceiptStore):
    f = fp()
    done = recorded(fast_store, intent(f))
    walk(fast_store, done.operation_id, S.SUCCEEDED)
    still_open = intent(f)
    fast_store.receipts.record_and_submit(still_open, AfterSuccess(policy="allow"), "me")
    with pytest.raises(DuplicateOpenError) as e:
        fast_store.receipts.record_and_submit(intent(f), AfterSuccess(policy="replay", window=3600), "me")
    assert e.value.operation_id == still_open.operation_id


def test_pooled_connections_killed_by_the_server_are_replaced_without_pre_ping(pg_url):
    """A restarted PostgreSQL drops every pooled connection; the next write must still succeed."""
    from conftest import migrate

    migrate(pg_url)
    engine = make_engine(pg_url, pool_pre_ping=False, pool_size=2)
    store = ReceiptStore(engine)
    try:
        first = intent()
        store.receipts.record_and_submit(first, None, "me")  # the pool now holds an idle connection
        database = make_url(pg_url).database
        with psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(False), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchone()[0]
        assert killed >= 1
        store.receipts.transition(first.operation_id, S.SUBMITTED, S.SUCCEEDED, status_code=201)
        second = intent()
        store.receipts.record_and_submit(second, None, "me")
        assert store.receipts.get(first.operation_id).state == "succeeded"
        assert store.receipts.get(second.operation_id).state == "submitted"
    finally:
        engine.dispose()


def test_concurrent_writes_are_each_atomic_and_isolated(sqlite_url):
    """Many threads writing at once on SQLite, each write a transaction of its own (its write lock serializes
    them): of identical intents exactly one is recorded, and the refused ones and a failing compare-and-set do
    not undo the others. (On PostgreSQL only the open-intent index is the database's own guarantee: a success
    committed between another writer's decision and its insert is not seen by it.)"""
    import threading

    from conftest import migrate

    migrate(sqlite_url)
    engine = make_engine(sqlite_url, pool_pre_ping=False)
    fast_store = ReceiptStore(engine)
    f = fp()
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        it = intent(f if i % 2 else None)
        try:
            fast_store.receipts.record_and_submit(it, None, "me")
            fast_store.receipts.transition(it.operation_id, S.SUBMITTED, S.SUCCEEDED, status_code=201)
            with pytest.raises(StaleStateError):
                fast_store.receipts.transition(it.operation_id, S.SUBMITTED, S.REJECTED)
            result = "ok"
        except (DuplicateOpenError, DuplicateSucceededError):  # open, or succeeded within the window
            result = "duplicate"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the 20 distinct ones are all recorded; of the 20 identical ones exactly one (the default
    # after-success policy refuses a repeat of a recent success, as the open index refuses an open one)
    assert (outcomes.count("ok"), outcomes.count("duplicate")) == (21, 19)
    rows = fast_store.receipts.list(limit=None)
    assert all(r.state == "succeeded" for r in rows)
    assert len(rows) == outcomes.count("ok")
    assert all(len(fast_store.receipts.history(r.operation_id)) == 3 for r in rows)
    engine.dispose()
