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
from store_helpers import S, count, intent, walk

from proxy_addon.db import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, alembic_config, make_engine
from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError
from proxy_addon.states import OPEN_STATES, TERMINAL_STATES
from proxy_addon.store import ReceiptStore, instances, receipts, transitions, utcnow


@pytest.mark.parametrize("death", ["stopped", "silent"])
def test_recovery_touches_only_the_dead_instance(store, death):
    store.register_instance("A", "host-a", 101)
    store.register_instance("B", "host-b", 202)
    mine = {}
    for who in ("A", "B"):
        for state in (S.PLANNED, S.SUBMITTED, S.OUTCOME_UNKNOWN, S.SUCCEEDED):
            op = store.record_intent(intent(proxy_instance=who)).operation_id
            mine[who, state] = walk(store, op, state)
    if death == "stopped":
        store.stop_instance("A")
        dead_after = 60.0
    else:
        time.sleep(0.8)
        store.heartbeat("B")
        dead_after = 0.4
    assert store.dead_instances(None, dead_after) == ["A"]
    assert store.dead_instances("A", dead_after) == []
    b_before = {k: (store.get(r.operation_id), store.history(r.operation_id)) for k, r in mine.items() if k[0] == "B"}

    recovered = store.recover_instance("A", by="B")

    a_sub, a_plan = mine["A", S.SUBMITTED].operation_id, mine["A", S.PLANNED].operation_id
    assert sorted((r.operation_id, r.from_state, r.to_state) for r in recovered) == sorted(
        [(a_sub, "submitted", "outcome_unknown"), (a_plan, "planned", "rejected")])
    got = store.get(a_sub)
    assert (got.state, got.error_code, got.completed_at) == (S.OUTCOME_UNKNOWN, "proxy_interrupted", None)
    assert store.history(a_sub)[-1].detail == {"who": "B", "error": "proxy_interrupted", "dead_instance": "A"}
    got = store.get(a_plan)
    assert (got.state, got.error_code) == (S.REJECTED, "not_sent") and got.completed_at is not None
    for state in (S.OUTCOME_UNKNOWN, S.SUCCEEDED):
        assert store.get(mine["A", state].operation_id) == mine["A", state]
    assert {k: (store.get(r.operation_id), store.history(r.operation_id)) for k, r in mine.items()
            if k[0] == "B"} == b_before
    assert store.dead_instances(None, 60.0, known_dead=["A"]) == []  # recovered once, not again


def test_prune_deletes_only_old_terminal_receipts(store):
    old = utcnow() - timedelta(days=3)
    doomed = [walk(store, store.record_intent(intent()).operation_id, s, completed_at=old).operation_id
              for s in sorted(TERMINAL_STATES)]
    recent = walk(store, store.record_intent(intent()).operation_id, S.SUCCEEDED).operation_id
    kept = [recent]
    for s in sorted(OPEN_STATES):
        op = store.record_intent(intent()).operation_id
        kept.append(walk(store, op, s).operation_id)
    with store.engine.begin() as c:  # make every kept receipt look old, except where prune must look
        c.execute(update(receipts).where(receipts.c.operation_id.in_(kept)).values(created_at=old, updated_at=old))
        c.execute(update(receipts).where(receipts.c.operation_id.in_(kept[1:])).values(completed_at=old))
    kept_history = {op: store.history(op) for op in kept}

    assert store.prune(timedelta(days=1)) == len(doomed)

    for op in doomed:
        with pytest.raises(ReceiptNotFoundError):
            store.get(op)
        assert count(store, transitions, transitions.c.operation_id == op) == 0
    assert {op: store.history(op) for op in kept} == kept_history
    assert store.prune(timedelta(days=1)) == 0


def test_read_only_sqlite_fails_closed(sqlite_url):
    command.upgrade(alembic_config(sqlite_url), "head")
    rw = ReceiptStore(make_engine(sqlite_url))
    existing = rw.record_intent(intent())
    ro = ReceiptStore(make_engine(f"sqlite:///file:{make_url(sqlite_url).database}?mode=ro&uri=true"))
    try:
        for write in (lambda: ro.record_intent(intent()),
                      lambda: ro.transition(existing.operation_id, S.PLANNED, S.SUBMITTED),
                      lambda: ro.register_instance("C", "h", 1)):
            with pytest.raises(JournalUnavailableError) as err:
                write()
            assert "\n" not in str(err.value) and "readonly" in str(err.value)
        assert rw.get(existing.operation_id) == existing
        assert (count(rw, receipts), count(rw, transitions)) == (1, 1)
    finally:
        ro.engine.dispose()
        rw.engine.dispose()


def test_postgres_down_or_dropped_fails_closed(pg_server, pg_url):
    nowhere = ReceiptStore(make_engine(make_url(pg_server).set(port=1).render_as_string(False)))
    with pytest.raises(JournalUnavailableError):
        nowhere.record_intent(intent())
    nowhere.engine.dispose()
    command.upgrade(alembic_config(pg_url), "head")
    store = ReceiptStore(make_engine(pg_url))
    op = store.record_intent(intent()).operation_id
    admin = psycopg.connect(make_url(pg_server).set(drivername="postgresql").render_as_string(False), autocommit=True)
    admin.execute(f'DROP DATABASE "{make_url(pg_url).database}" WITH (FORCE)')
    admin.close()
    for write in (lambda: store.record_intent(intent()), lambda: store.transition(op, S.PLANNED, S.SUBMITTED)):
        with pytest.raises(JournalUnavailableError) as err:
            write()
        assert "\n" not in str(err.value)
    store.engine.dispose()


def test_a_failed_history_write_leaves_nothing_half_written(store):
    existing = store.record_intent(intent())
    with store.engine.begin() as c:  # the history insert fails after the receipt row was written
        if store.dialect == "sqlite":
            c.execute(text("CREATE TRIGGER no_history BEFORE INSERT ON receipt_transitions "
                           "BEGIN SELECT RAISE(ABORT, 'disk full'); END"))
        else:
            c.execute(text("CREATE FUNCTION no_history() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'disk full'; "
                           "END $$ LANGUAGE plpgsql"))
            c.execute(text("CREATE TRIGGER no_history BEFORE INSERT ON receipt_transitions "
                           "FOR EACH ROW EXECUTE FUNCTION no_history()"))
    with pytest.raises(JournalUnavailableError):
        store.record_intent(intent())
    with pytest.raises(JournalUnavailableError):
        store.transition(existing.operation_id, S.PLANNED, S.SUBMITTED)
    assert store.get(existing.operation_id) == existing
    assert (count(store, receipts), count(store, transitions)) == (1, 1)


def test_sqlite_writes_resume_once_the_file_is_writable_again(sqlite_url):
    """Connections opened while the file could not be written are read-only for good; the store must not
    keep them, or it fails closed forever after the outage (heartbeats included)."""
    from faults.fault_harness import unwritable_sqlite

    command.upgrade(alembic_config(sqlite_url), "head")
    store = ReceiptStore(make_engine(sqlite_url, pool_size=2))
    try:
        store.register_instance("A", "h", 1)
        with unwritable_sqlite(Path(make_url(sqlite_url).database)):
            store.engine.dispose()  # the pool's next connections are opened while the file is unwritable
            for _ in range(4):  # every pooled connection tried, and fresh ones opened, while unwritable
                with pytest.raises(JournalUnavailableError):
                    store.record_intent(intent())
                with pytest.raises(JournalUnavailableError):
                    store.heartbeat("A")
        for _ in range(4):
            store.heartbeat("A")
            op = store.record_intent(intent()).operation_id
            assert store.transition(op, S.PLANNED, S.SUBMITTED).state == S.SUBMITTED
    finally:
        store.engine.dispose()


def test_a_frozen_transaction_does_not_stall_recovery_on_postgres(pg_url):
    """A proxy frozen (SIGSTOP) inside a transaction holds its row locks; the server ends such an idle
    transaction (db.PG_IDLE_IN_TRANSACTION_TIMEOUT_MS), so the replica recovering it is held up, not stalled."""
    command.upgrade(alembic_config(pg_url), "head")
    store, frozen_engine = ReceiptStore(make_engine(pg_url)), make_engine(pg_url)
    try:
        store.register_instance("frozen", "h", 1)
        op = store.record_intent(intent(proxy_instance="frozen")).operation_id
        store.transition(op, S.PLANNED, S.SUBMITTED)
        frozen = frozen_engine.connect()
        frozen.begin()
        frozen.execute(update(receipts).where(receipts.c.operation_id == op).values(updated_at=utcnow()))
        frozen.execute(update(instances).where(instances.c.instance_id == "frozen").values(heartbeat_at=utcnow()))

        recovering = ThreadPoolExecutor(1).submit(store.recover_instance, "frozen", "B")
        recovered = recovering.result(timeout=PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 20)

        assert [(r.operation_id, r.to_state) for r in recovered] == [(op, S.OUTCOME_UNKNOWN)]
        assert store.dead_instances(None, 3600.0) == []  # recovered_at was written: the row lock was released
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
