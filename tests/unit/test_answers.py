"""The answers the proxy gives (rules/answers.py): an `Answer`'s headers as they go out, the upstream's answer
passed on as it came, and each problem+json of ours: its status, type, the receipt it names, and what it tells
the agent about retrying."""

import json

import pytest

from proxy_addon.request.sender import UpstreamResponse
from proxy_addon.rules import answers


def document(a: answers.Answer) -> dict:
    assert a.header("Content-Type") == "application/problem+json" and a.header("Cache-Control") == "no-store"
    assert a.header("Content-Length") == str(len(a.body))
    return json.loads(a.body)


# -- Answer ---------------------------------------------------------------------------------------------------


def test_with_headers_replaces_whatever_the_case():
    a = answers.answer(200, b"x", {"X-Receipt-Id": "old", "Content-Type": "text/plain"})
    b = a.with_headers({"x-receipt-id": "new"})
    assert b.header("X-Receipt-Id") == "new" and len([k for k, _ in b.headers if k.lower() == b"x-receipt-id"]) == 1
    assert b.header("content-type") == "text/plain" and a.header("X-Receipt-Id") == "old"  # a copy: the first unchanged


def test_with_headers_drops_every_repeat_of_the_name_and_appends_the_new_value_last():
    a = answers.exact(200, [(b"X-Receipt-State", b"a"), (b"Etag", b"1"), (b"x-receipt-state", b"b")], b"")
    b = a.with_headers({"X-Receipt-State": "succeeded"})
    assert list(b.headers) == [(b"Etag", b"1"), (b"content-length", b"0"), (b"X-Receipt-State", b"succeeded")]


def test_a_header_value_outside_latin_1_is_replaced_not_raised():
    a = answers.answer(200, b"", {"X-Note": "caf\u00e9 \u2713"}).with_headers({"X-Other": "\u2713"})
    assert a.header("x-note") == "caf\u00e9 ?" and a.header("x-other") == "?"


def test_header_is_none_when_absent_and_the_first_when_repeated():
    a = answers.exact(200, [(b"Vary", b"a"), (b"vary", b"b")], b"")
    assert a.header("VARY") == "a" and a.header("x-missing") is None


def test_answer_lowercases_its_names_and_sets_content_length_from_the_body():
    a = answers.answer(201, b"hello", {"Content-Type": "text/plain", "Content-Length": "999"})
    assert list(a.headers) == [(b"content-type", b"text/plain"), (b"content-length", b"5")]
    assert (a.status, a.body, a.reason) == (201, b"hello", None)


def test_exact_keeps_names_order_and_repeats_and_only_its_own_content_length():
    headers = [(b"Set-Cookie", b"a=1"), (b"X-Z", b"z"), (b"Content-Length", b"3"), (b"set-cookie", b"b=2")]
    a = answers.exact(200, headers, b"", "Fine")
    assert list(a.headers) == [(b"Set-Cookie", b"a=1"), (b"X-Z", b"z"), (b"set-cookie", b"b=2"), (b"content-length", b"0")]
    assert a.reason == "Fine"


def test_the_upstreams_answer_goes_out_as_it_came_with_its_reason_phrase():
    upstream = UpstreamResponse(418, "I'm a teapot", [(b"Content-Encoding", b"gzip"), (b"X-A", b"1")], b"\x1f\x8b..")
    a = answers.from_upstream(upstream)
    assert (a.status, a.reason, a.body) == (418, "I'm a teapot", b"\x1f\x8b..")
    assert list(a.headers) == [(b"Content-Encoding", b"gzip"), (b"X-A", b"1"), (b"content-length", b"4")]


def test_with_receipt_sets_both_receipt_headers():
    a = answers.with_receipt(answers.answer(200, b""), "op_1", "succeeded")
    assert (a.header(answers.RECEIPT_ID_HEADER), a.header(answers.RECEIPT_STATE_HEADER)) == ("op_1", "succeeded")


# -- problem+json -------------------------------------------------------------------------------------------------


def test_a_problem_leaves_out_the_extras_that_are_none():
    got = document(answers.problem(409, "x", "Title", "Detail.", operation_id="op_1", upstream_status=None, external_id=""))
    assert got == {"type": "urn:agent-receipts:problem:x", "title": "Title", "status": 409, "detail": "Detail.",
                   "operation_id": "op_1", "external_id": ""}


@pytest.mark.parametrize(
    ("answer", "status", "kind", "fields", "says"),
    [
        (answers.outcome_unknown("op_1", "The upstream did not answer", 502), 504, "outcome-unknown",
         {"operation_id": "op_1", "state": "outcome_unknown", "upstream_status": 502}, "retrying it is blocked"),
        (answers.outcome_unknown("op_1", "Timed out", None, "reconciling"), 504, "outcome-unknown",
         {"operation_id": "op_1", "state": "reconciling"}, "may have acted"),
        (answers.not_sent("op_2", "Could not connect"), 502, "not-sent",
         {"operation_id": "op_2", "state": "rejected"}, "retrying is allowed"),
        (answers.duplicate_open("op_3", "submitted"), 409, "duplicate-open",
         {"operation_id": "op_3", "state": "submitted"}, "which is submitted"),
        (answers.duplicate_succeeded("op_4", 201, "ext_1"), 409, "duplicate-succeeded",
         {"operation_id": "op_4", "state": "succeeded", "upstream_status": 201, "external_id": "ext_1"}, "answered 201"),
        (answers.duplicate_succeeded("op_4"), 409, "duplicate-succeeded",
         {"operation_id": "op_4", "state": "succeeded"}, "already succeeded as op_4;"),
        (answers.idempotency_key_mismatch("op_5", "succeeded", "k-1"), 422, "idempotency-key-mismatch",
         {"operation_id": "op_5", "state": "succeeded"}, "'k-1' belongs to op_5"),
        (answers.journal_unavailable("database is locked"), 503, "journal-unavailable", {}, "(database is locked)"),
        (answers.bad_request("A header value is not allowed"), 400, "bad-request", {}, "Nothing was journaled"),
        (answers.body_too_large(1024, 4096), 413, "body-too-large", {"max_body": 1024}, "of 4096 bytes is over"),
        (answers.body_too_large(1024), 413, "body-too-large", {"max_body": 1024}, "The request body is over"),
        (answers.forbidden_destination("the admin server"), 403, "forbidden-destination", {}, "addressed to the admin server"),
    ],
)
def test_each_problem_has_its_status_type_and_fields(answer, status, kind, fields, says):
    got = document(answer)
    assert answer.status == got["status"] == status and got["type"] == answers.PROBLEM_BASE + kind
    base = {"type", "title", "status", "detail"}
    assert {k: v for k, v in got.items() if k not in base} == fields
    assert says in got["detail"]


def test_a_problem_with_an_upstream_status_of_none_does_not_claim_one():
    got = document(answers.duplicate_succeeded("op_4", None))
    assert "upstream_status" not in got and "the upstream answered" not in got["detail"]
