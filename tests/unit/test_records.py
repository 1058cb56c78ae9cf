"""The journal's record types (rules/records.py): operation ids, a stored answer's headers whichever way the row
kept them, a receipt read from a row by its column names, and what a verdict says of itself."""

import re
from types import SimpleNamespace

from proxy_addon.rules.records import (
    INTENT_FIELDS,
    RECEIPT_FIELDS,
    Intent,
    ReceiptRecord,
    Verdict,
    new_operation_id,
)
from proxy_addon.rules.states import State


def test_an_operation_id_is_op_and_32_hex_digits_and_never_repeats():
    ids = {new_operation_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(r"op_[0-9a-f]{32}", i) for i in ids)


def test_each_intent_gets_its_own_operation_id_unless_given_one():
    a = Intent("x", "POST", "https", "h", 443, "/", "sha256:1", "acct:a")
    b = Intent("x", "POST", "https", "h", 443, "/", "sha256:1", "acct:a")
    assert a.operation_id != b.operation_id
    assert Intent("x", "POST", "https", "h", 443, "/", "sha256:1", "acct:a", operation_id="op_given").operation_id == "op_given"
    assert INTENT_FIELDS[-1] == "operation_id" and "intent_fingerprint" in INTENT_FIELDS


def row(**values) -> SimpleNamespace:
    """A result row as SQLAlchemy gives it: its values by column name in `_mapping`, with extra columns."""
    return SimpleNamespace(_mapping={**dict.fromkeys(RECEIPT_FIELDS), "extra_column": 1, **values})


def test_a_receipt_is_read_from_a_row_by_column_name():
    got = ReceiptRecord.from_row(row(operation_id="op_1", state="succeeded", status_code=201, port=443))
    assert (got.operation_id, got.state, got.status_code, got.port) == ("op_1", "succeeded", 201, 443)


def test_a_stored_answers_headers_in_order_whether_kept_as_pairs_or_as_an_older_rows_dict():
    pairs = ReceiptRecord.from_row(row(response_headers=[["Set-Cookie", "a"], ["x", "1"], ["set-cookie", "b"]]))
    assert pairs.response_header_pairs() == [("Set-Cookie", "a"), ("x", "1"), ("set-cookie", "b")]
    older = ReceiptRecord.from_row(row(response_headers={"content-type": "text/plain", "etag": 7}))
    assert older.response_header_pairs() == [("content-type", "text/plain"), ("etag", "7")]
    assert ReceiptRecord.from_row(row()).response_header_pairs() == []


def test_a_verdict_reads_its_columns_from_its_updates():
    v = Verdict(State.REJECTED, {"status_code": 422, "error_code": "upstream_status", "error_message": "no",
                                 "external_id": "x_1"})
    assert (v.status_code, v.error_code, v.error_message, v.external_id) == (422, "upstream_status", "no", "x_1")
    bare = Verdict(State.OUTCOME_UNKNOWN)
    assert (bare.status_code, bare.error_code, bare.error_message, bare.external_id) == (None, None, None, None)
    assert bare.updates == {} and bare.detail == {} and bare.updates is not Verdict(State.SUCCEEDED).updates
