"""The receipt store against real databases: the state machine, compare-and-set, the open-intent index,
duplicate policies, history and timestamps."""

import itertools
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from alembic import command
from sqlalchemy import insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from support.store import PATHS, S, count, fp, intent, raw_row, recorded, transitioned, walk

from proxy_addon.db import alembic_config, make_engine
from proxy_addon.exceptions import (
    DuplicateOpenError,
    DuplicateSucceededError,
    IdempotencyKeyMismatchError,
    IllegalTransitionError,
    ReceiptNotFoundError,
    StaleStateError,
)
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import BlockKind, ReceiptRecord, utcnow
from proxy_addon.rules.states import ALLOWED_TRANSITIONS, TERMINAL_STATES, State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts, transitions

ALLOWED = sorted((a, b) for a, targets in ALLOWED_TRANSITIONS.items() for b in targets)
REFUSED = sorted((a, b) for a, b in itertools.product(State, State) if b not in ALLOWED_TRANSITIONS[a])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_store(request, tmp_path_factory):
    """One migrated database per backend for the big transition tables (each test uses its own receipts)."""
    admin = name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('shared') / 'receipts.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        name = f"receipts_t_{uuid.uuid4().hex[:12]}"
        admin = psycopg.connect(make_url(server).set(drivername="postgresql").render_as_string(False), autocommit=True)
        admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(server).set(database=name).render_as_string(hide_password=False)
    command.upgrade(alembic_config(url), "head")
    engine = make_engine(url)
    yield ReceiptStore(engine)
    engine.dispose()
    if admin is not None:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_every_state_is_reachable_from_planned():
    assert set(PATHS) == set(State)


@pytest.mark.parametrize("src, dst", ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_allowed_transition_succeeds(shared_store, src, dst):
    op = recorded(shared_store, intent()).operation_id
    walk(shared_store, op, src)
    before = len(shared_store.receipts.history(op))
    rec = transitioned(shared_store, op, src, dst, {"note": "t"})
    got = shared_store.receipts.get(op)
    assert rec.state == got.state == dst
    assert (got.completed_at is not None) == (dst in TERMINAL_STATES)
    assert (got.submitted_at is not None) == (S.SUBMITTED in [*PATHS[src], dst])
    last = shared_store.receipts.history(op)[-1]
    assert len(shared_store.receipts.history(op)) == before + 1
    assert (last.from_state, last.to_state, last.detail) == (src, dst, {"note": "t"})


@pytest.mark.parametrize("src, dst", REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_refused_transition_raises_and_changes_nothing(shared_store, src, dst):
    op = recorded(shared_store, intent()).operation_id
    reached = walk(shared_store, op, src)
    before = shared_store.receipts.history(op)
    with pytest.raises(IllegalTransitionError):
        shared_store.receipts.transition(op, src, dst)
    assert shared_store.receipts.get(op) == reached
    assert shared_store.receipts.history(op) == before


def test_stale_expected_state_and_unknown_receipt(shared_store):
    op = recorded(shared_store, intent()).operation_id
    with pytest.raises(StaleStateError) as err:
        shared_store.receipts.transition(op, S.SUBMITTED, S.SUCCEEDED)
    assert (err.value.expected, err.value.actual) == ("submitted", "planned")
    with pytest.raises(ReceiptNotFoundError):
        shared_store.receipts.transition("op_missing", S.PLANNED, S.SUBMITTED)
    with pytest.raises(ValueError, match="account"):
        shared_store.receipts.transition(op, S.PLANNED, S.SUBMITTED, account="acct:mallory")
    assert shared_store.receipts.get(op).state == S.PLANNED and len(shared_store.receipts.history(op)) == 1


@pytest.mark.parametrize("two_engines", [False, True], ids=["threads", "two-engines"])
def test_compare_and_set_race_has_exactly_one_winner(store, migrated_url, two_engines):
    other = ReceiptStore(make_engine(migrated_url)) if two_engines else store
    try:
        for _round in range(5):
            op = recorded(store, intent()).operation_id
            store.receipts.transition(op, S.PLANNED, S.SUBMITTED)
            barrier = threading.Barrier(2)

            def race(s: ReceiptStore, to: State):
                barrier.wait()
                try:
                    return transitioned(s, op, S.SUBMITTED, to)
                except StaleStateError as e:
                    return e

            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(race, [store, other], [S.SUCCEEDED, S.OUTCOME_UNKNOWN]))
            wins = [r for r in results if isinstance(r, ReceiptRecord)]
            lost = [r for r in results if isinstance(r, StaleStateError)]
            assert len(wins) == 1 and len(lost) == 1, results
            assert (lost[0].expected, lost[0].actual) == ("submitted", wins[0].state)
            assert store.receipts.get(op).state == wins[0].state
            assert [t.from_state for t in store.receipts.history(op)].count("submitted") == 1
    finally:
        if two_engines:
            other.engine.dispose()


def test_open_intent_index_refuses_a_second_open_receipt(store):
    f = fp()
    first, prev = recorded(store, intent(f)), S.PLANNED
    for state in (S.PLANNED, S.SUBMITTED, S.OUTCOME_UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW):  # every open state
        if state != prev:
            prev = transitioned(store, first.operation_id, prev, state).state
        with pytest.raises(DuplicateOpenError) as err:
            recorded(store, intent(f))
        assert (err.value.operation_id, err.value.state) == (first.operation_id, state)
    with pytest.raises(IntegrityError), store.engine.begin() as c:  # the database itself enforces it
        c.execute(insert(receipts).values(**raw_row(f)))
    assert count(store, receipts, receipts.c.intent_fingerprint == f) == 1
    store.receipts.transition(first.operation_id, S.MANUAL_REVIEW, S.SAFE_TO_RETRY)
    with store.engine.begin() as c:  # terminal: the index no longer covers it
        c.execute(insert(receipts).values(**(row := raw_row(f))))
    with pytest.raises(DuplicateOpenError) as err:
        recorded(store, intent(f))
    assert err.value.operation_id == row["operation_id"]
    other = recorded(store, intent(f, account="acct:bob"))  # another account's identical intent
    assert other.state == S.PLANNED and other.account == "acct:bob"


def test_authentication_is_never_recorded(store):
    with pytest.raises(IntegrityError), store.engine.begin() as c:
        c.execute(insert(receipts).values(**raw_row(fp()), authentication_recorded=True))


def test_idempotency_key_reuse_with_another_fingerprint(store):
    first = recorded(store, intent(idempotency_key="key-1"))
    for attempt in range(2):
        with pytest.raises(IdempotencyKeyMismatchError) as err:
            recorded(store, intent(idempotency_key="key-1"))
        assert err.value.operation_id == first.operation_id and "key-1" in str(err.value)
        if attempt == 0:  # still refused once the first receipt is terminal
            store.receipts.transition(first.operation_id, S.PLANNED, S.REJECTED)
    assert count(store, receipts) == 1
    assert recorded(store, intent(idempotency_key="key-1", account="acct:bob")).state == S.PLANNED


def test_idempotency_key_reuse_with_the_same_fingerprint_is_a_retry(store):
    f = fp()
    first = recorded(store, intent(f, idempotency_key="key-2"))
    with pytest.raises(DuplicateOpenError) as err:  # the open receipt blocks it, not a key mismatch
        recorded(store, intent(f, idempotency_key="key-2"))
    assert type(err.value) is DuplicateOpenError and err.value.operation_id == first.operation_id
    store.receipts.transition(first.operation_id, S.PLANNED, S.REJECTED)
    assert recorded(store, intent(f, idempotency_key="key-2")).state == S.PLANNED


def succeeded(store: ReceiptStore, f: str, age: float = 0.0) -> ReceiptRecord:
    op = recorded(store, intent(f)).operation_id
    return walk(store, op, S.SUCCEEDED, completed_at=utcnow() - timedelta(seconds=age))


@pytest.mark.parametrize("policy", ["replay", "refuse"])
def test_after_success_replay_and_refuse(store, policy):
    f = fp()
    done = succeeded(store, f)
    with pytest.raises(DuplicateSucceededError) as err:
        recorded(store, intent(f), AfterSuccess(policy=policy, window="15m"))
    assert err.value.blocker.kind == BlockKind.SUCCEEDED and err.value.operation_id == done.operation_id
    assert isinstance(err.value.blocker.receipt, ReceiptRecord) and err.value.blocker.receipt.operation_id == done.operation_id
    assert err.value.blocker.receipt.state == S.SUCCEEDED
    assert count(store, receipts, receipts.c.intent_fingerprint == f) == 1


def test_after_success_allow_creates_a_new_receipt(store):
    f = fp()
    done = succeeded(store, f)
    new = recorded(store, intent(f), AfterSuccess(policy="allow", window="15m"))
    assert new.operation_id != done.operation_id and new.state == S.PLANNED


@pytest.mark.parametrize("age, window, refused", [(60, None, True), (3600, None, False), (60, 900, True),
                                                  (3600, 900, False), (3600, 7200, True), (60, 0, False)])
def test_after_success_window(store, age, window, refused):
    f = fp()
    succeeded(store, f, age=age)
    policy = None if window is None else AfterSuccess(policy="refuse", window=window)
    if refused:
        with pytest.raises(DuplicateSucceededError):
            recorded(store, intent(f), policy)
    else:
        assert recorded(store, intent(f), policy).state == S.PLANNED


def test_history_is_complete_and_ordered(store):
    op = recorded(store, intent(proxy_instance="proxy-1")).operation_id
    path = [S.SUBMITTED, S.OUTCOME_UNKNOWN, S.RECONCILING, S.OUTCOME_UNKNOWN, S.RECONCILING, S.MANUAL_REVIEW,
            S.SUCCEEDED]
    recorded(store, intent())  # another receipt's history must not interleave
    for i, (a, b) in enumerate(zip([S.PLANNED, *path], path)):
        store.receipts.transition(op, a, b, {"step": i, "who": "test"})
    history = store.receipts.history(op)
    assert [(h.from_state, h.to_state) for h in history] == list(zip([None, S.PLANNED, *path], [S.PLANNED, *path]))
    assert history[0].detail["who"] == "proxy-1" and history[0].detail["fingerprint"].startswith("sha256:")
    assert [h.detail for h in history[1:]] == [{"step": i, "who": "test"} for i in range(len(path))]
    assert [h.id for h in history] == sorted({h.id for h in history})
    assert [h.recorded_at for h in history] == sorted(h.recorded_at for h in history)
    assert {h.operation_id for h in history} == {op} and store.receipts.get(op).state == history[-1].to_state


def test_timestamps_are_aware_utc(store, migrated_url):
    before = utcnow()
    op = recorded(store, intent()).operation_id
    returned = [transitioned(store, op, S.PLANNED, S.SUBMITTED).submitted_at,
                transitioned(store, op, S.SUBMITTED, S.SUCCEEDED).completed_at]
    after = utcnow()
    # read back through a session in another time zone: the values must still come out as UTC
    args = {"connect_args": {"options": "-c timezone=America/New_York"}} if store.db.dialect == "postgresql" else {}
    elsewhere = ReceiptStore(make_engine(migrated_url, **args))
    try:
        got = elsewhere.receipts.get(op)
        stamps = [*returned, got.created_at, got.updated_at, got.submitted_at, got.completed_at,
                  *(h.recorded_at for h in elsewhere.receipts.history(op))]
    finally:
        elsewhere.engine.dispose()
    for ts in stamps:
        assert ts.tzinfo is not None and ts.utcoffset() == timedelta(0), ts
        assert before - timedelta(seconds=1) <= ts <= after + timedelta(seconds=1)
    assert got.created_at <= got.submitted_at <= got.completed_at == got.updated_at


def test_twenty_identical_intents_at_once_make_one_receipt(store):
    f, barrier = fp(), threading.Barrier(20)

    def attempt(_):
        barrier.wait()
        try:
            return recorded(store, intent(f))
        except DuplicateOpenError as e:
            return e

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(attempt, range(20)))
    made = [r for r in results if isinstance(r, ReceiptRecord)]
    refused = [r for r in results if isinstance(r, DuplicateOpenError)]
    assert (len(made), len(refused)) == (1, 19), results
    assert {r.operation_id for r in refused} == {made[0].operation_id}
    assert count(store, receipts, receipts.c.intent_fingerprint == f) == 1
    assert count(store, transitions) == 1


