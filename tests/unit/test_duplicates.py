"""The duplicate decision (rules/duplicates.py): what a request gets when an earlier receipt of the same intent
stands in its way, the answer it is given for that, and what a replay sends back. Pure: receipts are built here,
no store (which blocker stands in the way is the store's part, tested in test_store.py)."""

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from support.store import fp, intent

from proxy_addon.rules import answers, duplicates
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Blocker, BlockKind, ReceiptRecord, utcnow
from proxy_addon.rules.redaction import REDACTED
from proxy_addon.rules.states import RefusalReason, State


def receipt(state: State, status: int | None = 201, response_headers: list | dict | None = None,
            truncated: bool = False) -> ReceiptRecord:
    now = utcnow()
    i = intent(fp())
    return ReceiptRecord(
        **{name: getattr(i, name) for name in ("operation_id", "operation", "method", "scheme", "host", "port", "path",
                                               "query", "intent_fingerprint", "account", "idempotency_key", "proxy_instance",
                                               "request_headers", "request_body", "request_body_size",
                                               "request_body_truncated", "body_note")},
        state=state.value, created_at=now, updated_at=now, submitted_at=now,
        completed_at=now if state == State.SUCCEEDED else None, status_code=status, external_id=None, error_code=None,
        error_message=None, authentication_recorded=False, response_headers=response_headers, response_body=b'{"id":1}',
        response_body_truncated=truncated, response_body_redacted=False, reconcile_attempts=0, next_attempt_at=None, lease_owner=None,
        lease_expires_at=None,
    )


SUCCESS = receipt(State.SUCCEEDED, response_headers={"content-type": "application/json"})
REPLAY = AfterSuccess(policy="replay", window="15m")
REFUSE = AfterSuccess(policy="refuse", window="15m")


# -- decide_retry -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocker", "after_success", "decision", "reason", "status", "problem"),
    [
        (None, REPLAY, "forwarded", None, None, None),
        (Blocker(BlockKind.OPEN, receipt(State.OUTCOME_UNKNOWN, None)), REPLAY, "refused", RefusalReason.DUPLICATE_OPEN, 409, "duplicate-open"),
        (Blocker(BlockKind.SUCCEEDED, SUCCESS), REPLAY, "replayed", RefusalReason.DUPLICATE_SUCCEEDED_REPLAY, 201, None),
        (Blocker(BlockKind.SUCCEEDED, SUCCESS), REFUSE, "refused",
         RefusalReason.DUPLICATE_SUCCEEDED_REFUSE, 409, "duplicate-succeeded"),
        (Blocker(BlockKind.SUCCEEDED, replace(SUCCESS, response_headers=None)), REPLAY, "refused",
         RefusalReason.DUPLICATE_SUCCEEDED_REFUSE, 409, "duplicate-succeeded"),
        (Blocker(BlockKind.KEY_MISMATCH, SUCCESS), REPLAY, "refused", RefusalReason.IDEMPOTENCY_KEY_MISMATCH, 422,
         "idempotency-key-mismatch"),
    ],
    ids=["nothing-in-the-way", "open", "success-replayed", "success-refused", "success-without-answer", "key-reused"],
)
def test_the_duplicate_decision(blocker, after_success, decision, reason, status, problem):
    got = duplicates.decide_retry(blocker, after_success)
    assert (got.decision, got.reason, got.status, got.problem) == (decision, reason, status, problem)
    document = got.document()
    assert document["blocking_operation_id"] == (blocker.receipt.operation_id if blocker else None)
    assert (document["decision"], document["status"], document["problem"]) == (decision, status, problem)
    if blocker is not None and blocker.kind == BlockKind.SUCCEEDED:
        assert document["until"] == SUCCESS.completed_at + timedelta(minutes=15)
    else:
        assert document["until"] is None


def test_a_replayed_decisions_status_is_the_stored_answers_not_a_409():
    for status in (200, 201, 202, 204, 303):
        decision = duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, replace(SUCCESS, status_code=status)), REPLAY)
        assert decision.decision == "replayed" and decision.status == status and decision.problem is None


def test_a_success_that_blocks_ends_its_window_by_the_hosts_after_success():
    decision = duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, SUCCESS), AfterSuccess(policy="refuse", window="90s"))
    assert decision.until == SUCCESS.completed_at + timedelta(seconds=90)
    no_end = duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, replace(SUCCESS, completed_at=None)), REFUSE)
    assert no_end.until is None and no_end.reason == RefusalReason.DUPLICATE_SUCCEEDED_REFUSE


def test_an_open_blocker_is_refused_whatever_the_after_success_policy():
    """after_success is about successes: an open receipt blocks under replay, refuse and allow alike."""
    blocker = Blocker(BlockKind.OPEN, receipt(State.SUBMITTED, None))
    for policy in ("replay", "refuse", "allow"):
        got = duplicates.decide_retry(blocker, AfterSuccess(policy=policy))
        assert (got.decision, got.reason, got.until) == ("refused", RefusalReason.DUPLICATE_OPEN, None)


def test_the_explanation_says_why_a_success_under_replay_was_refused():
    unreplayable = duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, replace(SUCCESS, response_body_truncated=True)), REPLAY)
    assert "no answer that can be replayed" in unreplayable.explanation
    refused = duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, SUCCESS), REFUSE)
    assert SUCCESS.operation_id in refused.explanation and "replayed" not in refused.explanation


# -- in_flight ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "state", "waits"),
    [
        (BlockKind.OPEN, State.PLANNED, True),
        (BlockKind.OPEN, State.SUBMITTED, True),
        (BlockKind.OPEN, State.OUTCOME_UNKNOWN, False),  # its verdict is in: waiting would change nothing
        (BlockKind.OPEN, State.RECONCILING, False),
        (BlockKind.OPEN, State.MANUAL_REVIEW, False),
        (BlockKind.SUCCEEDED, State.SUCCEEDED, False),
        (BlockKind.KEY_MISMATCH, State.SUBMITTED, False),  # another request's key: never worth waiting for
    ],
)
def test_only_an_open_original_with_no_verdict_yet_is_waited_for(kind, state, waits):
    assert duplicates.in_flight(Blocker(kind, receipt(state, None))) is waits


# -- replayable and replay ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "ok"),
    [
        (SUCCESS, True),
        (replace(SUCCESS, response_headers=[]), True),  # an answer without headers is still an answer
        (replace(SUCCESS, response_headers=None), False),  # settled by a person or the reconciler: no answer held
        (replace(SUCCESS, response_body_truncated=True), False),
        (replace(SUCCESS, response_body_redacted=True), False),  # not what was delivered
        (replace(SUCCESS, status_code=None), False),
        (replace(SUCCESS, status_code=302), False),
        (replace(SUCCESS, status_code=303), True),
        (replace(SUCCESS, status_code=299), True),
        (replace(SUCCESS, status_code=300), False),
    ],
)
def test_replayable(record, ok):
    assert duplicates.replayable(record) is ok


def test_a_replay_is_the_stored_answer_in_order_less_the_headers_whose_values_were_not_stored():
    stored = [["content-type", "application/json"], ["set-cookie", REDACTED], ["x-b", "1"], ["x-a", "2"], ["x-b", "3"]]
    original = replace(SUCCESS, status_code=202, response_headers=stored, response_body=b'{"id": 9}')
    got = duplicates.replay(original)
    assert got.status == 202 and got.body == b'{"id": 9}'
    assert list(got.headers) == [
        (b"content-type", b"application/json"), (b"x-b", b"1"), (b"x-a", b"2"), (b"x-b", b"3"),
        (b"content-length", b"9"), (answers.REPLAYED_HEADER.encode(), b"true"),
    ]


def test_a_replay_of_an_empty_answer_has_an_empty_body():
    got = duplicates.replay(replace(SUCCESS, status_code=204, response_headers=[], response_body=None))
    assert (got.status, got.body, got.header("content-length")) == (204, b"", "0")


def test_a_replay_of_a_row_from_before_header_pairs_reads_its_dict():
    got = duplicates.replay(replace(SUCCESS, response_headers={"content-type": "text/plain", "etag": '"v1"'}))
    assert got.header("content-type") == "text/plain" and got.header("etag") == '"v1"'


# -- refusal_answer -----------------------------------------------------------------------------------------------


def problem_of(answer: answers.Answer) -> dict:
    assert answer.header("content-type") == answers.PROBLEM_CONTENT_TYPE
    return json.loads(answer.body)


def test_a_refusal_answer_names_the_blocking_receipt_and_a_replay_says_so():
    replay = duplicates.refusal_answer(duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, SUCCESS), REPLAY), None)
    assert replay.status == 201 and replay.body == b'{"id":1}'
    assert replay.header(answers.REPLAYED_HEADER) == "true" and replay.header(answers.RECEIPT_ID_HEADER) == SUCCESS.operation_id
    assert replay.header("content-length") == "8"
    open_one = receipt(State.MANUAL_REVIEW, None)
    refused = duplicates.refusal_answer(duplicates.decide_retry(Blocker(BlockKind.OPEN, open_one), REPLAY), None)
    assert refused.status == 409 and json.loads(refused.body)["operation_id"] == open_one.operation_id
    assert refused.header(answers.RECEIPT_STATE_HEADER) == "manual_review"


def test_a_refused_success_says_what_the_upstream_answered_and_its_external_id():
    done = replace(SUCCESS, external_id="art_42")
    got = duplicates.refusal_answer(duplicates.decide_retry(Blocker(BlockKind.SUCCEEDED, done), REFUSE), None)
    document = problem_of(got)
    assert got.status == 409 and document["type"].endswith(":duplicate-succeeded")
    assert (document["upstream_status"], document["external_id"], document["state"]) == (201, "art_42", "succeeded")
    assert got.header(answers.REPLAYED_HEADER) is None


def test_a_reused_key_is_a_422_that_quotes_the_key():
    blocker = Blocker(BlockKind.KEY_MISMATCH, SUCCESS)
    got = duplicates.refusal_answer(duplicates.decide_retry(blocker, REPLAY), "key-123")
    document = problem_of(got)
    assert got.status == 422 and document["type"].endswith(":idempotency-key-mismatch")
    assert "'key-123'" in document["detail"] and document["operation_id"] == SUCCESS.operation_id


def test_a_repeat_that_waited_for_an_original_now_unknown_gets_the_originals_504():
    """In effect it is the same call as the original, whose outcome is unknown: a 409 would say less."""
    unknown = receipt(State.OUTCOME_UNKNOWN, 503)
    decision = duplicates.decide_retry(Blocker(BlockKind.OPEN, unknown), REPLAY)
    waited = duplicates.refusal_answer(decision, None, waited=True)
    document = problem_of(waited)
    assert waited.status == 504 and document["type"].endswith(":outcome-unknown")
    assert (document["operation_id"], document["state"], document["upstream_status"]) == (unknown.operation_id, "outcome_unknown", 503)
    assert waited.header(answers.RECEIPT_STATE_HEADER) == "outcome_unknown"
    assert duplicates.refusal_answer(decision, None, waited=False).status == 409  # one that did not wait: refused


def test_a_repeat_that_waited_and_gave_up_while_the_original_is_still_in_flight_is_a_409():
    in_flight = receipt(State.SUBMITTED, None)
    got = duplicates.refusal_answer(duplicates.decide_retry(Blocker(BlockKind.OPEN, in_flight), REPLAY), None, waited=True)
    assert got.status == 409 and problem_of(got)["type"].endswith(":duplicate-open")
    assert got.header(answers.RECEIPT_STATE_HEADER) == "submitted"


@pytest.mark.parametrize(
    ("policy", "window", "blocks_for"),
    [
        ("replay", 900.0, 900.0),
        ("refuse", 60.0, 60.0),
        ("replay", 0.0, None),  # no window: a success blocks nothing, not even for an instant
        ("allow", 900.0, None),  # allow: a success never blocks, whatever the window
    ],
)
def test_how_long_a_success_blocks_a_repeat(policy, window, blocks_for):
    assert duplicates.successes_block_for(AfterSuccess(policy=policy, window=window)) == blocks_for
