"""The reconciliation worker end to end, a handful of cases: an agent's write goes through a real in-process
proxy to a real JSON API on 127.0.0.1 (support/world.py) that hangs; the proxy times out (504
outcome_unknown); `Reconciler.run_once()` (or `receipts reconcile --once`) reads the world and gives a
verdict; the agent's retry through the proxy is then forwarded or refused by that verdict. The worker's
decisions case by case are tests/unit/test_reconcile.py.
"""

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.e2e import settled
from support.proxy import REPO
from support.reconcile import (
    PAYMENT_RULE,
    REFUND_RULE,
    UNKNOWN_THEN,
    Env,
    articles_rule,
    assert_unknown_kept,
    delete_rule,
    emptied,
    env_factory,
    search,
    steps,
    title,
    verdict,
)
from support.world import COMMIT_THEN_HANG, HANG_WITHOUT_DELETE, HANG_WITHOUT_STORE, OK


@pytest.fixture
def db_url(module_db_url: str) -> str:
    return emptied(module_db_url)


@pytest.fixture
def make_env(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Env]]:
    yield from env_factory(db_url, tmp_path, through_proxy=True)


def test_committed_then_timed_out_search_finds_it_with_its_id(make_env):
    env = make_env([articles_rule(search())])
    env.world.add_article("An older article", "unrelated")
    env.world.article_mode = COMMIT_THEN_HANG
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "# hi"})
    (stored_id,) = env.world.article_ids_titled(t)

    report = env.reconcile("worker-a")

    assert (report.claimed, dict(report.verdicts)) == (1, {"succeeded": 1})
    receipt = settled(env.store, op)
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
    receipt = settled(env.store, op)
    assert (receipt.state, receipt.external_id) == ("succeeded", stored_id)
    assert verdict(env.store, op).detail["who"].startswith("worker-")


def test_never_stored_with_retry_safe_is_safe_to_retry_and_a_retry_is_forwarded(make_env):
    env = make_env([articles_rule(search(), retry_safe=True)])
    env.known_success("/api/articles", {"title": title(), "body_markdown": "a known success"})
    env.world.article_mode = HANG_WITHOUT_STORE
    document = {"title": title(), "body_markdown": "retry me"}
    op = env.unknown("/api/articles", document)

    env.reconcile()

    receipt = settled(env.store, op)
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
    assert len(env.world.received("POST", "/api/articles")) == 3  # the known success, the write, the retry
    assert env.world.article_ids_titled(document["title"]) == [again.json()["id"]]


def test_never_stored_without_retry_safe_goes_to_a_person_and_a_retry_stays_refused(make_env):
    env = make_env([articles_rule(search(), retry_safe=False)])
    env.world.article_mode = HANG_WITHOUT_STORE
    document = {"title": title(), "body_markdown": "do not retry"}
    op = env.unknown("/api/articles", document)

    env.reconcile()

    assert settled(env.store, op).state == "manual_review"
    d = verdict(env.store, op).detail
    assert d["result"] == "absent" and "manual_review" in d["reason"]

    env.world.article_mode = OK
    again = env.post("/api/articles", document)
    assert again.status_code == 409, again.text
    problem = again.json()
    assert problem["type"].endswith("duplicate-open")
    assert (problem["operation_id"], problem["state"]) == (op, "manual_review")
    assert len(env.world.received("POST", "/api/articles")) == 1


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
    assert (settled(env.store, op_a).state, settled(env.store, op_a).external_id) == ("succeeded", refund_a["id"])
    assert (settled(env.store, op_b).state, settled(env.store, op_b).external_id) == ("succeeded", refund_b["id"])
    urls = sorted(verdict(env.store, op).detail["reads"][0]["url"] for op in (op_a, op_b))
    assert urls == [f"{env.world.base}/api/refunds?charge=ch_A", f"{env.world.base}/api/refunds?charge=ch_B"]


def test_delete_that_did_not_happen_is_safe_to_retry_when_the_rule_says_so(make_env):
    env = make_env([delete_rule("succeeded", retry_safe=True)])
    env.known_success(f"/api/articles/{env.world.add_article(title(), 'deleted before')}", None, method="DELETE")
    survivor = env.world.add_article(title(), "still here")
    env.world.delete_mode = HANG_WITHOUT_DELETE
    op = env.unknown(f"/api/articles/{survivor}", None, method="DELETE")

    env.reconcile()

    assert settled(env.store, op).state == "safe_to_retry"
    env.world.delete_mode = OK
    again = env.client.delete(f"{env.world.base}/api/articles/{survivor}")
    assert again.status_code == 204 and again.headers["X-Receipt-State"] == "succeeded"
    assert env.world.article(survivor) is None


def test_resend_with_key_settles_a_payment_without_a_second_one(make_env):
    env = make_env([PAYMENT_RULE], inject_idempotency_key=True)
    env.world.payment_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/payments", {"amount": 1250}, headers={"Authorization": "Bearer agent-secret"})
    assert len(env.world.payments) == 1

    env.reconcile()

    (payment,) = env.world.payments
    receipt = settled(env.store, op)
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
