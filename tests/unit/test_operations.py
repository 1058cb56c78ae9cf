"""Operation rules (rules/operations.py) as the pure validators they are: HTTP method tokens, path templates, what
identifies a write, where its external id is, and the reconcile rule's own consistency; each refusal one line that
names what is wrong. Rules inside a whole config (the lookup, the messages with their key): test_config.py and
test_reconcile.py."""

import pytest
from pydantic import ValidationError

from proxy_addon.rules.operations import (
    MAX_METHOD_LENGTH,
    FingerprintRule,
    OperationRule,
    ReconcileRule,
    compile_path_template,
    method_token,
)


@pytest.mark.parametrize(
    ("method", "token"),
    [("post", "POST"), ("Purge", "PURGE"), ("MKCOL", "MKCOL"), ("x-sync", "X-SYNC"), ("A" * MAX_METHOD_LENGTH, "A" * 16),
     ("m!#$%&'*+-.^_`|~", "M!#$%&'*+-.^_`|~")],  # every character RFC 9110 allows in a token besides letters and digits
)
def test_any_method_token_up_to_the_columns_length_is_upper_cased(method, token):
    assert method_token(method) == token


@pytest.mark.parametrize(
    ("method", "says"),
    [
        ("A" * (MAX_METHOD_LENGTH + 1), "longer than 16 characters"),
        ("", "not an HTTP method token"),
        ("GET /x", "not an HTTP method token"),
        ("PO(ST)", "not an HTTP method token"),
        ("P\u00d6ST", "not an HTTP method token"),
        ("connect", "opens a tunnel"),
        (None, "not an HTTP method token"),
    ],
)
def test_what_is_not_a_method_that_can_be_journaled(method, says):
    with pytest.raises(ValueError, match=says):
        method_token(method)


def test_a_path_template_matches_one_segment_per_placeholder_and_a_trailing_slash():
    pattern = compile_path_template("/v1.0/items/{item_id}/tags/{tag}")
    assert pattern.match("/v1.0/items/7/tags/red").groupdict() == {"item_id": "7", "tag": "red"}
    assert pattern.match("/v1.0/items/7/tags/red/") is not None
    for other in ("/v1x0/items/7/tags/red", "/v1.0/items/7/8/tags/red", "/v1.0/items//tags/red", "/v1.0/items/7/tags/red/x"):
        assert pattern.match(other) is None, other


@pytest.mark.parametrize("path", ["articles/{id}", "", "{id}"])
def test_a_rules_path_starts_with_a_slash(path):
    with pytest.raises(ValidationError, match="must start with /"):
        OperationRule(name="x", method="POST", path=path)


def test_a_fingerprint_rule_is_an_allowlist_or_an_exclusion_not_both():
    assert FingerprintRule(fields=["$.title"]).fields[0].text == "$.title"
    assert FingerprintRule(exclude=["$.nonce"]).exclude[0].text == "$.nonce"
    with pytest.raises(ValidationError, match="either fields .* or exclude, not both"):
        FingerprintRule(fields=["$.title"], exclude=["$.nonce"])


@pytest.mark.parametrize(("external_id", "ok"), [("$.id", True), ("header:Location", True), ("HEADER:x-id", True),
                                                 ("id", False), ("header", False)])
def test_an_external_id_is_a_json_path_or_a_header(external_id, ok):
    if ok:
        assert OperationRule(name="x", method="POST", path="/x", external_id=external_id).external_id == external_id
    else:
        with pytest.raises(ValidationError, match="invalid JSON path"):
            OperationRule(name="x", method="POST", path="/x", external_id=external_id)


def test_a_body_templates_path_placeholders_must_be_in_the_path_and_graphql_braces_are_text():
    body = {"query": "query { charge(id: \"{path.charge_id}\") { id } }", "variables": {"ref": ["{body.ref}"]}}
    rule = OperationRule(name="x", method="POST", path="/c/{charge_id}",
                         reconcile={"strategy": "lookup", "method": "POST", "url": "http://h/graphql", "body": body})
    assert rule.reconcile.body == body
    with pytest.raises(ValidationError, match=r"uses \{path.charge\}, but path /c/\{charge_id\} has no \{charge\}"):
        OperationRule(name="x", method="POST", path="/c/{charge_id}",
                      reconcile={"strategy": "lookup", "method": "POST", "url": "http://h/graphql",
                                 "body": {"deep": [{"id": "{path.charge}"}]}})


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"strategy": "lookup"}, "strategy lookup needs a url"),
        ({"strategy": "search", "match": {"$.a": "$.a"}}, "strategy search needs a url"),
        ({"strategy": "lookup", "url": "http://h/{external_id}", "attempts": 0}, "greater than or equal to 1"),
        ({"strategy": "lookup", "url": "http://h/{external_id}", "attempts": 101}, "less than or equal to 100"),
        ({"strategy": "lookup", "url": "http://h/{external_id}", "max_pages": 0}, "greater than or equal to 1"),
        ({"strategy": "lookup", "url": "http://h/{external_id}", "method": "HEAD", "id": "$.id"}, "method HEAD reads no body"),
        ({"strategy": "search", "url": "http://h/", "match": {"a": "$.a"}}, "invalid JSON path"),
        ({"strategy": "lookup", "url": "http://h/{Path.x}"}, None),  # not a placeholder's form: literal text
        ({"strategy": "resend_with_key"}, None),  # needs no url: it sends the original again
    ],
)
def test_a_reconcile_rule_refuses_what_cannot_work(fields, says):
    if says is None:
        assert ReconcileRule(**fields).strategy == fields["strategy"]
    else:
        with pytest.raises(ValidationError, match=says):
            ReconcileRule(**fields)


def test_absence_means_safe_to_retry_with_retry_safe_or_for_resend_with_key_and_else_goes_to_a_person():
    """resend_with_key settles a receipt by sending it again under its key, which the upstream honours: its
    default stands without retry_safe. A read's absence without retry_safe goes to a person."""
    rule = OperationRule(name="x", method="POST", path="/x", reconcile={"strategy": "resend_with_key"})
    assert rule.reconcile.absent_means == "safe_to_retry"
    looked_up = OperationRule(name="x", method="POST", path="/x", retry_safe=True,
                              reconcile={"strategy": "lookup", "url": "http://h/{external_id}"})
    assert looked_up.reconcile.absent_means == "safe_to_retry"
    without = OperationRule(name="x", method="POST", path="/x", reconcile={"strategy": "lookup", "url": "http://h/{external_id}"})
    assert without.reconcile.absent_means == "manual_review"
