"""rules/verdicts.py on its own: which ending is which verdict, and what of an answer is kept for a replay."""

import gzip
import json

import pytest

from proxy_addon.config import parse_config
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse
from proxy_addon.rules.states import State
from proxy_addon.rules.verdicts import is_success, send_verdict, storable_response

POLICY = parse_config("").policy_for("api.example.com", 443)


def answered(status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> SendResult:
    return SendResult(SendEnd.ANSWERED, UpstreamResponse(status, "", headers or [], body))


@pytest.mark.parametrize("status, state", [
    (200, State.SUCCEEDED), (201, State.SUCCEEDED), (204, State.SUCCEEDED), (299, State.SUCCEEDED), (303, State.SUCCEEDED),
    (300, State.REJECTED), (301, State.REJECTED), (302, State.REJECTED), (304, State.REJECTED), (307, State.REJECTED), (308, State.REJECTED),
    (401, State.REJECTED), (413, State.REJECTED), (422, State.REJECTED), (501, State.REJECTED),
    (500, State.OUTCOME_UNKNOWN), (503, State.OUTCOME_UNKNOWN),
])
def test_the_verdict_of_each_status(status, state):
    verdict = send_verdict(answered(status), POLICY, None)
    assert (verdict.state, verdict.status_code) == (state, status)
    assert is_success(status) == (state == State.SUCCEEDED)


@pytest.mark.parametrize("status", [200, 202, 303, 409])
def test_a_status_the_host_lists_as_unknown_is_unknown_even_when_it_would_be_a_success(status):
    policy = parse_config(f"hosts: {{api.example.com: {{unknown_statuses: [{status}]}}}}").policy_for("api.example.com", 443)
    verdict = send_verdict(answered(status), policy, None)
    assert (verdict.state, verdict.status_code, verdict.error_code) == (State.OUTCOME_UNKNOWN, status, "upstream_status")


@pytest.mark.parametrize("end, state", [
    (SendEnd.NOT_SENT, State.REJECTED), (SendEnd.TIMEOUT, State.OUTCOME_UNKNOWN),
    (SendEnd.RESET, State.OUTCOME_UNKNOWN), (SendEnd.ERROR, State.OUTCOME_UNKNOWN),
])
def test_the_verdict_of_each_ending_without_an_answer(end, state):
    assert send_verdict(SendResult(end, error="x"), POLICY, None).state == state


def test_an_answer_is_kept_as_delivered():
    pretty = b'{\n  "id": 7\n}\n'
    headers = [(b"Content-Type", b"application/json"), (b"Content-Encoding", b"gzip"), (b"Link", b"<a>"),
               (b"Link", b"<b>"), (b"Set-Cookie", b"s=secret")]
    body = gzip.compress(pretty)
    kept = storable_response(answered(201, body, headers), POLICY, 65536)
    assert kept["response_body"] == body
    assert kept["response_headers"] == [["Content-Type", "application/json"], ["Content-Encoding", "gzip"],
                                        ["Link", "<a>"], ["Link", "<b>"], ["Set-Cookie", "[REDACTED]"]]
    assert (kept["response_body_truncated"], kept["response_body_redacted"]) == (False, False)


@pytest.mark.parametrize("encoding", [None, b"gzip"])
def test_an_answer_with_a_secret_field_is_kept_redacted(encoding):
    plain = json.dumps({"id": 7, "nested": {"token": "t0ps3cret"}}, indent=2).encode()
    body = gzip.compress(plain) if encoding else plain
    headers = [(b"Content-Type", b"application/json")] + ([(b"Content-Encoding", encoding)] if encoding else [])
    kept = storable_response(answered(201, body, headers), POLICY, 65536)
    assert b"t0ps3cret" not in kept["response_body"]
    assert json.loads(kept["response_body"]) == {"id": 7, "nested": {"token": "[REDACTED]"}}
    assert kept["response_headers"] == [["Content-Type", "application/json"]]  # stored decoded
    assert kept["response_body_redacted"] is True


def test_an_answer_longer_than_the_cap_is_kept_truncated():
    kept = storable_response(answered(201, b"x" * 100), POLICY, 64)
    assert (len(kept["response_body"]), kept["response_body_truncated"], kept["response_body_redacted"]) == (64, True, False)


CAP = 64


@pytest.mark.parametrize("size", [CAP - 1, CAP, CAP + 1])
def test_the_stored_answer_is_whole_up_to_the_cap_and_marked_cut_past_it(size):
    """At the bound itself: an answer one byte over the cap kept as if whole would be replayed one byte short."""
    body = bytes(range(size))
    kept = storable_response(answered(201, body), POLICY, CAP)
    assert kept["response_body"] == body[:CAP]
    assert kept["response_body_truncated"] is (size > CAP)
    assert len(kept["response_body"]) == min(size, CAP)
