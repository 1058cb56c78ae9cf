"""The reconciliation worker, called directly: receipts made outcome_unknown as the proxy would make them
(support/reconcile.py, without a proxy), a real JSON API on 127.0.0.1 (support/world.py) that commits and hangs,
never stores, stores late, holds near-duplicates; then `Reconciler.run_once()` reads the world and gives a
verdict, with its evidence in the history. Every test runs on SQLite and PostgreSQL. The table for `read_verdict()`
and the rules refused at load are at the end. tests/e2e/test_reconcile.py keeps a handful through the proxy.
"""

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.reconcile import (
    PAYMENT_RULE,
    REFUND_RULE,
    UNKNOWN_THEN,
    Env,
    _wait_due,
    articles_rule,
    assert_unknown_kept,
    delete_rule,
    emptied,
    env_factory,
    lookup,
    search,
    steps,
    title,
    verdict,
)
from support.world import COMMIT_THEN_HANG, DELETE_THEN_HANG, HANG_WITHOUT_DELETE, HANG_WITHOUT_STORE

from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.reconcile.decide import ReadOutcome, read_verdict
from proxy_addon.rules.operations import ReconcileRule
from proxy_addon.rules.records import ReceiptRecord, Verdict
from proxy_addon.rules.states import State


@pytest.fixture
def db_url(module_db_url: str) -> str:
    return emptied(module_db_url)


@pytest.fixture
def make_env(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Env]]:
    yield from env_factory(db_url, tmp_path, through_proxy=False)


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
    read, probe = [r.path for r in env.world.received("GET")]  # the read, then its negative control's
    assert read == f"/api/articles/{client_id}" and probe.startswith("/api/articles/receipts-probe-")
    assert [c["control"] for c in d["controls"]] == ["negative"]


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


def test_eventually_consistent_record_is_not_called_absent_before_settle(make_env, monkeypatch):
    """The receipts' clock is moved past `settle` rather than waited for, and the record shown when the test
    says: nothing here depends on how fast the machine is."""
    env = make_env([articles_rule(search(settle="1h"))])
    env.world.article_mode, env.world.visible_after = COMMIT_THEN_HANG, 3600  # stored, not yet shown by reads
    t = title()
    op = env.unknown("/api/articles", {"title": t, "body_markdown": "late"})
    (stored_id,) = env.world.article_ids_titled(t)
    submitted_at = env.store.receipts.get(op).submitted_at

    early = env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (early.claimed, receipt.state, receipt.reconcile_attempts) == (1, "outcome_unknown", 0)
    assert receipt.next_attempt_at == submitted_at + timedelta(hours=1)
    d = verdict(env.store, op).detail
    assert d["result"] == "absent" and d["reason"].startswith("not settled")

    env.world.show(stored_id)  # the record becomes visible, but the receipt is not due before its settle time
    assert env.reconcile().claimed == 0
    assert env.store.receipts.get(op).state == "outcome_unknown"

    db, clock = env.store.db, type(env.store.db).clock
    monkeypatch.setattr(db, "clock", lambda conn: clock(db, conn) + timedelta(hours=1, seconds=1))
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
    reads = env.world.received("GET")  # the read, and its negative control's, alike
    assert len(reads) == 2 and {r.headers["authorization"] for r in reads} == {"Bearer read-secret-123"}
    assert "read-secret-123" not in repr(env.store.controls.history())
    assert "read-secret-123" not in repr(env.store.receipts.history(op)) + repr(env.store.receipts.get(op))


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
    known = env.known_success("/api/articles", {"title": title(), "body_markdown": "a known success"})
    env.world.article_mode = HANG_WITHOUT_STORE
    op = env.unknown("/api/articles", {"title": title(), "body_markdown": "x"})
    env.world.add_article("newer", "y")

    env.reconcile()

    assert env.store.receipts.get(op).state == "safe_to_retry"
    controls = {c["control"]: c["result"] for c in verdict(env.store, op).detail["controls"]}
    assert controls == {"negative": "passed", "positive": "passed"}
    (positive,) = [r for r in env.store.controls.history() if r.control == "positive"]
    assert (positive.known_operation_id, positive.evidence["matched_id"]) == (known, env.store.receipts.get(known).external_id)


def test_delete_that_happened_with_absent_means_succeeded(make_env):
    env = make_env([delete_rule("succeeded")])
    env.known_success(f"/api/articles/{env.world.add_article(title(), 'deleted before')}", None, method="DELETE")
    victim = env.world.add_article(title(), "to delete")
    env.world.delete_mode = DELETE_THEN_HANG
    op = env.unknown(f"/api/articles/{victim}", None, method="DELETE")
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
    op = env.unknown(f"/api/articles/{survivor}", None, method="DELETE")

    env.reconcile()

    assert env.world.article(survivor) is not None
    assert env.store.receipts.get(op).state == "manual_review"
    d = verdict(env.store, op).detail
    assert (d["result"], d["read"]["status"]) == ("still_present", 200)


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
    op = env.unknown("/api/payments?token=s3cret", {"amount": 5})

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


# -- read_verdict(): the verdict table ------------------------------------------------------------------------------

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
def test_read_verdict(method, attempts, rule, retry_safe, kind, ext, want_state, want_updates):
    outcome = ReadOutcome(kind, {"read": {"status": 200}}, ext)
    d = read_verdict(_receipt(method, attempts, external_id=None), _rule(**rule), retry_safe, outcome, NOW, backoff=2.0)
    assert isinstance(d, Verdict)
    assert d.state == want_state
    assert d.updates == {**LEASE_CLEARED, **want_updates}
    assert (d.detail["result"], d.detail["read"], d.detail["strategy"]) == (kind, {"status": 200}, "lookup")
    if want_state != S.SUCCEEDED:
        assert d.detail["reason"]


def test_read_verdict_present_keeps_the_id_the_proxy_already_knew():
    d = read_verdict(_receipt(external_id="7"), _rule(), False, ReadOutcome("present"), NOW, 1.0)
    assert (d.state, d.updates["external_id"]) == (S.SUCCEEDED, "7")


def test_read_verdict_never_gives_safe_to_retry_without_retry_safe():
    for kind in ("present", "absent", "still_present", "ambiguous", "mismatch", "refused", "failed"):
        for method in ("POST", "DELETE"):
            for attempts in (0, 5):
                d = read_verdict(_receipt(method, attempts), _rule(settle="0s"), False, ReadOutcome(kind), NOW, 1.0)
                assert d.state != S.SAFE_TO_RETRY, (kind, method, attempts)


def test_read_verdict_unknown_read_kind_is_refused():
    with pytest.raises(ValueError):
        read_verdict(_receipt(), _rule(), True, ReadOutcome("maybe"), NOW, 1.0)


# -- rules that cannot work are refused at load ---------------------------------------------------------------


def _operation(path: str, method: str = "POST", **reconcile: Any) -> dict[str, Any]:
    return {"name": "op", "method": method, "path": path, "reconcile": {"strategy": "lookup", **reconcile}}


@pytest.mark.parametrize(
    "operation, message",
    [
        pytest.param(_operation("/c/{charge_id}/refunds", url="http://h/r?c={path.charge}"),
                     "reconcile url uses {path.charge}, but path /c/{charge_id}/refunds has no {charge}", id="path typo"),
        pytest.param(_operation("/x", url="http://h/{bogus.a.b}"), "unknown placeholder {bogus.a.b}", id="dotted typo"),
        pytest.param(_operation("/x", url="http://h/x", method="GET /x"), "is not an HTTP method token", id="not a token"),
        pytest.param(_operation("/x", url="http://h/x", body={"q": 1}), "body is sent only with method POST", id="GET body"),
        pytest.param({**_operation("/x", url="http://h/x"), "reconcile": {"strategy": "search", "method": "HEAD",
                      "url": "http://h/x", "match": {"$.a": "$.a"}}}, "method HEAD reads no body", id="HEAD search"),
        pytest.param(_operation("/x", url="http://h/x", absent_means="succeeded"), "only allowed for DELETE",
                     id="absent succeeded on POST"),
        pytest.param({**_operation("/x"), "reconcile": {"strategy": "search", "url": "http://h/x"}}, "needs match",
                     id="search without match"),
    ],
)  # fmt: skip
def test_unworkable_reconcile_rules_are_refused(operation, message):

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(yaml.safe_dump({"hosts": {"h": {"operations": [operation]}}}))


def test_workable_rules_load_and_default_absence_needs_retry_safe():
    from proxy_addon.rules.operations import OperationRule

    op = OperationRule(name="x", method="POST", path="/x", reconcile={"strategy": "lookup", "url": "http://h/{external_id}"})
    assert op.reconcile.absent_means == "manual_review"
    refund = OperationRule.model_validate({**REFUND_RULE, "reconcile": {**REFUND_RULE["reconcile"], "url": "http://h/{path.charge_id}/{body.a.b}"}})
    assert refund.reconcile.absent_means == "safe_to_retry"
