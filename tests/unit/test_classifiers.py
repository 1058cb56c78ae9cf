"""The pure decisions, table by table: how a send ended (sender.classify_exception), what that makes of the
receipt (verdicts.send_verdict) and what of an answer is kept (verdicts.storable_response). What a request
gets when an earlier receipt stands in its way: test_duplicates.py."""

import gzip
import json

import h2.exceptions
import h11
import pytest

from proxy_addon.config import parse_config
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse, classify_exception
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.states import State
from proxy_addon.rules.verdicts import send_verdict, storable_response

POLICY = parse_config("hosts: {}").policy_for("api.example.com", 443)


@pytest.mark.parametrize(
    ("exc", "written", "end"),
    [
        (ConnectionRefusedError(), False, SendEnd.NOT_SENT),
        (TimeoutError(), False, SendEnd.NOT_SENT),
        (h11.LocalProtocolError("bad header"), False, SendEnd.NOT_SENT),
        (TimeoutError(), True, SendEnd.TIMEOUT),
        (ConnectionResetError(), True, SendEnd.RESET),
        (EOFError(), True, SendEnd.RESET),
        (h11.RemoteProtocolError("garbage"), True, SendEnd.RESET),
        (h2.exceptions.ProtocolError("a frame HTTP/2 forbids"), True, SendEnd.RESET),
        (ValueError("anything else"), True, SendEnd.ERROR),
    ],
)
def test_classify_exception_by_whether_a_byte_may_have_been_written(exc, written, end):
    assert classify_exception(exc, written) == end


def answered(status: int, body: bytes = b"{}", headers: list[tuple[bytes, bytes]] | None = None) -> SendResult:
    return SendResult(SendEnd.ANSWERED, UpstreamResponse(status, "", headers or [(b"content-type", b"application/json")], body))


@pytest.mark.parametrize(
    ("result", "state", "error_code", "status"),
    [
        (answered(201), State.SUCCEEDED, None, 201),
        (answered(204, b""), State.SUCCEEDED, None, 204),
        (answered(422), State.REJECTED, "upstream_status", 422),
        (answered(404), State.REJECTED, "upstream_status", 404),
        (answered(501), State.REJECTED, "upstream_status", 501),
        (answered(500), State.OUTCOME_UNKNOWN, "upstream_status", 500),
        (answered(503), State.OUTCOME_UNKNOWN, "upstream_status", 503),
        (SendResult(SendEnd.NOT_SENT, error="refused"), State.REJECTED, "not_sent", None),
        (SendResult(SendEnd.TIMEOUT, error="read timeout"), State.OUTCOME_UNKNOWN, "upstream_timeout", None),
        (SendResult(SendEnd.RESET, error="reset"), State.OUTCOME_UNKNOWN, "upstream_reset", None),
        (SendResult(SendEnd.ERROR, error="?"), State.OUTCOME_UNKNOWN, "upstream_error", None),
    ],
)
def test_classify_outcome(result, state, error_code, status):
    verdict = send_verdict(result, POLICY, None)
    assert (verdict.state, verdict.error_code, verdict.status_code) == (state, error_code, status)


def test_the_hosts_unknown_statuses_decide_what_is_unknown():
    policy = parse_config("hosts: {api.example.com: {unknown_statuses: [502]}}").policy_for("api.example.com", 443)
    assert send_verdict(answered(500), policy, None).state == State.REJECTED
    assert send_verdict(answered(502), policy, None).state == State.OUTCOME_UNKNOWN


@pytest.mark.parametrize(
    ("spec", "result", "external_id"),
    [
        ("$.id", answered(201, b'{"id": 42}'), "42"),
        ("$.data.id", answered(201, b'{"data": {"id": "a-1"}}'), "a-1"),
        ("$.id", answered(201, b"not json"), None),
        ("$.id", answered(201, b'{"id": {"nested": 1}}'), None),
        ("header:Location", answered(201, b"", [(b"Location", b"/things/7")]), "/things/7"),
        ("$.id", answered(201, gzip.compress(b'{"id": 9}'), [(b"content-encoding", b"gzip")]), "9"),
    ],
)
def test_the_external_id_comes_from_the_rule(spec, result, external_id):
    rule = OperationRule(name="create", method="POST", path="/things", external_id=spec)
    assert send_verdict(result, POLICY, rule).external_id == external_id


def test_a_json_answer_with_a_secret_is_stored_redacted_and_others_as_they_came():
    secret = storable_response(answered(201, b'{"id": 1, "password": "p4ss", "token": "t0k"}'), POLICY, 65536)
    assert json.loads(secret["response_body"]) == {"id": 1, "password": "[REDACTED]", "token": "[REDACTED]"}
    assert (secret["response_body_truncated"], secret["response_body_redacted"]) == (False, True)
    plain = storable_response(answered(201, b'{ "id": 1 }'), POLICY, 65536)
    assert (plain["response_body"], plain["response_body_redacted"]) == (b'{ "id": 1 }', False)
    compressed = gzip.compress(b'{"id": 1}')
    kept = storable_response(answered(201, compressed, [(b"content-encoding", b"gzip")]), POLICY, 65536)
    assert kept["response_body"] == compressed and ["content-encoding", "gzip"] in [list(h) for h in kept["response_headers"]]


def test_a_stored_answer_over_the_cap_is_cut_and_says_so():
    stored = storable_response(answered(201, b"x" * 100, [(b"content-type", b"text/plain")]), POLICY, 10)
    assert (stored["response_body"], stored["response_body_truncated"]) == (b"x" * 10, True)


def test_secret_answer_headers_are_not_stored():
    stored = storable_response(answered(201, b"{}", [(b"set-cookie", b"session=s3cret"), (b"x-request-id", b"r1")]), POLICY, 100)
    assert [list(h) for h in stored["response_headers"]] == [["set-cookie", "[REDACTED]"], ["x-request-id", "r1"]]

