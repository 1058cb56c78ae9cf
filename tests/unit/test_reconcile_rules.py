"""Filling a reconcile rule's read from a receipt (reconcile/rules.py), pure: URL placeholders quoted as a URL
needs them, a value the receipt does not have (or has only redacted) making the rule unreadable for it, `${VAR}`
headers from the environment at read time, candidates compared as canonical JSON, and candidates' times. The
worker that uses them, against real upstreams: test_reconcile.py."""

import json
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import parse_qs, parse_qsl, urlsplit

import pytest

from proxy_addon.exceptions import ReadNotPossibleError, UnreadableRuleError
from proxy_addon.reconcile.rules import candidate_matches, expand_env, fill_template, netloc_of, parse_time
from proxy_addon.rules.operations import ReconcileRule
from proxy_addon.rules.records import RECEIPT_FIELDS, ReceiptRecord
from proxy_addon.rules.redaction import REDACTED

CREATED = datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC)


def receipt(**fields) -> ReceiptRecord:
    given = dict.fromkeys(RECEIPT_FIELDS) | {
        "operation_id": "op_1", "scheme": "https", "host": "api.example.com", "port": 443, "created_at": CREATED,
        "request_body": json.dumps({"title": "a/b c", "n": 7, "ok": True, "nested": {"k": "v"}, "pin": REDACTED}).encode(),
    }
    return ReceiptRecord(**(given | fields))


@pytest.mark.parametrize(
    ("scheme", "host", "port", "netloc"),
    [("https", "h.test", 443, "h.test"), ("http", "h.test", 80, "h.test"), ("https", "h.test", 8443, "h.test:8443"),
     ("http", "h.test", 443, "h.test:443"), ("https", "::1", 443, "[::1]"), ("https", "::1", 8443, "[::1]:8443")],
)
def test_the_netloc_leaves_out_the_schemes_default_port_and_brackets_ipv6(scheme, host, port, netloc):
    assert netloc_of(receipt(scheme=scheme, host=host, port=port)) == netloc


def test_placeholders_are_filled_and_quoted_except_the_origins_own_parts():
    r = receipt(external_id="ch/1 2", idempotency_key="k+1", port=8443)
    url = fill_template("{scheme}://{netloc}/x/{external_id}?key={idempotency_key}&t={body.title}&n={body.n}&b={body.ok}"
                        "&p={path.id}&op={operation_id}", r, {"id": "a b"})
    assert url == "https://api.example.com:8443/x/ch%2F1%202?key=k%2B1&t=a%2Fb%20c&n=7&b=true&p=a%20b&op=op_1"


def test_submitted_at_is_the_submission_in_utc_or_the_creation_when_never_submitted():
    assert fill_template("{submitted_at}", receipt(), {}) == "2026-12-03T16%3A00%3A00Z"
    submitted = receipt(submitted_at=CREATED + timedelta(seconds=2))
    assert fill_template("{submitted_at}", submitted, {}) == "2026-12-03T16%3A00%3A02Z"


@pytest.mark.parametrize(
    ("template", "fields"),
    [
        ("/x/{external_id}", {}),  # none was found in the answer
        ("/x?k={idempotency_key}", {}),
        ("/x/{body.pin}", {}),  # redacted before it was stored
        ("/x/{body.nested}", {}),  # an object is no URL text
        ("/x/{body.missing}", {}),
        ("/x/{body.title}", {"request_body": b"not json"}),
        ("/x/{body.title}", {"request_body": None}),
        ("/x/{path.id}", {}),  # the path had no such parameter
    ],
)
def test_a_value_the_receipt_does_not_have_makes_the_rule_unreadable_for_it(template, fields):
    with pytest.raises(UnreadableRuleError, match=r"needs \{"):
        fill_template(template, receipt(**fields), {})


def test_headers_take_environment_variables_at_read_time(monkeypatch):
    monkeypatch.setenv("RECEIPTS_TEST_TOKEN", "s3cret")
    got = expand_env({"Authorization": "Bearer ${RECEIPTS_TEST_TOKEN}", "Accept": "application/json", "X": "$NOT_A_VAR"})
    assert got == {"Authorization": "Bearer s3cret", "Accept": "application/json", "X": "$NOT_A_VAR"}
    monkeypatch.delenv("RECEIPTS_TEST_TOKEN")
    with pytest.raises(ReadNotPossibleError, match="RECEIPTS_TEST_TOKEN is not set"):
        expand_env({"Authorization": "Bearer ${RECEIPTS_TEST_TOKEN}"})


RULE = ReconcileRule(strategy="search", url="http://h/", match={"$.title": "$.title", "$.meta": "$.meta"})


@pytest.mark.parametrize(
    ("candidate", "matches"),
    [
        ({"title": "t", "meta": {"a": 1, "b": [1, 2]}, "id": 9}, True),
        ({"meta": {"b": [1, 2], "a": 1.0}, "title": "t"}, True),  # key order and 1 == 1.0: canonical JSON
        ({"title": "t", "meta": {"a": 1, "b": [2, 1]}}, False),  # a list's order counts
        ({"title": "T", "meta": {"a": 1, "b": [1, 2]}}, False),
        ({"title": "t"}, False),  # a field the candidate lacks
        ([], False),
    ],
)
def test_a_candidate_matches_when_every_field_equals_the_originals(candidate, matches):
    assert candidate_matches(candidate, {"title": "t", "meta": {"a": 1, "b": [1, 2]}}, RULE) is matches


@pytest.mark.parametrize("original", [{"title": REDACTED, "meta": {}}, {"meta": {}}, None])
def test_an_original_field_not_journaled_makes_matching_unreadable_not_false(original):
    with pytest.raises(UnreadableRuleError, match=r"match needs \$\.title"):
        candidate_matches({"title": "t", "meta": {}}, original, RULE)


@pytest.mark.parametrize(
    ("value", "when"),
    [
        (1764777600, datetime(2025, 12, 3, 16, 0, tzinfo=UTC)),
        (1764777600.5, datetime(2025, 12, 3, 16, 0, 0, 500000, tzinfo=UTC)),
        ("2025-12-03T16:00:00Z", datetime(2025, 12, 3, 16, 0, tzinfo=UTC)),
        ("2025-12-03T17:00:00+01:00", datetime(2025, 12, 3, 17, 0, tzinfo=timezone(timedelta(hours=1)))),
        ("2025-12-03T16:00:00", datetime(2025, 12, 3, 16, 0, tzinfo=UTC)),  # naive: UTC
        ("yesterday", None),
        (None, None),
        ([2025], None),
    ],
)
def test_a_candidates_time_is_epoch_seconds_or_rfc_3339(value, when):
    got = parse_time(value)
    assert got == when and (got is None or got.tzinfo is not None)


# -- what the presets need: form bodies as documents, `{key+}` paths, optional match fields ------------------------


def test_a_form_body_is_a_document_with_its_bracketed_keys_nested():
    from proxy_addon.reconcile.rules import form_document

    pairs = [("email", "a@b"), ("metadata[order]", "7"), ("items[][price]", "p1"), ("items[][price]", "p2"), ("tags[]", "x")]
    assert form_document(pairs) == {"email": "a@b", "metadata": {"order": "7"}, "items": [{"price": "p1"}, {"price": "p2"}], "tags": ["x"]}


def test_a_greedy_path_placeholder_takes_the_rest_of_the_path():
    from proxy_addon.rules.operations import compile_path_template

    assert compile_path_template("/{object+}").match("/bucket/dir/a%20b.txt").group("object") == "bucket/dir/a%20b.txt"
    with pytest.raises(ValueError, match="must come last"):
        compile_path_template("/{a+}/{b}")


def test_a_form_value_matches_the_number_the_server_answers_with():
    from proxy_addon.reconcile.rules import same_value

    assert same_value(2000, "2000") and same_value(True, "true") and not same_value(2001, "2000")
    assert not same_value("2000", 2000.5)


# -- and what azure-blob and pocketbase need: rules told apart by the query, each field compared, page numbers --


def test_a_rules_query_tells_apart_calls_on_one_path():
    from proxy_addon.config import parse_config
    from proxy_addon.protocols.routing import match_rule, receipt_rule

    policy = parse_config("hosts:\n  127.0.0.1: {preset: azure-blob}\n").policy_for("127.0.0.1", 80)

    def rule_for(method: str, target: str) -> str | None:
        path, _, query = target.partition("?")
        matched = match_rule(policy, method, path, None, parse_qsl(query))
        again = receipt_rule(policy, method, path, "any", query or None)
        assert (matched and matched[0].name) == (again and again[0].name)  # the reconciler finds the same rule
        return matched[0].name if matched else None

    assert rule_for("PUT", "/devstoreaccount1/c?restype=container") == "azure.blob.create_container"
    assert rule_for("PUT", "/c?restype=container") == "azure.blob.create_container"
    assert rule_for("PUT", "/c?restype=container&comp=metadata") is None
    assert rule_for("PUT", "/devstoreaccount1/c/dir/b.txt") == "azure.blob.put_blob"
    assert rule_for("PUT", "/c/b?comp=blocklist") == "azure.blob.put_block_list"
    assert rule_for("PUT", "/c/b?comp=block&blockid=YQ%3D%3D") is None  # Put Block: no rule, to a person
    assert rule_for("DELETE", "/c/b") == "azure.blob.delete_blob"
    assert rule_for("DELETE", "/c/b?snapshot=2026-01-01T00:00:00Z") is None  # a snapshot's delete leaves the blob
    assert rule_for("DELETE", "/devstoreaccount1/c?restype=container") is None


EACH = ReconcileRule(strategy="search", url="http://h/", match={"$": "$"}, match_compare="each_field", match_when_missing="skip")


@pytest.mark.parametrize(
    ("candidate", "matches"),
    [
        ({"id": "r1", "title": "t", "n": 12, "due": "2024-05-01 00:00:00.000Z", "meta": {"x": 1}}, True),
        ({"id": "r1", "title": "t", "n": 12, "due": "2024-05-02 00:00:00.000Z", "meta": {"x": 1}}, False),
        ({"id": "r1", "title": "t", "n": 13, "due": "2024-05-01", "meta": {"x": 1}}, False),
        ({"id": "r1", "title": "t", "n": 12, "due": "2024-05-01", "meta": {"x": 1, "y": 2}}, False),  # a field is whole
        ({"id": "r1", "n": 12, "due": "2024-05-01", "meta": {"x": 1}}, True),  # title never shown: left out
    ],
)
def test_each_field_the_request_gave_equals_the_candidates(candidate, matches):
    # the form's "12" is the number 12; the date is the same instant however written
    original = {"title": "t", "n": "12", "due": "2024-05-01", "meta": {"x": 1}, "password": REDACTED}
    assert candidate_matches(candidate, original, EACH) is matches


def test_each_field_needs_an_object_one_field_at_least_and_no_redacted_field_it_compares():
    with pytest.raises(UnreadableRuleError, match="not an object"):
        candidate_matches({"a": 1}, ["a"], EACH)
    with pytest.raises(UnreadableRuleError, match="none of the fields"):
        candidate_matches({"a": 1}, {"b": 1}, EACH)
    with pytest.raises(UnreadableRuleError, match="'password'.*redacted"):
        candidate_matches({"password": "p"}, {"password": REDACTED}, EACH)
    refuse = EACH.model_copy(update={"match_when_missing": "refuse"})
    assert candidate_matches({"a": 1}, {"a": 1, "b": 2}, refuse) is False


@pytest.mark.parametrize(("page", "want"), [({"page": 1, "totalPages": 2}, "2"), ({"page": 2, "totalPages": 2}, None), ({"page": 1, "totalPages": 0}, None)])
def test_a_page_number_cursor_asks_for_the_next_page_until_the_last(page, want):
    from proxy_addon.reconcile.strategies import _next_read

    rule = ReconcileRule.model_validate(
        {"strategy": "search", "url": "http://h/", "match": {"$.a": "$.a"}, "cursor": {"value": "$.page", "into": "query:page", "last": "$.totalPages"}}
    )
    url, _ = _next_read(rule, page, "http://h/r?perPage=1000&page=1", {})
    assert (url and parse_qs(urlsplit(url).query)["page"][0]) == want
    with pytest.raises(ReadNotPossibleError, match="no page number"):  # skipTotal's -1: no proof the list ended
        _next_read(rule, {"page": 1, "totalPages": -1}, "http://h/r?page=1", {})
