"""The reconciliation worker end to end: an agent's write goes through a real in-process proxy to a real
JSON API on 127.0.0.1 (tests/support/world.py) that commits and hangs, never stores, stores late, holds
near-duplicates; the proxy times out (outcome_unknown); then `Reconciler.run_once()` (or
`receipts reconcile --once`) reads the world and gives a verdict, with its evidence in the history.

Each test gets its own world and proxy, with the rules it names, and an emptied database: one SQLite file
and one PostgreSQL database per module, every test runs on both. The unit table for `decide()` is at the end.
"""

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text
from support.proxy import REPO, RunningProxy, start_inprocess_proxy
from support.world import COMMIT_THEN_HANG, DELETE_THEN_HANG, HANG_WITHOUT_DELETE, HANG_WITHOUT_STORE, OK, World, start_world

from proxy_addon.config import ReceiptsConfig, ReconcileRule, load_config
from proxy_addon.db import make_engine
from proxy_addon.reconcile.decide import ReadOutcome, decide
from proxy_addon.reconcile.worker import PassReport, Reconciler
from proxy_addon.records import ReceiptRecord, TransitionRecord, Verdict
from proxy_addon.states import State
from proxy_addon.store import ReceiptStore

PROXY_TIMEOUT = "0.3s"
PROBLEM_JSON = "application/problem+json"
ARTICLES_URL = "{scheme}://{netloc}/api/articles?per_page=30"


# -- the environment: world, config, proxy, store --------------------------------------------------------


@dataclass
class Env:
    world: World
    proxy: RunningProxy
    store: ReceiptStore
    config: ReceiptsConfig
    config_path: Path
    database_url: str
    client: httpx.Client

    def post(self, path: str, document: Any, **kw: Any) -> httpx.Response:
        return self.client.post(self.world.base + path, json=document, **kw)

    def unknown(self, path: str, document: Any, **kw: Any) -> str:
        """Send a write the world leaves unanswered: the proxy says 504 outcome_unknown; returns the receipt id."""
        r = self.post(path, document, **kw)
        return outcome_unknown(r)

    def reconcile(self, worker_id: str | None = None) -> PassReport:
        return asyncio.run(Reconciler(self.config, self.store, worker_id).run_once())


@pytest.fixture
def db_url(module_db_url: str) -> str:
    """The module's database, emptied: every test starts with no receipt and no proxy instance."""
    engine = make_engine(module_db_url)
    try:
        with engine.begin() as conn:
            for table in ("receipt_transitions", "receipts", "proxy_instances"):
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()
    return module_db_url


@pytest.fixture
def make_env(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Env]]:
    """`make_env(operations, reconcile=None, **host_settings)`: a world, its config, the emptied database, the
    proxy; afterwards, every receipt's history is checked whole."""
    envs: list[Env] = []
    with ExitStack() as stack:

        def make(operations: list[dict[str, Any]], reconcile: dict[str, Any] | None = None, **host: Any) -> Env:
            world = start_world()
            stack.callback(world.stop)
            config_path = tmp_path / "config.yaml"
            settings = {"backoff": "50ms", "lease": "30s", "per_host_rate": 1000, "concurrency": 4, "batch_size": 10}
            config_path.write_text(
                yaml.safe_dump(
                    {
                        "secret_file": str(tmp_path / "secret"),
                        "defaults": {"upstream_timeout": PROXY_TIMEOUT, "connect_timeout": "2s"},
                        "reconcile": {**settings, **(reconcile or {})},
                        "logging": {"level": "warning", "format": "json"},
                        "hosts": {world.netloc: {"operations": operations, **host}},
                    }
                )
            )
            proxy = start_inprocess_proxy(config_path, db_url, tmp_path / "confdir")
            stack.callback(proxy.stop)
            engine = make_engine(db_url)
            stack.callback(engine.dispose)
            client = stack.enter_context(httpx.Client(proxy=proxy.url, trust_env=False, timeout=15))
            env = Env(world, proxy, ReceiptStore(engine), load_config(config_path), config_path, db_url, client)
            envs.append(env)
            return env

        yield make
        for env in envs:
            assert_history_is_whole(env.store)


def assert_history_is_whole(store: ReceiptStore) -> None:
    """After every test: each receipt's history chains from planned to its state, every verdict of a
    worker names it and says why, and nothing was reconciled that had not been outcome_unknown first."""
    for receipt in store.receipts.list(limit=None):
        history = store.receipts.history(receipt.operation_id)
        states = [t.to_state for t in history]
        assert [t.from_state for t in history] == [None, *states[:-1]], states
        assert states[-1] == receipt.state
        for i, t in enumerate(history):
            if t.from_state == "reconciling":
                assert t.detail.get("who") and (t.detail.get("result") or t.detail.get("reason")), t.detail
            if t.to_state == "reconciling":
                assert states[i - 1] == "outcome_unknown" and "submitted" in states[:i]


def outcome_unknown(r: httpx.Response) -> str:
    assert r.status_code == 504, r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    assert r.json()["type"].endswith("outcome-unknown")
    assert r.headers["X-Receipt-State"] == "outcome_unknown"
    return r.headers["X-Receipt-Id"]


def steps(store: ReceiptStore, op: str) -> list[tuple[str | None, str]]:
    return [(t.from_state, t.to_state) for t in store.receipts.history(op)]


def verdict(store: ReceiptStore, op: str) -> TransitionRecord:
    """The last transition, which must be a reconciler's verdict."""
    last = store.receipts.history(op)[-1]
    assert last.from_state == "reconciling", steps(store, op)
    return last


UNKNOWN_THEN = [(None, "planned"), ("planned", "submitted"), ("submitted", "outcome_unknown"), ("outcome_unknown", "reconciling")]


def assert_unknown_kept(store: ReceiptStore, op: str) -> None:
    """The history still says the receipt was unknown, and why: nothing was overwritten."""
    history = store.receipts.history(op)
    unknown = [t for t in history if t.to_state == "outcome_unknown" and t.from_state == "submitted"]
    assert len(unknown) == 1
    assert [(t.from_state, t.to_state) for t in history[:4]] == UNKNOWN_THEN
    assert store.receipts.get(op).error_code == "upstream_timeout"


def title() -> str:
    return f"Receipts are durable {uuid.uuid4().hex[:8]}"


# -- rules ----------------------------------------------------------------------------------------------------


def articles_rule(reconcile: dict[str, Any], retry_safe: bool = True, **kw: Any) -> dict[str, Any]:
    return {
        "name": "articles.create",
        "method": "POST",
        "path": "/api/articles",
        "fingerprint": {"fields": ["$.title", "$.body_markdown"]},
        "external_id": "$.id",
        "retry_safe": retry_safe,
        "reconcile": reconcile,
        **kw,
    }


def search(**kw: Any) -> dict[str, Any]:
    return {
        "strategy": "search",
        "url": ARTICLES_URL,
        "items": "$.items",
        "match": {"$.title": "$.title"},
        "id": "$.id",
        "settle": "0s",
        **kw,
    }


def lookup(url: str = "{scheme}://{netloc}/api/articles/{body.id}", **kw: Any) -> dict[str, Any]:
    return {"strategy": "lookup", "url": url, "match": {"$.title": "$.title"}, "id": "$.id", "settle": "0s", **kw}


# -- committed, then timed out: the write is found ------------------------------------------------------------


def test_committed_then_timed_out_search_finds_it_with_its_id(make_env):
    env = make_env([articles_rule(search())])
    env.world.add_article("An older article", "unrelated")
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "# hi"})
    (stored_id,) = env.world.article_ids_titled(t)

    report = env.reconcile("worker-a")

    assert (report.claimed, dict(report.verdicts)) == (1, {"succeeded": 1})
    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", stored_id)
    assert (receipt.lease_owner, receipt.lease_expires_at) == (None, None)
    assert steps(env.store, op) == [*UNKNOWN_THEN, ("reconciling", "succeeded")]
    assert_unknown_kept(env.store, op)
    d = verdict(env.store, op).detail
    assert (d["who"], d["strategy"], d["result"], d["matched_id"]) == ("worker-a", "search", "present", stored_id)
    assert d["reads"] == [
        {"method": "GET", "url": f"{env.world.base}/api/articles?per_page=30", "status": 200, "elapsed_ms": d["reads"][0]["elapsed_ms"]}
    ]
    assert d["candidates"] == [stored_id]
    assert d["unknown_for_seconds"] >= 0.25
    assert len(env.world.received("POST", "/api/articles")) == 1  # a read, never another write


def test_committed_then_timed_out_lookup_finds_it(make_env):
    env = make_env([articles_rule(lookup())])
    env.world.article_mode = COMMIT_THEN_HANG
    t, client_id = title(), f"art-{uuid.uuid4().hex[:8]}"
    op = env.unknown("/api/articles", {"id": client_id, "title": t, "body_markdown": "x"})

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", client_id)
    d = verdict(env.store, op).detail
    assert d["read"]["url"] == f"{env.world.base}/api/articles/{client_id}"
    assert (d["read"]["status"], d["result"], d["matched_id"]) == (200, "present", client_id)
    assert_unknown_kept(env.store, op)
    assert [r.path for r in env.world.received("GET")] == [f"/api/articles/{client_id}"]


def test_lookup_finding_a_different_resource_goes_to_a_person(make_env):
    env = make_env([articles_rule(lookup())])
    client_id = f"art-{uuid.uuid4().hex[:8]}"
    env.world.add_article("someone else's article", "y", article_id=client_id)
    env.world.article_mode = HANG_WITHOUT_STORE
    op = env.unknown("/api/articles", {"id": client_id, "title": title(), "body_markdown": "x"})

    env.reconcile()

    assert env.store.receipts.get(op).state == "manual_review"
    d = verdict(env.store, op).detail
    assert (d["result"], d["read"]["status"]) == ("mismatch", 200)
    assert "does not match" in d["reason"]


def test_cli_reconcile_once_settles_a_timed_out_write(make_env):
    env = make_env([articles_rule(search())])
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "cli"})
    (stored_id,) = env.world.article_ids_titled(t)

    done = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "reconcile", "--once", "--config", str(env.config_path)],
        env={**os.environ, "RECEIPTS_DATABASE_URL": env.database_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert "reconciled 1: succeeded 1" in done.stdout
    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", stored_id)
    assert verdict(env.store, op).detail["who"].startswith("worker-")


# -- never received: safe to retry only when the rule says so -------------------------------------------------


def test_never_stored_with_retry_safe_is_safe_to_retry_and_a_retry_is_forwarded(make_env):
    env = make_env([articles_rule(search(), retry_safe=True)])
    env.world.article_mode = HANG_WITHOUT_STORE
    document = {"title": title(), "body_markdown": "retry me"}
    op = env.unknown("/api/articles", document)

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert receipt.state == "safe_to_retry" and receipt.completed_at is not None
    d = verdict(env.store, op).detail
    assert (d["result"], d["matched"], d["candidates"]) == ("absent", 0, [])
    assert d["reads"][0]["status"] == 200
    assert "absent_means safe_to_retry" in d["reason"]
    assert_unknown_kept(env.store, op)

    env.world.article_mode = OK
    again = env.post("/api/articles", document)
    assert again.status_code == 201, again.text
    assert again.headers["X-Receipt-Id"] != op
    assert again.headers["X-Receipt-State"] == "succeeded"
    assert len(env.world.received("POST", "/api/articles")) == 2
    assert env.world.article_ids_titled(document["title"]) == [again.json()["id"]]


def test_never_stored_without_retry_safe_goes_to_a_person_and_a_retry_stays_refused(make_env):
    env = make_env([articles_rule(search(), retry_safe=False)])
    env.world.article_mode = HANG_WITHOUT_STORE
    document = {"title": title(), "body_markdown": "do not retry"}
    op = env.unknown("/api/articles", document)

    env.reconcile()

    assert env.store.receipts.get(op).state == "manual_review"
    d = verdict(env.store, op).detail
    assert d["result"] == "absent" and "manual_review" in d["reason"]

    env.world.article_mode = OK
    again = env.post("/api/articles", document)
    assert again.status_code == 409, again.text
    problem = again.json()
    assert problem["type"].endswith("duplicate-open")
    assert (problem["operation_id"], problem["state"]) == (op, "manual_review")
    assert len(env.world.received("POST", "/api/articles")) == 1


# -- eventual consistency: absence proves nothing before settle -----------------------------------------------


def test_eventually_consistent_record_is_not_called_absent_before_settle(make_env):
    env = make_env([articles_rule(search(settle="1.5s"))])
    env.world.article_mode, env.world.visible_after = COMMIT_THEN_HANG, 0.9
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "late"})
    (stored_id,) = env.world.article_ids_titled(t)
    submitted_at = env.store.receipts.get(op).submitted_at

    early = env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (early.claimed, receipt.state, receipt.reconcile_attempts) == (1, "outcome_unknown", 0)
    assert receipt.next_attempt_at == submitted_at + timedelta(seconds=1.5)
    assert receipt.next_attempt_at > datetime.now(UTC)
    d = verdict(env.store, op).detail
    assert d["result"] == "absent" and d["reason"].startswith("not settled")

    # the record becomes visible, but the receipt is not due before its settle time
    deadline = time.monotonic() + 4
    while time.monotonic() < env.world.visible_at(stored_id) + 0.05:
        time.sleep(0.02)
    if datetime.now(UTC) < receipt.next_attempt_at - timedelta(milliseconds=150):  # else too slow to tell
        assert env.reconcile().claimed == 0
        assert env.store.receipts.get(op).state == "outcome_unknown"

    while datetime.now(UTC) < receipt.next_attempt_at + timedelta(milliseconds=30):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    late = env.reconcile()

    assert dict(late.verdicts) == {"succeeded": 1}
    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", stored_id)
    assert steps(env.store, op) == [
        *UNKNOWN_THEN,
        ("reconciling", "outcome_unknown"),
        ("outcome_unknown", "reconciling"),
        ("reconciling", "succeeded"),
    ]


# -- near-duplicates and twins --------------------------------------------------------------------------------


def test_near_duplicate_records_the_match_picks_the_right_one(make_env):
    match = {"$.title": "$.title", "$.body_markdown": "$.body_markdown"}
    env = make_env([articles_rule(search(match=match))])
    t = title()
    decoy = env.world.add_article(t, "the first draft")
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "the final text"})
    (mine,) = [i for i in env.world.article_ids_titled(t) if i != decoy]

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", mine)
    assert verdict(env.store, op).detail["candidates"] == [mine]


def test_identical_twins_go_to_a_person_with_both_candidates(make_env):
    env = make_env([articles_rule(search(match={"$.title": "$.title", "$.body_markdown": "$.body_markdown"}))])
    t = title()
    twin = env.world.add_article(t, "same words")
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "same words"})
    both = env.world.article_ids_titled(t)
    assert len(both) == 2 and twin in both

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("manual_review", None)
    d = verdict(env.store, op).detail
    assert d["result"] == "ambiguous" and d["matched"] == 2
    assert sorted(d["candidates"]) == sorted(both)
    assert "2 records match" in d["reason"]


# -- a refund: the originating charge is part of the identity -------------------------------------------------


REFUND_RULE = {
    "name": "refunds.create",
    "method": "POST",
    "path": "/api/charges/{charge_id}/refunds",
    "external_id": "$.id",
    "retry_safe": True,
    "reconcile": {
        "strategy": "search",
        "url": "{scheme}://{netloc}/api/refunds?charge={path.charge_id}",
        "items": "$.items",
        "match": {"$.amount": "$.amount"},
        "id": "$.id",
        "settle": "0s",
    },
}


def test_refunds_of_the_same_amount_on_different_charges_are_different_intents(make_env):
    env = make_env([REFUND_RULE])
    env.world.add_refund("ch_other", 500)  # the same amount on a third charge: not ours
    env.world.refund_mode = COMMIT_THEN_HANG
    op_a = env.unknown("/api/charges/ch_A/refunds", {"amount": 500})
    op_b = env.unknown("/api/charges/ch_B/refunds", {"amount": 500})
    assert op_a != op_b
    assert len(env.world.received("POST", prefix="/api/charges/")) == 2

    again = env.post("/api/charges/ch_A/refunds", {"amount": 500})  # the same refund again is refused
    assert again.status_code == 409 and again.json()["operation_id"] == op_a
    assert len(env.world.received("POST", prefix="/api/charges/")) == 2

    env.reconcile()

    (refund_a,) = env.world.refunds_of("ch_A")
    (refund_b,) = env.world.refunds_of("ch_B")
    assert (env.store.receipts.get(op_a).state, env.store.receipts.get(op_a).external_id) == ("succeeded", refund_a["id"])
    assert (env.store.receipts.get(op_b).state, env.store.receipts.get(op_b).external_id) == ("succeeded", refund_b["id"])
    urls = sorted(verdict(env.store, op).detail["reads"][0]["url"] for op in (op_a, op_b))
    assert urls == [f"{env.world.base}/api/refunds?charge=ch_A", f"{env.world.base}/api/refunds?charge=ch_B"]


# -- a read that fails proves nothing -------------------------------------------------------------------------


def _wait_due(env: Env, op: str, limit: float = 3.0) -> None:
    due = env.store.receipts.get(op).next_attempt_at
    assert due is not None
    deadline = time.monotonic() + limit
    while datetime.now(UTC) <= due:
        assert time.monotonic() < deadline, "backoff longer than the test allows"
        time.sleep(0.02)


def test_a_failing_read_keeps_it_unknown_with_backoff_then_goes_to_a_person(make_env):
    env = make_env([articles_rule(lookup(attempts=3))], reconcile={"backoff": "300ms"})
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"id": f"art-{uuid.uuid4().hex[:8]}", "title": title(), "body_markdown": "x"})
    env.world.fail_reads(100)

    for attempt in (1, 2):
        before = datetime.now(UTC)
        report = env.reconcile()
        receipt = env.store.receipts.get(op)
        assert (report.claimed, receipt.state, receipt.reconcile_attempts) == (1, "outcome_unknown", attempt)
        assert receipt.next_attempt_at > before
        d = verdict(env.store, op).detail
        assert (d["result"], d["attempt"], d["read"]["status"]) == ("failed", attempt, 500)
        assert env.reconcile().claimed == 0  # not due again before its backoff
        _wait_due(env, op)

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.reconcile_attempts) == ("manual_review", 3)
    d = verdict(env.store, op).detail
    assert (d["result"], d["attempt"], d["read"]["status"]) == ("failed", 3, 500)
    assert "3 reads failed" in d["reason"]
    assert len(env.world.received("GET")) == 3
    assert [s for s in steps(env.store, op) if s[0] == "reconciling"] == [
        ("reconciling", "outcome_unknown"),
        ("reconciling", "outcome_unknown"),
        ("reconciling", "manual_review"),
    ]


def test_a_read_that_fails_once_is_tried_again_and_succeeds(make_env):
    env = make_env([articles_rule(search())])
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "x"})
    env.world.fail_reads(1)

    env.reconcile()
    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).reconcile_attempts) == ("outcome_unknown", 1)
    assert verdict(env.store, op).detail["reads"][0]["status"] == 500
    _wait_due(env, op)
    env.reconcile()

    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).external_id) == ("succeeded", env.world.article_ids_titled(t)[0])


def test_an_unreachable_read_endpoint_is_a_failed_read(make_env):
    env = make_env([articles_rule(lookup(url="http://127.0.0.1:9/api/articles/{body.id}", timeout="1s"))])
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"id": "a1", "title": title(), "body_markdown": "x"})

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.reconcile_attempts) == ("outcome_unknown", 1)
    d = verdict(env.store, op).detail
    assert d["result"] == "failed" and "ConnectError" in d["read"]["error"]


def test_one_pass_reads_a_receipt_once_even_with_no_backoff(make_env):
    env = make_env([articles_rule(search(attempts=3))], reconcile={"backoff": "0s"})
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})
    env.world.fail_reads(100)

    report = env.reconcile()

    assert (report.claimed, env.store.receipts.get(op).state, env.store.receipts.get(op).reconcile_attempts) == (1, "outcome_unknown", 1)
    assert len(env.world.received("GET")) == 1


def test_a_read_that_breaks_is_a_failed_read_and_the_rest_of_the_pass_goes_on(make_env):
    broken = {**REFUND_RULE, "reconcile": {**REFUND_RULE["reconcile"], "url": "http://127.0.0.1:99999/api/refunds"}}
    env = make_env([articles_rule(search()), broken])
    env.world.article_mode = env.world.refund_mode = COMMIT_THEN_HANG
    t = title()
    op_article = env.unknown("/api/articles", {"title": t, "body_markdown": "x"})
    op_refund = env.unknown("/api/charges/ch_X/refunds", {"amount": 1})

    env.reconcile()

    assert (env.store.receipts.get(op_article).state, env.store.receipts.get(op_article).external_id) == (
        "succeeded",
        env.world.article_ids_titled(t)[0],
    )
    refund = env.store.receipts.get(op_refund)
    assert (refund.state, refund.reconcile_attempts, refund.lease_owner) == ("outcome_unknown", 1, None)
    d = verdict(env.store, op_refund).detail
    assert d["result"] == "failed" and d["reads"][0]["url"] == "http://127.0.0.1:99999/api/refunds"
    assert d["reads"][0]["error"]


def test_a_read_whose_credential_is_not_set_proves_nothing(make_env, monkeypatch):
    monkeypatch.delenv("RECEIPTS_TEST_UNSET_KEY", raising=False)
    env = make_env([articles_rule(search(headers={"Authorization": "Bearer ${RECEIPTS_TEST_UNSET_KEY}"}))])
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})

    env.reconcile()

    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).reconcile_attempts) == ("outcome_unknown", 1)
    assert "RECEIPTS_TEST_UNSET_KEY is not set" in verdict(env.store, op).detail["reason"]
    assert env.world.received("GET") == []


def test_the_read_credential_comes_from_the_environment_and_is_never_stored(make_env, monkeypatch):
    monkeypatch.setenv("RECEIPTS_TEST_READ_KEY", "read-secret-123")
    env = make_env([articles_rule(search(headers={"Authorization": "Bearer ${RECEIPTS_TEST_READ_KEY}"}))])
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})

    env.reconcile()

    assert env.store.receipts.get(op).state == "succeeded"
    assert [r.headers["authorization"] for r in env.world.received("GET")] == ["Bearer read-secret-123"]
    assert "read-secret-123" not in repr(env.store.receipts.history(op)) + repr(env.store.receipts.get(op))


# -- search over pages ----------------------------------------------------------------------------------------


def test_search_follows_relative_next_links_and_counts_a_record_once(make_env):
    paged = search(url="{scheme}://{netloc}/api/articles?per_page=2", next_page="$.next")
    env = make_env([articles_rule(paged)])
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "x"})
    for i in range(3):  # newer articles push ours to page 2
        env.world.add_article(f"newer {i}", "y")

    env.reconcile()

    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).external_id) == ("succeeded", env.world.article_ids_titled(t)[0])
    d = verdict(env.store, op).detail
    assert [r["url"] for r in d["reads"]] == [
        f"{env.world.base}/api/articles?per_page=2",
        f"{env.world.base}/api/articles?per_page=2&page=2",
    ]


def test_search_never_follows_a_next_link_to_another_host(make_env):
    paged = search(
        url="{scheme}://{netloc}/api/articles?per_page=1", next_page="$.next", headers={"Authorization": "Bearer k"}
    )
    env = make_env([articles_rule(paged)])
    env.world.next_link_base = "http://127.0.0.2:9"
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})
    env.world.add_article("newer", "y")

    env.reconcile()

    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).reconcile_attempts) == ("outcome_unknown", 1)
    d = verdict(env.store, op).detail
    assert d["result"] == "failed" and "leaves 127.0.0.1" in d["reason"]
    assert len(d["reads"]) == 1


def test_search_does_not_call_absent_a_record_pushed_off_the_page_it_read(make_env):
    one_page = search(url="{scheme}://{netloc}/api/articles?per_page=2", time_field="$.created_at")
    env = make_env([articles_rule(one_page)])
    env.world.add_article("older than the write", "y")
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "x"})
    for i in range(2):  # newer articles fill the one page the rule reads
        env.world.add_article(f"newer {i}", "y")

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.reconcile_attempts) == ("outcome_unknown", 1)  # not safe_to_retry
    assert "absence not proven" in verdict(env.store, op).detail["reason"]

    with env.world.lock:  # the newer ones are gone: the page now reaches back past the write
        for i in [k for k, a in env.world.articles.items() if a["title"].startswith("newer")]:
            del env.world.articles[i]
    _wait_due(env, op)
    env.reconcile()
    assert (env.store.receipts.get(op).state, env.store.receipts.get(op).external_id) == ("succeeded", env.world.article_ids_titled(t)[0])


def test_search_calls_absent_once_the_page_reaches_back_past_the_write(make_env):
    one_page = search(url="{scheme}://{netloc}/api/articles?per_page=2", time_field="$.created_at")
    env = make_env([articles_rule(one_page)])
    env.world.add_article("older than the write", "y")
    env.world.article_mode = HANG_WITHOUT_STORE
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})
    env.world.add_article("newer", "y")

    env.reconcile()

    assert env.store.receipts.get(op).state == "safe_to_retry"


# -- DELETE ---------------------------------------------------------------------------------------------------


def delete_rule(absent_means: str, retry_safe: bool = False) -> dict[str, Any]:
    return {
        "name": "articles.delete",
        "method": "DELETE",
        "path": "/api/articles/{id}",
        "retry_safe": retry_safe,
        "reconcile": {
            "strategy": "lookup",
            "url": "{scheme}://{netloc}/api/articles/{path.id}",
            "settle": "0s",
            "absent_means": absent_means,
        },
    }


def test_delete_that_happened_with_absent_means_succeeded(make_env):
    env = make_env([delete_rule("succeeded")])
    victim = env.world.add_article(title(), "to delete")
    env.world.delete_mode = DELETE_THEN_HANG
    op = outcome_unknown(env.client.delete(f"{env.world.base}/api/articles/{victim}"))
    assert env.world.article(victim) is None

    env.reconcile()

    assert env.store.receipts.get(op).state == "succeeded"
    d = verdict(env.store, op).detail
    assert (d["result"], d["read"]["status"]) == ("absent", 404)
    assert "absent_means succeeded" in d["reason"]
    assert_unknown_kept(env.store, op)


def test_delete_that_did_not_happen_is_never_called_succeeded(make_env):
    env = make_env([delete_rule("succeeded")])
    survivor = env.world.add_article(title(), "still here")
    env.world.delete_mode = HANG_WITHOUT_DELETE
    op = outcome_unknown(env.client.delete(f"{env.world.base}/api/articles/{survivor}"))

    env.reconcile()

    assert env.world.article(survivor) is not None
    assert env.store.receipts.get(op).state == "manual_review"
    d = verdict(env.store, op).detail
    assert (d["result"], d["read"]["status"]) == ("still_present", 200)


def test_delete_that_did_not_happen_is_safe_to_retry_when_the_rule_says_so(make_env):
    env = make_env([delete_rule("succeeded", retry_safe=True)])
    survivor = env.world.add_article(title(), "still here")
    env.world.delete_mode = HANG_WITHOUT_DELETE
    op = outcome_unknown(env.client.delete(f"{env.world.base}/api/articles/{survivor}"))

    env.reconcile()

    assert env.store.receipts.get(op).state == "safe_to_retry"
    env.world.delete_mode = OK
    again = env.client.delete(f"{env.world.base}/api/articles/{survivor}")
    assert again.status_code == 204 and again.headers["X-Receipt-State"] == "succeeded"
    assert env.world.article(survivor) is None


# -- resend_with_key: the one allowed write -------------------------------------------------------------------


PAYMENT_RULE = {
    "name": "payments.create",
    "method": "POST",
    "path": "/api/payments",
    "external_id": "$.id",
    "reconcile": {"strategy": "resend_with_key"},
}


def test_resend_with_key_settles_a_payment_without_a_second_one(make_env):
    env = make_env([PAYMENT_RULE], inject_idempotency_key=True)
    env.world.payment_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/payments", {"amount": 1250}, headers={"Authorization": "Bearer agent-secret"})
    assert len(env.world.payments) == 1

    env.reconcile()

    (payment,) = env.world.payments
    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.external_id) == ("succeeded", payment["id"])
    sends = env.world.received("POST", "/api/payments")
    assert [s.headers["idempotency-key"] for s in sends] == [op, op]
    assert sends[1].json() == {"amount": 1250}
    assert "authorization" not in sends[1].headers  # the redacted credential is never re-sent as "[REDACTED]"
    d = verdict(env.store, op).detail
    assert (d["result"], d["resend"]["status"], d["resend"]["idempotency_key"], d["matched_id"]) == (
        "present",
        200,
        op,
        payment["id"],
    )


def test_resend_with_key_reuses_the_agents_own_key_once(make_env):
    env = make_env([PAYMENT_RULE], inject_idempotency_key=True)
    env.world.payment_mode = COMMIT_THEN_HANG
    key = f"agent-{uuid.uuid4().hex[:8]}"
    op = env.unknown("/api/payments", {"amount": 99}, headers={"Idempotency-Key": key})

    env.reconcile()

    assert env.store.receipts.get(op).state == "succeeded"
    sends = env.world.received("POST", "/api/payments")
    assert len(sends) == 2 and len(env.world.payments) == 1
    assert [v for k, v in sends[1].header_list if k == "idempotency-key"] == [key]


def test_resend_with_key_never_resends_a_redacted_query(make_env):
    env = make_env([PAYMENT_RULE], inject_idempotency_key=True)
    env.world.payment_mode = COMMIT_THEN_HANG
    op = outcome_unknown(env.client.post(f"{env.world.base}/api/payments?token=s3cret", json={"amount": 5}))

    env.reconcile()

    assert env.store.receipts.get(op).state == "manual_review"
    assert "redacted" in verdict(env.store, op).detail["reason"]
    assert len(env.world.received("POST", "/api/payments")) == 1


def test_resend_with_key_on_a_host_that_injects_no_key_sends_nothing(make_env):
    env = make_env([PAYMENT_RULE])
    env.world.payment_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/payments", {"amount": 7})

    env.reconcile()

    assert env.store.receipts.get(op).state == "manual_review"
    assert "inject_idempotency_key" in verdict(env.store, op).detail["reason"]
    assert len(env.world.received("POST", "/api/payments")) == 1


# -- no rule --------------------------------------------------------------------------------------------------


def test_unknowns_without_a_rule_go_to_a_person_at_once(make_env):
    env = make_env([articles_rule(None, name="articles.norule")])
    env.world.article_mode = HANG_WITHOUT_STORE
    no_reconcile = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})
    no_rule = env.unknown("/api/hang/webhook", {"event": "ping"})

    report = env.reconcile()

    assert dict(report.verdicts) == {"manual_review": 2}
    assert env.store.receipts.get(no_rule).state == env.store.receipts.get(no_reconcile).state == "manual_review"
    reason = verdict(env.store, no_rule).detail["reason"]
    assert reason.startswith("no reconcile rule for POST 127.0.0.1 ") and reason.endswith("/webhook")
    assert verdict(env.store, no_reconcile).detail["reason"] == "rule articles.norule has no reconcile"
    assert env.world.received("GET") == []


# -- decide(): the verdict table ------------------------------------------------------------------------------

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
SUBMITTED = NOW - timedelta(seconds=10)
LEASE_CLEARED = {"lease_owner": None, "lease_expires_at": None}


def _receipt(method: str = "POST", attempts: int = 0, external_id: str | None = None) -> ReceiptRecord:
    return ReceiptRecord(
        operation_id="op_unit", operation="unit", method=method, scheme="http", host="127.0.0.1", port=8000,
        path="/x", query=None, intent_fingerprint="sha256:0", account="acct", idempotency_key=None,
        state="reconciling", created_at=SUBMITTED, updated_at=NOW, submitted_at=SUBMITTED, completed_at=None,
        status_code=None, external_id=external_id, error_code="upstream_timeout", error_message=None,
        authentication_recorded=False, proxy_instance=None, request_headers=None, request_body=None,
        request_body_size=0, request_body_truncated=False, body_note=None, response_headers=None,
        response_body=None, response_body_truncated=False, response_body_redacted=False, reconcile_attempts=attempts,
        next_attempt_at=None,
        lease_owner="w", lease_expires_at=NOW,
    )  # fmt: skip


def _rule(**kw: Any) -> ReconcileRule:
    return ReconcileRule(strategy="lookup", url="http://x/{external_id}", **{"settle": "5s", "attempts": 3, **kw})


S = State


# case, method, reconcile_attempts, rule settings, retry_safe, read kind, external id, verdict, column updates
DECIDE_TABLE = [
    ("present", "POST", 0, {}, False, "present", "42", S.SUCCEEDED, {"external_id": "42"}),
    ("present without an id", "POST", 0, {}, False, "present", None, S.SUCCEEDED, {"external_id": None}),
    ("absent before settle", "POST", 0, {"settle": "30s"}, True, "absent", None, S.OUTCOME_UNKNOWN,
     {"next_attempt_at": SUBMITTED + timedelta(seconds=30)}),
    ("absent exactly at settle", "POST", 0, {"settle": "10s"}, True, "absent", None, S.SAFE_TO_RETRY, {}),
    ("absent after settle, retry_safe", "POST", 0, {}, True, "absent", None, S.SAFE_TO_RETRY, {}),
    ("absent after settle, not retry_safe", "POST", 0, {}, False, "absent", None, S.MANUAL_REVIEW, {}),
    ("absent_means manual_review", "POST", 0, {"absent_means": "manual_review"}, True, "absent", None,
     S.MANUAL_REVIEW, {}),
    ("DELETE absent_means succeeded", "DELETE", 0, {"absent_means": "succeeded"}, False, "absent", None,
     S.SUCCEEDED, {}),
    ("DELETE absent_means succeeded, before settle", "DELETE", 0, {"absent_means": "succeeded", "settle": "1m"},
     False, "absent", None, S.OUTCOME_UNKNOWN, {"next_attempt_at": SUBMITTED + timedelta(minutes=1)}),
    ("DELETE still present, retry_safe", "DELETE", 0, {"absent_means": "succeeded"}, True, "still_present",
     None, S.SAFE_TO_RETRY, {}),
    ("DELETE still present, not retry_safe", "DELETE", 0, {"absent_means": "succeeded"}, False, "still_present",
     None, S.MANUAL_REVIEW, {}),
    ("DELETE still present before settle", "DELETE", 0, {"settle": "1m"}, True, "still_present", None,
     S.OUTCOME_UNKNOWN, {"next_attempt_at": SUBMITTED + timedelta(minutes=1)}),
    ("ambiguous", "POST", 0, {}, True, "ambiguous", None, S.MANUAL_REVIEW, {}),
    ("mismatch after settle", "POST", 0, {}, True, "mismatch", None, S.MANUAL_REVIEW, {}),
    ("mismatch before settle: an update not visible yet", "PUT", 0, {"settle": "1m"}, False, "mismatch", None,
     S.OUTCOME_UNKNOWN, {"next_attempt_at": SUBMITTED + timedelta(minutes=1)}),
    ("absent_means succeeded on a POST is never trusted", "POST", 0, {"absent_means": "succeeded"}, True, "absent",
     None, S.MANUAL_REVIEW, {}),
    ("refused", "POST", 0, {}, True, "refused", None, S.MANUAL_REVIEW, {}),
    ("failed, first", "POST", 0, {}, True, "failed", None, S.OUTCOME_UNKNOWN,
     {"reconcile_attempts": 1, "next_attempt_at": NOW + timedelta(seconds=2)}),
    ("failed, second: backoff doubles", "POST", 1, {}, True, "failed", None, S.OUTCOME_UNKNOWN,
     {"reconcile_attempts": 2, "next_attempt_at": NOW + timedelta(seconds=4)}),
    ("failed, at attempts", "POST", 2, {}, True, "failed", None, S.MANUAL_REVIEW, {"reconcile_attempts": 3}),
    ("failed, attempts 1", "POST", 0, {"attempts": 1}, True, "failed", None, S.MANUAL_REVIEW,
     {"reconcile_attempts": 1}),
    ("failed before settle still counts", "POST", 0, {"settle": "1h"}, True, "failed", None, S.OUTCOME_UNKNOWN,
     {"reconcile_attempts": 1, "next_attempt_at": NOW + timedelta(seconds=2)}),
]  # fmt: skip


@pytest.mark.parametrize(
    "method, attempts, rule, retry_safe, kind, ext, want_state, want_updates",
    [pytest.param(*row[1:], id=row[0]) for row in DECIDE_TABLE],
)
def test_decide(method, attempts, rule, retry_safe, kind, ext, want_state, want_updates):
    outcome = ReadOutcome(kind, {"read": {"status": 200}}, ext)
    d = decide(_receipt(method, attempts, external_id=None), _rule(**rule), retry_safe, outcome, NOW, backoff=2.0)
    assert isinstance(d, Verdict)
    assert d.state == want_state
    assert d.updates == {**LEASE_CLEARED, **want_updates}
    assert (d.detail["result"], d.detail["read"], d.detail["strategy"]) == (kind, {"status": 200}, "lookup")
    if want_state != S.SUCCEEDED:
        assert d.detail["reason"]


def test_decide_present_keeps_the_id_the_proxy_already_knew():
    d = decide(_receipt(external_id="7"), _rule(), False, ReadOutcome("present"), NOW, 1.0)
    assert (d.state, d.updates["external_id"]) == (S.SUCCEEDED, "7")


def test_decide_never_gives_safe_to_retry_without_retry_safe():
    for kind in ("present", "absent", "still_present", "ambiguous", "mismatch", "refused", "failed"):
        for method in ("POST", "DELETE"):
            for attempts in (0, 5):
                d = decide(_receipt(method, attempts), _rule(settle="0s"), False, ReadOutcome(kind), NOW, 1.0)
                assert d.state != S.SAFE_TO_RETRY, (kind, method, attempts)


def test_decide_unknown_read_kind_is_refused():
    with pytest.raises(ValueError):
        decide(_receipt(), _rule(), True, ReadOutcome("maybe"), NOW, 1.0)


# -- rules that cannot work are refused at load ---------------------------------------------------------------


def _operation(path: str, method: str = "POST", **reconcile: Any) -> dict[str, Any]:
    return {"name": "op", "method": method, "path": path, "reconcile": {"strategy": "lookup", **reconcile}}


@pytest.mark.parametrize(
    "operation, message",
    [
        pytest.param(_operation("/c/{charge_id}/refunds", url="http://h/r?c={path.charge}"),
                     "reconcile url uses {path.charge}, but path /c/{charge_id}/refunds has no {charge}", id="path typo"),
        pytest.param(_operation("/x", url="http://h/{bogus.a.b}"), "unknown placeholder {bogus.a.b}", id="dotted typo"),
        pytest.param(_operation("/x", url="http://h/x", method="GET"), "is not one the proxy journals", id="GET"),
        pytest.param({**_operation("/x", url="http://h/x"), "reconcile": {"strategy": "search", "method": "HEAD",
                      "url": "http://h/x", "match": {"$.a": "$.a"}}}, "method HEAD reads no body", id="HEAD search"),
        pytest.param(_operation("/x", url="http://h/x", absent_means="succeeded"), "only allowed for DELETE",
                     id="absent succeeded on POST"),
        pytest.param({**_operation("/x"), "reconcile": {"strategy": "search", "url": "http://h/x"}}, "needs match",
                     id="search without match"),
    ],
)  # fmt: skip
def test_unworkable_reconcile_rules_are_refused(operation, message):
    from proxy_addon.config import parse_config
    from proxy_addon.exceptions import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(yaml.safe_dump({"hosts": {"h": {"operations": [operation]}}}))


def test_workable_rules_load_and_default_absence_needs_retry_safe():
    from proxy_addon.config import OperationRule

    op = OperationRule(name="x", method="POST", path="/x", reconcile={"strategy": "lookup", "url": "http://h/{external_id}"})
    assert op.reconcile.absent_means == "manual_review"
    refund = OperationRule.model_validate({**REFUND_RULE, "reconcile": {**REFUND_RULE["reconcile"], "url": "http://h/{path.charge_id}/{body.a.b}"}})
    assert refund.reconcile.absent_means == "safe_to_retry"
