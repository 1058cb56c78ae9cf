"""Retention: `receipts prune` deletes exactly the terminal receipts completed before the cutoff, with their
history, and never an open one whatever its age; on SQLite and on PostgreSQL, through the store and the CLI.

Receipts are walked to their state through the store, then made old by rewriting their timestamps directly
(SQLAlchemy Core on the store's engine). Open receipts get old `completed_at` values too, which the normal
flow never writes, so that prune is seen to decide by state and not by timestamps alone.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select, update
from support.store import intent, recorded, walk

from proxy_addon.cli import main
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import OPEN_STATES, TERMINAL_STATES, State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts, transitions
from proxy_addon.store.refusals import refusals
from proxy_addon.units import parse_duration

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Made:
    operation_id: str
    state: State
    completed_at: datetime | None


def make(store: ReceiptStore, state: State, completed_age: timedelta | None, created_age: timedelta, now: datetime) -> Made:
    """A receipt in `state`, created `created_age` ago, completed `completed_age` ago (None: no completed_at)."""
    op = recorded(store, intent()).operation_id
    walk(store, op, state)
    completed = None if completed_age is None else now - completed_age
    created = now - created_age
    with store.engine.begin() as c:
        c.execute(
            update(receipts)
            .where(receipts.c.operation_id == op)
            .values(created_at=created, updated_at=min(created, completed or created), completed_at=completed)
        )
    return Made(op, state, completed)


def doomed(made: list[Made], older_than: timedelta, now: datetime) -> set[str]:
    """The oracle: terminal, with a completed_at before now - older_than."""
    return {
        m.operation_id
        for m in made
        if m.state in TERMINAL_STATES and m.completed_at is not None and m.completed_at < now - older_than
    }


def remaining(store: ReceiptStore) -> set[str]:
    with store.engine.connect() as c:
        return set(c.execute(select(receipts.c.operation_id)).scalars())


def histories(store: ReceiptStore) -> dict[str, list[tuple]]:
    with store.engine.connect() as c:
        rows = c.execute(select(transitions).order_by(transitions.c.id)).all()
    out: dict[str, list[tuple]] = {}
    for r in rows:
        out.setdefault(r.operation_id, []).append(tuple(r))
    return out


def check_prune(store: ReceiptStore, made: list[Made], older_than: timedelta, prune) -> int:
    """Prune with `prune(older_than)` and check the result against the oracle; returns how many went."""
    before, history_before = remaining(store), histories(store)
    expected_gone = doomed([m for m in made if m.operation_id in before], older_than, utcnow())
    deleted = prune(older_than)
    after = remaining(store)
    assert before - after == expected_gone, (older_than, sorted(before - after), sorted(expected_gone))
    assert deleted == len(expected_gone)
    open_ids = {m.operation_id for m in made if m.state in OPEN_STATES}
    assert open_ids <= after, "an open receipt was pruned"
    history_after = histories(store)
    assert not set(history_after) & expected_gone, "a pruned receipt left history behind"
    assert history_after == {op: h for op, h in history_before.items() if op not in expected_gone}
    return deleted


AGES = [timedelta(0), 2 * HOUR, timedelta(days=3), timedelta(days=10), timedelta(days=40)]


def every_state_and_age(store: ReceiptStore, now: datetime) -> list[Made]:
    made = [make(store, state, age, age + HOUR, now) for state in State for age in AGES]
    # terminal receipts without completed_at (not written by the store; a hand-edited row): age unknown, kept
    made += [make(store, state, None, timedelta(days=60), now) for state in sorted(TERMINAL_STATES)]
    return made


def test_prune_deletes_exactly_the_old_terminal_receipts(store):
    made = every_state_and_age(store, utcnow())
    victim = next(m for m in made if m.state == State.SUCCEEDED and m.completed_at and m.completed_at < utcnow() - timedelta(days=30))
    refusal = store.refusals.record("duplicate_succeeded_refuse", victim.operation_id,
                                    intent(fingerprint="sha256:" + "0" * 64, path="/x"))

    def refusal_kept() -> bool:
        with store.engine.connect() as c:
            return c.execute(select(func.count()).select_from(refusals).where(refusals.c.id == refusal.id)).scalar_one() == 1

    counts = [check_prune(store, made, d, lambda d: store.retention.prune(d).receipts) for d in
              (timedelta(days=30), timedelta(days=30), timedelta(days=7), timedelta(days=1), HOUR)]
    assert refusal_kept()  # what was refused because of a pruned receipt is kept by its own age
    counts.append(check_prune(store, made, timedelta(0), lambda d: store.retention.prune(d).receipts))
    assert not refusal_kept()  # and pruned by it

    terminal = len(TERMINAL_STATES)
    assert counts == [terminal, 0, terminal, terminal, terminal, terminal]
    left = remaining(store)
    assert left == {m.operation_id for m in made if m.state in OPEN_STATES or m.completed_at is None}
    assert len(left) == len(OPEN_STATES) * len(AGES) + terminal


@pytest.fixture
def prune_cli(migrated_url, tmp_path, monkeypatch, capsys):
    """`receipts prune --older-than D --json` in-process on the migrated database; returns the count it printed."""
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", migrated_url)

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(["prune", *args, "--config", str(config)])
        except SystemExit as e:  # argparse's bad usage
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("spelled", [("30d", "7d", "24h", "90m", "0s")])
def test_prune_command_never_deletes_an_open_receipt(store, prune_cli, spelled):
    made = every_state_and_age(store, utcnow())

    def via_cli(older_than: timedelta) -> int:
        text = next(s for s in spelled if parse_duration(s) == older_than.total_seconds())
        code, out, err = prune_cli("--older-than", text, "--json")
        assert code == 0, err
        return json.loads(out)["deleted"]

    for text in spelled:
        check_prune(store, made, timedelta(seconds=parse_duration(text)), via_cli)
    assert remaining(store) == {m.operation_id for m in made if m.state in OPEN_STATES or m.completed_at is None}

    code, out, err = prune_cli("--older-than", "1d")  # the line for people
    assert code == 0 and out.startswith("deleted 0 terminal receipts")
    for bad in ("ten days", "-1d", "5y", "", "99999999d"):
        code, out, err = prune_cli(f"--older-than={bad}")
        assert code == 2 and out == "" and "--older-than" in err and "Traceback" not in err, (bad, err)
    assert remaining(store) == {m.operation_id for m in made if m.state in OPEN_STATES or m.completed_at is None}


# -- a generated mix of states and ages, against the oracle ----------------------------------------------------

hours = st.integers(0, 24 * 60)
receipt_specs = st.lists(
    st.tuples(st.sampled_from(list(State)), st.none() | hours, hours),  # state, completed hours ago, created hours ago
    min_size=1,
    max_size=10,
)
durations_h = st.lists(st.integers(0, 24 * 60), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=receipt_specs, prunes=durations_h, half=st.booleans())
def test_prune_matches_the_oracle_for_any_mix(store, specs, prunes, half):
    with store.engine.begin() as c:  # each example starts from empty tables
        c.execute(delete(transitions))
        c.execute(delete(receipts))
    now = utcnow()
    # whole hours of age and of duration, shifted by half an hour or not: never within a minute of the cutoff
    shift = timedelta(minutes=30) if half else timedelta(0)
    made = [
        make(store, state, None if done is None else timedelta(hours=done) + shift, timedelta(hours=max(made_h, done or 0)) + shift, now)
        for state, done, made_h in specs
    ]
    for h in prunes:
        check_prune(store, made, timedelta(hours=h, minutes=10), lambda d: store.retention.prune(d).receipts)
    assert {m.operation_id for m in made if m.state in OPEN_STATES} <= remaining(store)
