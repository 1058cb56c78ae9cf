"""The journal's kept counts (migration 0008's triggers, store/retention.py) and background retention, on SQLite
and PostgreSQL: the counts equal count(*) by host and state after every kind of change, whoever makes it (the
store's writes, a person's SQL, prune), folded or not; prune goes in batches, resumes where it stopped, and
honours each host's own age; `retention:` is parsed and applied by the Housekeeping addon."""

import asyncio
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import delete, func, insert, select, update
from support.e2e import wait_for
from support.store import S, intent, recorded, walk

from proxy_addon.addons.housekeeping import Housekeeping
from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.journal.tables import ReceiptCount, VerifierControl
from proxy_addon.rules.records import utcnow
from proxy_addon.store import ReceiptStore
from proxy_addon.store import retention as retention_module
from proxy_addon.store.receipts import receipts

counts_table = ReceiptCount.__table__


def counted(store: ReceiptStore) -> dict[tuple[str, str], int]:
    """count(*) by host and state: what the kept counts must equal."""
    with store.engine.connect() as c:
        rows = c.execute(select(receipts.c.host, receipts.c.state, func.count()).group_by(receipts.c.host, receipts.c.state))
        return {(h, s): n for h, s, n in rows}


def kept(store: ReceiptStore) -> dict[tuple[str, str], int]:
    stats = store.retention.stats()
    return {(h, s): n for h, per in stats.by_host.items() for s, n in per.items()}


def count_rows(store: ReceiptStore) -> int:
    with store.engine.connect() as c:
        return int(c.execute(select(func.count()).select_from(counts_table)).scalar_one())


def old(store: ReceiptStore, op: str, days: float) -> None:
    with store.engine.begin() as c:
        c.execute(update(receipts).where(receipts.c.operation_id == op).values(completed_at=utcnow() - timedelta(days=days)))


def test_the_kept_counts_equal_count_by_host_and_state_after_every_kind_of_change(store):
    ops = {}
    for host in ("a.example", "b.example"):
        for state in (S.SUCCEEDED, S.REJECTED, S.OUTCOME_UNKNOWN, S.MANUAL_REVIEW, S.SUBMITTED, S.PLANNED):
            op = recorded(store, intent(host=host)).operation_id
            walk(store, op, state)
            ops[(host, state)] = op
    assert kept(store) == counted(store)
    assert store.retention.stats().by_state["succeeded"] == 2
    with store.engine.begin() as c:  # a person's SQL: a state changed, a receipt deleted
        c.execute(update(receipts).where(receipts.c.operation_id == ops[("a.example", S.MANUAL_REVIEW)]).values(state="safe_to_retry"))
        c.execute(delete(receipts).where(receipts.c.operation_id == ops[("b.example", S.REJECTED)]))
    assert kept(store) == counted(store)
    rows = count_rows(store)
    assert store.retention.fold_counts() == rows
    assert count_rows(store) <= len(counted(store)) < rows  # one row per host and state, zeros dropped
    assert kept(store) == counted(store)


def test_prune_goes_in_batches_resumes_where_it_stopped_and_keeps_the_counts(store, monkeypatch):
    monkeypatch.setattr(retention_module, "BATCH", 3)
    monkeypatch.setattr(retention_module, "PG_BATCH", 3)
    doomed = []
    for _ in range(8):
        op = recorded(store, intent()).operation_id
        walk(store, op, S.SUCCEEDED)
        old(store, op, 10)
        doomed.append(op)
    young = recorded(store, intent()).operation_id
    walk(store, young, S.SUCCEEDED)
    seen: list[tuple[int, int]] = []
    stop_after = {"batches": 2}

    def progress(done: int, total: int) -> None:
        seen.append((done, total))

    first = store.retention.prune(timedelta(days=1), progress, pause=0, stop=lambda: len(seen) >= stop_after["batches"])
    assert (first.receipts, first.batches) == (6, 2) and seen == [(3, 8), (6, 8)]
    assert kept(store) == counted(store)
    second = store.retention.prune(timedelta(days=1), pause=0)  # resumed: the rest
    assert (second.receipts, second.batches) == (2, 1)
    with store.engine.connect() as c:
        assert set(c.execute(select(receipts.c.operation_id)).scalars()) == {young}
    assert kept(store) == counted(store) == {("api.example.com", "succeeded"): 1}


def test_each_host_keeps_its_own_age(store):
    def made(host: str, days: float) -> str:
        op = recorded(store, intent(host=host)).operation_id
        walk(store, op, S.SUCCEEDED)
        old(store, op, days)
        return op

    short, long_kept, default_gone, default_kept = made("short.example", 3), made("long.example", 20), made("other.example", 10), made("other.example", 5)
    settings = parse_config("retention: {terminal: 7d, hosts: {short.example: 1d, long.example: 30d}}").retention
    assert settings is not None
    pruned = retention_module.prune_by_retention(store.retention, settings, lambda: False)
    with store.engine.connect() as c:
        left = set(c.execute(select(receipts.c.operation_id)).scalars())
    assert left == {long_kept, default_kept} and pruned.receipts == 2
    assert short not in left and default_gone not in left
    assert kept(store) == counted(store)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("retention: {}", "retention.terminal"),
        ("retention: {terminal: 0s}", "retention.terminal"),
        ("retention: {terminal: 7d, hosts: {a.example: soon}}", "retention.hosts"),
        ("retention: {terminal: 7d, every: 1h}", "retention.every"),
    ],
)
def test_a_bad_retention_is_named_in_one_line(text, error):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_retention_is_off_by_default():
    assert parse_config("").retention is None


def test_housekeeping_folds_the_counts_and_applies_retention_in_the_background(store):
    op = recorded(store, intent()).operation_id
    walk(store, op, S.SUCCEEDED)
    old(store, op, 10)
    config = parse_config("proxy: {heartbeat_interval: 50ms}\nretention: {terminal: 7d, interval: 1h}")
    housekeeping = Housekeeping(SimpleNamespace(config=config, store=store))  # type: ignore[arg-type]

    async def life() -> None:
        housekeeping.running()
        done = lambda: not counted(store) and count_rows(store) <= len(counted(store))  # noqa: E731
        await asyncio.to_thread(wait_for, done, 20, 0.02)  # the prune, and a fold after it: bounded
        await housekeeping.done()

    asyncio.run(life())
    assert counted(store) == {} and kept(store) == {}


def test_prune_keeps_each_rules_newest_control_run_however_old(store):
    """A rule's health shows its newest control run: an old one is pruned only when a newer run of the same rule
    and control exists."""
    controls = VerifierControl.__table__
    now = utcnow()

    def run(days: float, control: str = "positive", rule: str = "sha256:rule-a") -> dict:
        return {"checked_at": now - timedelta(days=days), "host": "api.example.com", "port": 443, "operation": "x.create",
                "account": "acct:alice", "rule": rule, "control": control, "result": "passed", "evidence": {}}

    with store.engine.begin() as c:
        c.execute(insert(controls), [run(40), run(30), run(20, "negative"), run(10, rule="sha256:rule-b"), run(0)])
    pruned = store.retention.prune(timedelta(days=7), pause=0)
    with store.engine.connect() as c:
        left = sorted((r.rule, r.control, round((now - r.checked_at).total_seconds() / 86400)) for r in c.execute(select(controls)))
    assert left == [("sha256:rule-a", "negative", 20), ("sha256:rule-a", "positive", 0), ("sha256:rule-b", "positive", 10)]
    assert pruned.control_runs == 2


def test_housekeeping_is_done_only_once_the_work_on_its_thread_is(store, monkeypatch):
    """Shutdown waits for a fold (or a prune's batch) under way: no connection of it outlives the proxy (a test's
    database could not be dropped while one was still in use)."""
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow_fold() -> int:
        started.set()
        release.wait(10)
        finished.set()
        return 0

    monkeypatch.setattr(store.retention, "fold_counts", slow_fold)
    housekeeping = Housekeeping(SimpleNamespace(config=parse_config(""), store=store))  # type: ignore[arg-type]

    async def life() -> None:
        housekeeping.running()
        assert await asyncio.to_thread(started.wait, 10)
        closing = asyncio.ensure_future(housekeeping.done())
        await asyncio.sleep(0)  # done() has begun
        release.set()
        await closing
        assert finished.is_set()

    asyncio.run(life())
