"""Verifier controls (reconcile/controls.py): the probe and the judging, as tables; then the worker with the world
of support/world.py: a proof on record is used while fresh and renewed when stale or when the rule was edited,
and a control whose own read fails is a failed read of the rule (it counts toward `attempts`). Broken rules
against a real server nobody here wrote: e2e/test_verifier_controls.py.
"""

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.reconcile import Env, articles_rule, emptied, env_factory, lookup, title, verdict
from support.world import COMMIT_THEN_HANG, HANG_WITHOUT_STORE, OK

from proxy_addon.config import load_config, parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.reconcile.controls import BOTH, NEGATIVE_ONLY, controls_needed, judge_negative, judge_positive, probe_of
from proxy_addon.reconcile.decide import ReadOutcome
from proxy_addon.rules.operations import ReconcileRule
from proxy_addon.rules.records import ReceiptRecord, Verdict, utcnow
from proxy_addon.rules.states import State

NONCE = "receipts-probe-0123456789abcdef"


def _receipt(body: Any, method: str = "POST", external_id: str | None = None) -> ReceiptRecord:
    now = utcnow()
    return ReceiptRecord(
        operation_id="op_unit", operation="unit", method=method, scheme="http", host="127.0.0.1", port=8000,
        path="/api/charges/ch_1/refunds", query=None, intent_fingerprint="sha256:0", account="acct",
        idempotency_key="k1", state="reconciling", created_at=now, updated_at=now, submitted_at=now, completed_at=None,
        status_code=None, external_id=external_id, error_code=None, error_message=None, authentication_recorded=False,
        proxy_instance=None, request_headers=None, request_body=json.dumps(body).encode(), request_body_size=0,
        request_body_truncated=False, body_note=None, response_headers=None, response_body=None,
        response_body_truncated=False, response_body_redacted=False, reconcile_attempts=0, next_attempt_at=None,
        lease_owner=None, lease_expires_at=None,
    )  # fmt: skip


def _rule(**kw: Any) -> ReconcileRule:
    return ReconcileRule.model_validate({"strategy": "search", "match": {"$.title": "$.title"}, "url": "http://h/x", **kw})


# -- the probe: a nonce in every field the rule looks up by or matches on; the rest as it was ----------------------

PROBES = [
    ("a lookup by a body field", {"strategy": "lookup", "url": "http://h/a/{body.id}", "match": {}},
     {"id": "a1", "title": "t", "keep": 1}, {}, {"id": NONCE, "title": "t", "keep": 1}, {}),
    ("a search by a path parameter, matched on a number", {"url": "http://h/r?c={path.charge_id}", "match": {"$.amount": "$.amount"}},
     {"amount": 500, "note": "n"}, {"charge_id": "ch_1"}, {"amount": NONCE, "note": "n"}, {"charge_id": NONCE}),
    ("a match on a nested field, made where it was missing", {"match": {"$.title": "$.meta.title"}},
     {"meta": {}}, {}, {"meta": {"title": NONCE}}, {}),
    ("a nested body placeholder", {"url": "http://h/s?q={body.a.b}"},
     {"a": {"b": "x", "c": 2}, "title": "t"}, {}, {"a": {"b": NONCE, "c": 2}, "title": NONCE}, {}),
    ("a greedy path placeholder: its leading segments stay (a bucket, Azurite's account)",
     {"strategy": "lookup", "url": "http://h/{path.container}/{path.blob}", "match": {}, "controls": {"keep": ["path.container"]}},
     {}, {"container": "devstoreaccount1", "blob": "c/dir/a%20b"}, {}, {"container": "devstoreaccount1", "blob": f"c/dir/{NONCE}"}),
    ("each field of the request, compared one by one", {"match": {"$": "$"}, "match_compare": "each_field"},
     {"title": "t", "n": 3, "tags": ["a"]}, {}, {"title": NONCE, "n": NONCE, "tags": NONCE}, {}),
    ("an external id, idempotency key and operation id", {"strategy": "lookup", "url": "http://h/{external_id}/{idempotency_key}/{operation_id}", "match": {}},
     {"title": "t"}, {}, {"title": "t"}, {}),
]  # fmt: skip


@pytest.mark.parametrize("rule, body, params, want_body, want_params", [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_the_probe_holds_the_nonce_in_every_field_the_rule_reads_by(rule, body, params, want_body, want_params):
    probe, probe_params = probe_of(_receipt(body, external_id="e1"), _rule(**rule), params, NONCE)

    assert json.loads(probe.request_body) == want_body
    assert probe_params == want_params
    reads_by = re.findall(r"\{(external_id|idempotency_key|operation_id)\}", rule.get("url", ""))
    assert (probe.external_id == NONCE) == ("external_id" in reads_by)
    assert (probe.idempotency_key == NONCE) == ("idempotency_key" in reads_by)
    assert probe.operation_id == f"op_{NONCE}"


# -- judging ---------------------------------------------------------------------------------------------------

# read kind, external id found, candidates, the known success's method and id, the rule has an id: positive
POSITIVES = [
    ("present", "42", [], "POST", "42", True, "passed"),
    ("present", "41", [], "POST", "42", True, "failed"),  # found something else: it does not see ours
    ("present", None, [], "POST", "42", True, "failed"),  # a catch-all answer without the id
    ("present", None, [], "POST", "42", False, "passed"),  # a status-only lookup: the url held the id
    ("ambiguous", None, ["41", "42"], "POST", "42", True, "passed"),  # ours among look-alikes
    ("ambiguous", None, ["40", "41"], "POST", "42", True, "failed"),
    ("absent", None, [], "POST", "42", True, "failed"),
    ("mismatch", None, [], "POST", "42", True, "failed"),
    ("refused", None, [], "POST", "42", True, "failed"),
    ("failed", None, [], "POST", "42", True, "read_failed"),
    ("absent", None, [], "DELETE", None, False, "passed"),  # a DELETE's effect is its target gone
    ("still_present", None, [], "DELETE", None, False, "failed"),
]  # fmt: skip


@pytest.mark.parametrize("kind, found, candidates, method, known_id, has_id, want", POSITIVES)
def test_judge_positive(kind, found, candidates, method, known_id, has_id, want):
    known = _receipt({}, method=method, external_id=known_id)
    rule = _rule(strategy="lookup", match={}, **({"id": "$.id"} if has_id else {}))
    assert judge_positive(ReadOutcome(kind, {"candidates": candidates}, found), known, rule) == want


@pytest.mark.parametrize(
    "kind, want",
    [("absent", "passed"), ("present", "failed"), ("still_present", "failed"), ("ambiguous", "failed"),
     ("mismatch", "failed"), ("refused", "failed"), ("failed", "read_failed")],
)  # fmt: skip
def test_judge_negative(kind, want):
    assert judge_negative(ReadOutcome(kind)) == want


@pytest.mark.parametrize(
    "strategy, state, kind, want",
    [("search", State.SAFE_TO_RETRY, "absent", BOTH), ("lookup", State.SAFE_TO_RETRY, "still_present", BOTH),
     ("lookup", State.SUCCEEDED, "absent", BOTH), ("search", State.SUCCEEDED, "present", NEGATIVE_ONLY),
     ("search", State.MANUAL_REVIEW, "absent", frozenset()), ("lookup", State.OUTCOME_UNKNOWN, "failed", frozenset()),
     ("resend_with_key", State.SUCCEEDED, "present", frozenset())],
)  # fmt: skip
def test_what_a_verdict_needs(strategy, state, kind, want):
    rule = ReconcileRule(strategy=strategy, url=None if strategy == "resend_with_key" else "http://h/x", match={"$.a": "$.a"})
    assert controls_needed(rule, Verdict(state), ReadOutcome(kind)) == want


def test_a_bad_max_age_is_one_line_naming_the_key():
    operation = articles_rule(lookup(controls={"max_age": "0s"}))
    with pytest.raises(ConfigError, match=r"controls.*max_age.*must be more than 0s") as err:
        parse_config(yaml.safe_dump({"hosts": {"h": {"operations": [operation]}}}))
    assert "\n" not in str(err.value)


def test_an_edited_rule_has_another_digest():
    assert _rule().digest == _rule().digest != _rule(url="http://h/y").digest


# -- the worker: proofs on record, renewed when stale or edited; a control's failed read -----------------------


@pytest.fixture
def db_url(module_db_url: str) -> str:
    return emptied(module_db_url)


@pytest.fixture
def make_env(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Env]]:
    yield from env_factory(db_url, tmp_path, through_proxy=False)


def _article() -> dict[str, Any]:
    return {"id": f"art-{uuid.uuid4().hex[:8]}", "title": title(), "body_markdown": "x"}


def _control_reads(env: Env, known_path: str) -> list[str]:
    return [r.path for r in env.world.received("GET") if "receipts-probe-" in r.path or r.path == known_path]


def test_a_fresh_proof_is_used_and_a_stale_or_edited_rules_is_renewed(make_env, monkeypatch):
    env = make_env([articles_rule(lookup(controls={"max_age": "1h"}))])
    known = env.known_success("/api/articles", _article())
    known_path = f"/api/articles/{env.store.receipts.get(known).external_id}"
    env.world.article_mode = HANG_WITHOUT_STORE

    first = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(first).state == "safe_to_retry"
    assert len(_control_reads(env, known_path)) == 2  # the probe, the known success

    second = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(second).state == "safe_to_retry"
    assert len(_control_reads(env, known_path)) == 2  # proven 0 s ago: nothing run again
    checked = [c["checked_at"] for c in verdict(env.store, second).detail["controls"]]
    assert checked == [c["checked_at"] for c in verdict(env.store, first).detail["controls"]]

    db, clock = env.store.db, type(env.store.db).clock  # an hour and a second later: stale
    monkeypatch.setattr(db, "clock", lambda conn: clock(db, conn) + timedelta(hours=1, seconds=1))
    third = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(third).state == "safe_to_retry"
    assert len(_control_reads(env, known_path)) == 4

    env.config_path.write_text(env.config_path.read_text().replace("max_age: 1h", "max_age: 2h"))  # the rule edited
    env.config = load_config(env.config_path)
    fourth = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(fourth).state == "safe_to_retry"
    assert len(_control_reads(env, known_path)) == 6  # the old rule's runs prove nothing about the new one


def test_a_controls_failed_read_is_a_failed_read_of_the_rule(make_env):
    env = make_env([articles_rule(lookup(attempts=2))], reconcile={"backoff": "0s"})
    env.world.article_mode = COMMIT_THEN_HANG
    op = env.unknown("/api/articles", _article())
    env.world.failing_paths = "receipts-probe-"

    env.reconcile()

    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.reconcile_attempts, receipt.error_code) == ("outcome_unknown", 1, "upstream_timeout")
    d = verdict(env.store, op).detail
    assert d["result"] == "failed" and "the negative control's read failed" in d["reason"]
    assert d["control_read"]["read"]["status"] == 500
    (run,) = env.store.controls.history()
    assert (run.control, run.result) == ("negative", "read_failed")

    env.reconcile()  # the second failed read: attempts reached
    receipt = env.store.receipts.get(op)
    assert (receipt.state, receipt.reconcile_attempts) == ("manual_review", 2)

    env.world.failing_paths = None
    assert env.store.receipts.get(op).external_id is None  # never called succeeded on an unproven rule


@pytest.mark.parametrize("how", ["failed", "no_known_success"])
def test_a_control_that_did_not_pass_is_run_again_within_max_age(make_env, how):
    """Only a passing run proves a rule for `max_age`: one that failed (the known effect not found) or had no
    known success to run on proves nothing, so the next verdict runs that control again, however recent it was."""
    env = make_env([articles_rule(lookup(controls={"max_age": "1h"}))])
    if how == "failed":
        gone = env.store.receipts.get(env.known_success("/api/articles", _article())).external_id
        with env.world.lock:
            del env.world.articles[str(gone)]  # the known effect is not there to be found
    env.world.article_mode = HANG_WITHOUT_STORE
    first = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(first).state == "manual_review"
    assert verdict(env.store, first).detail["unproven"] == ("positive" if how == "failed" else "no_known_success")

    env.world.article_mode = OK
    env.known_success("/api/articles", _article())  # a known effect there now, seconds later
    env.world.article_mode = HANG_WITHOUT_STORE
    second = env.unknown("/api/articles", _article())
    env.reconcile()
    assert env.store.receipts.get(second).state == "safe_to_retry"
    runs = [(r.control, r.result) for r in env.store.controls.history()]
    assert runs == [("positive", "passed"), ("positive", how), ("negative", "passed")]  # the passed negative kept
