"""What people and tools see of a receipt (views/documents.py): the public columns and never more, `--state`'s
groups, `--host`'s forms, and JSON with times in UTC. Pure: receipts are built here."""

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from proxy_addon.rules.records import RECEIPT_FIELDS, ReceiptRecord, TransitionRecord
from proxy_addon.rules.states import OPEN_STATES, State
from proxy_addon.views import documents
from proxy_addon.views.documents import HostFilter, expand_states, host_query, parse_host_filter

NOW = datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC)


def record(**fields) -> ReceiptRecord:
    given = dict.fromkeys(RECEIPT_FIELDS) | {
        "operation_id": "op_" + "a" * 32, "operation": "POST api.example.com /x", "method": "POST", "scheme": "https",
        "host": "api.example.com", "port": 443, "path": "/x", "intent_fingerprint": "sha256:" + "b" * 64,
        "account": "acct:c", "state": "succeeded", "created_at": NOW, "updated_at": NOW, "authentication_recorded": False,
        "request_body_size": 0, "request_body_truncated": False, "response_body_truncated": False,
        "response_body_redacted": False, "reconcile_attempts": 0,
    }
    return ReceiptRecord(**(given | fields))


# -- the public shape ---------------------------------------------------------------------------------------------


def test_a_receipts_document_is_its_public_columns_and_never_what_was_journaled():
    r = record(request_headers={"authorization": "[REDACTED]"}, request_body=b"{}", response_body=b"{}",
               response_headers=[["set-cookie", "[REDACTED]"]], lease_owner="worker-1")
    got = documents.receipt_document(r)
    assert tuple(got) == documents.PUBLIC_COLUMNS
    assert not {"request_headers", "request_body", "response_headers", "response_body", "lease_owner"} & set(got)
    assert got["authentication_recorded"] is False and got["operation_id"] == r.operation_id


def test_show_adds_the_request_the_answer_and_the_history():
    r = record(request_headers={"content-type": "application/json"}, request_body=b'{"a": 1}', request_body_size=8)
    history = [TransitionRecord(1, r.operation_id, None, "planned", NOW, {}),
               TransitionRecord(2, r.operation_id, "planned", "submitted", NOW + timedelta(seconds=1), {"who": "p"})]
    got = documents.show_document(r, history)
    assert got["request"]["body"]["document"] == {"a": 1} and got["response"] is None  # no answer kept
    assert [(t["from_state"], t["to_state"]) for t in got["transitions"]] == [(None, "planned"), ("planned", "submitted")]
    assert set(documents.PUBLIC_COLUMNS) < set(got)


# -- --state ------------------------------------------------------------------------------------------------------


def test_state_groups_expand_and_states_stay_in_order():
    assert expand_states(["succeeded", "unknown"]) == ["succeeded", "outcome_unknown", "reconciling", "manual_review"]
    assert set(expand_states(["open"])) == {s.value for s in OPEN_STATES}
    assert expand_states([]) == []


@pytest.mark.parametrize("name", ["Succeeded", "done", "", "closed"])
def test_an_unknown_state_names_the_ones_there_are(name):
    with pytest.raises(ValueError) as err:
        expand_states(["succeeded", name])
    message = str(err.value)
    assert repr(name) in message and all(s.value in message for s in State) and "open, unknown" in message


# -- --host -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, host, port", [
    ("api.example.com", "api.example.com", None),
    ("API.Example.com:8443", "api.example.com", 8443),
    ("127.0.0.1:18112", "127.0.0.1", 18112),
    ("[::1]:8080", "::1", 8080),
    ("[::1]", "::1", None),
    ("::1", "::1", None),
    (" h:1 ", "h", 1),
    ("h:65535", "h", 65535),
])
def test_host_filters(text, host, port):
    assert parse_host_filter(text) == (host, port)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("h:0", "a number from 1 to 65535"),
        ("h:65536", "a number from 1 to 65535"),
        ("h:port", "a number from 1 to 65535"),
        ("h:", "no port after the colon"),
        ("[::1]:", "no port after the colon"),
        ("[::1", "write it as host, host:port or [ipv6]:port"),
        ("[::1]8080", "write it as host, host:port or [ipv6]:port"),
        (":8080", "no host name"),
        ("", "no host name"),
        ("[]:80", "no host name"),
    ],
)
def test_a_bad_host_filter_says_what_is_wrong(text, says):
    with pytest.raises(ValueError) as err:
        parse_host_filter(text)
    assert says in str(err.value) and repr(text) in str(err.value)


def test_a_host_filter_reads_back_as_it_is_written_and_queries_the_store():
    assert [str(f) for f in (HostFilter("h", None), HostFilter("h", 8080), HostFilter("::1", 8080), HostFilter("::1", None))] == [
        "h", "h:8080", "[::1]:8080", "[::1]"]
    assert host_query(None) == {} and host_query(HostFilter("h", None)) == {"host": "h", "port": None}
    for text in ("h:8080", "[::1]:8080", "[::1]"):
        assert str(parse_host_filter(text)) == text


# -- JSON ---------------------------------------------------------------------------------------------------------


def test_times_are_written_in_utc_with_a_z_and_bytes_as_text():
    berlin = datetime(2026, 12, 3, 17, 0, 0, 250000, tzinfo=timezone(timedelta(hours=1)))
    got = json.loads(documents.dumps({"at": berlin, "body": b"caf\xc3\xa9 \xff"}))
    assert got == {"at": "2026-12-03T16:00:00.250000Z", "body": "caf\u00e9 \ufffd"}


def test_what_json_cannot_hold_is_an_error_not_a_guess():
    with pytest.raises(TypeError, match="not JSON serialisable: set"):
        documents.dumps({"x": {1}})


def test_dumps_indents_unless_told_not_to():
    assert documents.dumps({"a": 1}) == '{\n  "a": 1\n}' and documents.dumps({"a": 1}, indent=None) == '{"a": 1}'
