"""The store over a receipt's life and the database's: crash recovery of dead proxy instances, pruning,
and failing closed (nothing half-written) when the journal cannot be written."""

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from alembic import command
from sqlalchemy import text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from support.store import S, count, intent, recorded, transitioned, walk

from proxy_addon.db import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, alembic_config, make_engine
from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import OPEN_STATES, TERMINAL_STATES
from proxy_addon.store import ReceiptStore
from proxy_addon.store.instances import instances
from proxy_addon.store.receipts import receipts, transitions


@pytest.mark.parametrize("death", ["stopped", "silent"])
def test_recovery_touches_only_the_dead_instance(store, death):
    store.instances.register("A", "host-a", 101)
    store.instances.register("B", "host-b", 202)
    mine = {}
    for who in ("A", "B"):
        for state in (S.PLANNED, S.SUBMITTED, S.OUTCOME_UNKNOWN, S.SUCCEEDED):
            op = recorded(store, intent(proxy_instance=who)).operation_id
            mine[who, state] = walk(store, op, state)
    if death == "stopped":
        store.instances.stop("A")
        dead_after = 60.0
    else:
        time.sleep(0.8)
        store.instances.heartbeat("B")
        dead_after = 0.4
    assert store.instances.dead(None, dead_after) == ["A"]
    assert store.instances.dead("A", dead_after) == []
    b_before = {k: (store.receipts.get(r.operation_id), store.receipts.history(r.operation_id)) for k, r in mine.items() if k[0] == "B"}

    recovered = store.instances.recover("A", by="B")

    a_sub, a_plan = mine["A", S.SUBMITTED].operation_id, mine["A", S.PLANNED].operation_id
    assert sorted((r.operation_id, r.from_state, r.to_state) for r in recovered) == sorted(
        [(a_sub, "submitted", "outcome_unknown"), (a_plan, "planned", "rejected")])
    got = store.receipts.get(a_sub)
    assert (got.state, got.error_code, got.completed_at) == (S.OUTCOME_UNKNOWN, "proxy_interrupted", None)
    assert store.receipts.history(a_sub)[-1].detail == {"who": "B", "error": "proxy_interrupted", "dead_instance": "A"}
    got = store.receipts.get(a_plan)
    assert (got.state, got.error_code) == (S.REJECTED, "not_sent") and got.completed_at is not None
    for state in (S.OUTCOME_UNKNOWN, S.SUCCEEDED):
        assert store.receipts.get(mine["A", state].operation_id) == mine["A", state]
    assert {k: (store.receipts.get(r.operation_id), store.receipts.history(r.operation_id)) for k, r in mine.items()
            if k[0] == "B"} == b_before
    assert store.instances.dead(None, 60.0, known_dead=["A"]) == []  # recovered once, not again


def test_an_instance_that_woke_up_after_recovery_and_died_again_is_recovered_again(store):
    """Frozen past instance_dead_after, A was taken for dead and recovered; it woke up and journaled a write
    before its next heartbeat (which would have cleared `recovered_at`), then died: that write must not stay
    `submitted` for ever (found by the fault suite's frozen-replica scenario)."""
    store.instances.register("A", "host-a", 101)
    store.instances.register("B", "host-b", 202)
    first = walk(store, recorded(store, intent(proxy_instance="A")).operation_id, S.SUBMITTED)
    with store.engine.begin() as c:  # A froze: its last heartbeat is long ago
        c.execute(update(instances).where(instances.c.instance_id == "A").values(heartbeat_at=utcnow() - timedelta(hours=1)))
    assert store.instances.dead("B", 60.0) == ["A"]
    assert [r.operation_id for r in store.instances.recover("A", by="B")] == [first.operation_id]
    assert store.instances.dead("B", 60.0) == []  # recovered: nothing of A's is left in flight

    woke = walk(store, recorded(store, intent(proxy_instance="A")).operation_id, S.SUBMITTED)  # then A died

    assert store.instances.dead("B", 60.0) == ["A"]
    assert [(r.operation_id, r.to_state) for r in store.instances.recover("A", by="B")] == [(woke.operation_id, "outcome_unknown")]
    assert store.instances.dead("B", 60.0) == []


def test_prune_deletes_only_old_terminal_receipts(store):
    old = utcnow() - timedelta(days=3)
    doomed = [walk(store, recorded(store, intent()).operation_id, s, completed_at=old).operation_id
              for s in sorted(TERMINAL_STATES)]
    recent = walk(store, recorded(store, intent()).operation_id, S.SUCCEEDED).operation_id
    kept = [recent]
    for s in sorted(OPEN_STATES):
        op = recorded(store, intent()).operation_id
        kept.append(walk(store, op, s).operation_id)
    with store.engine.begin() as c:  # make every kept receipt look old, except where prune must look
        c.execute(update(receipts).where(receipts.c.operation_id.in_(kept)).values(created_at=old, updated_at=old))
        c.execute(update(receipts).where(receipts.c.operation_id.in_(kept[1:])).values(completed_at=old))
    kept_history = {op: store.receipts.history(op) for op in kept}

    assert store.retention.prune(timedelta(days=1)).receipts == len(doomed)

    for op in doomed:
        with pytest.raises(ReceiptNotFoundError):
            store.receipts.get(op)
        assert count(store, transitions, transitions.c.operation_id == op) == 0
    assert {op: store.receipts.history(op) for op in kept} == kept_history
    assert store.retention.prune(timedelta(days=1)).receipts == 0


def test_read_only_sqlite_fails_closed(sqlite_url):
    command.upgrade(alembic_config(sqlite_url), "head")
    rw = ReceiptStore(make_engine(sqlite_url))
    existing = recorded(rw, intent())
    ro = ReceiptStore(make_engine(f"sqlite:///file:{make_url(sqlite_url).database}?mode=ro&uri=true"))
    try:
        for write in (lambda: ro.receipts.record(intent()),
                      lambda: ro.receipts.transition(existing.operation_id, S.PLANNED, S.SUBMITTED),
                      lambda: ro.instances.register("C", "h", 1)):
            with pytest.raises(JournalUnavailableError) as err:
                write()
            assert "\n" not in str(err.value) and "readonly" in str(err.value)
        assert rw.receipts.get(existing.operation_id) == existing
        assert (count(rw, receipts), count(rw, transitions)) == (1, 1)
    finally:
        ro.engine.dispose()
        rw.engine.dispose()


def test_postgres_down_or_dropped_fails_closed(pg_server, pg_url):
    nowhere = ReceiptStore(make_engine(make_url(pg_server).set(port=1).render_as_string(False)))
    with pytest.raises(JournalUnavailableError):
        nowhere.receipts.record(intent())
    nowhere.engine.dispose()
    command.upgrade(alembic_config(pg_url), "head")
    store = ReceiptStore(make_engine(pg_url))
    op = recorded(store, intent()).operation_id
    admin = psycopg.connect(make_url(pg_server).set(drivername="postgresql").render_as_string(False), autocommit=True)
    admin.execute(f'DROP DATABASE "{make_url(pg_url).database}" WITH (FORCE)')
    admin.close()
    for write in (lambda: recorded(store, intent()), lambda: store.receipts.transition(op, S.PLANNED, S.SUBMITTED)):
        with pytest.raises(JournalUnavailableError) as err:
            write()
        assert "\n" not in str(err.value)
    store.engine.dispose()


def test_a_failed_history_write_leaves_nothing_half_written(store):
    existing = recorded(store, intent())
    with store.engine.begin() as c:  # the history insert fails after the receipt row was written
        if store.db.dialect == "sqlite":
            c.execute(text("CREATE TRIGGER no_history BEFORE INSERT ON receipt_transitions "
                           "BEGIN SELECT RAISE(ABORT, 'disk full'); END"))
        else:
            c.execute(text("CREATE FUNCTION no_history() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'disk full'; "
                           "END $$ LANGUAGE plpgsql"))
            c.execute(text("CREATE TRIGGER no_history BEFORE INSERT ON receipt_transitions "
                           "FOR EACH ROW EXECUTE FUNCTION no_history()"))
    with pytest.raises(JournalUnavailableError):
        recorded(store, intent())
    with pytest.raises(JournalUnavailableError):
        store.receipts.transition(existing.operation_id, S.PLANNED, S.SUBMITTED)
    assert store.receipts.get(existing.operation_id) == existing
    assert (count(store, receipts), count(store, transitions)) == (1, 1)


def test_sqlite_writes_resume_once_the_file_is_writable_again(sqlite_url):
    """Connections opened while the file could not be written are read-only for good; the store must not
    keep them, or it fails closed forever after the outage (heartbeats included)."""
    from faults.fault_harness import unwritable_sqlite

    command.upgrade(alembic_config(sqlite_url), "head")
    store = ReceiptStore(make_engine(sqlite_url, pool_size=2))
    try:
        store.instances.register("A", "h", 1)
        with unwritable_sqlite(Path(make_url(sqlite_url).database)):
            store.engine.dispose()  # the pool's next connections are opened while the file is unwritable
            for _ in range(4):  # every pooled connection tried, and fresh ones opened, while unwritable
                with pytest.raises(JournalUnavailableError):
                    recorded(store, intent())
                with pytest.raises(JournalUnavailableError):
                    store.instances.heartbeat("A")
        for _ in range(4):
            store.instances.heartbeat("A")
            op = recorded(store, intent()).operation_id
            assert transitioned(store, op, S.PLANNED, S.SUBMITTED).state == S.SUBMITTED
    finally:
        store.engine.dispose()


def test_a_frozen_transaction_does_not_stall_recovery_on_postgres(pg_url):
    """A proxy frozen (SIGSTOP) inside a transaction holds its row locks; the server ends such an idle
    transaction (db.PG_IDLE_IN_TRANSACTION_TIMEOUT_MS), so the replica recovering it is held up, not stalled."""
    command.upgrade(alembic_config(pg_url), "head")
    store, frozen_engine = ReceiptStore(make_engine(pg_url)), make_engine(pg_url)
    try:
        store.instances.register("frozen", "h", 1)
        op = recorded(store, intent(proxy_instance="frozen")).operation_id
        store.receipts.transition(op, S.PLANNED, S.SUBMITTED)
        frozen = frozen_engine.connect()
        frozen.begin()
        frozen.execute(update(receipts).where(receipts.c.operation_id == op).values(updated_at=utcnow()))
        frozen.execute(update(instances).where(instances.c.instance_id == "frozen").values(heartbeat_at=utcnow()))

        recovering = ThreadPoolExecutor(1).submit(store.instances.recover, "frozen", "B")
        recovered = recovering.result(timeout=PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 20)

        assert [(r.operation_id, r.to_state) for r in recovered] == [(op, S.OUTCOME_UNKNOWN)]
        assert store.instances.dead(None, 3600.0) == []  # recovered_at was written: the row lock was released
        with pytest.raises(DBAPIError, match="idle-in-transaction"):
            frozen.execute(text("SELECT 1"))  # the frozen session was ended by the server
    finally:
        frozen_engine.dispose()
        store.engine.dispose()


def test_postgres_sessions_keep_the_urls_own_options_beside_the_idle_timeout(pg_url):
    """The idle-in-transaction limit is added to every session, but never overrides what the URL asks for."""
    def settings(url: str) -> tuple[str, str]:
        engine = make_engine(url)
        try:
            with engine.connect() as c:
                return (c.exec_driver_sql("SHOW statement_timeout").scalar(),
                        c.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar())
        finally:
            engine.dispose()

    ours = f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"
    assert settings(pg_url)[1] == ours
    assert settings(pg_url + "?options=-c%20statement_timeout%3D12345") == ("12345ms", ours)
    assert settings(pg_url + "?options=-c%20idle_in_transaction_session_timeout%3D61000")[1] == "61s"
