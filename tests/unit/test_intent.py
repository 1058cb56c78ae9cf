"""rules/intent.py on its own: what of a request's body the intent keeps, at the bounds of `proxy.max_stored_body`."""

import pytest

from proxy_addon.config import parse_config
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.intent import build_intent

POLICY = parse_config("").policy_for("api.example.com", 443)
CAP = 64


def intent_of(body: bytes, content_type: str = "application/octet-stream"):
    facts = RequestFacts("POST", "https", "api.example.com", 443, "/files", [], [("Content-Type", content_type)],
                         content_type, body)
    return build_intent(facts, POLICY, AccountHasher(b"k" * 32), "inst", CAP, None, "op_x")[0]


@pytest.mark.parametrize("size", [CAP - 1, CAP, CAP + 1])
def test_the_stored_body_is_whole_up_to_the_cap_and_marked_cut_past_it(size):
    body = bytes(range(size))
    it = intent_of(body)
    assert it.request_body == body[:CAP] and len(it.request_body) == min(size, CAP)
    assert it.request_body_truncated is (size > CAP)
    assert it.request_body_size == size


def test_the_cap_applies_to_what_is_stored_not_to_the_body_sent():
    """A JSON body is stored canonical and redacted: the cap and the truncation flag are about that copy."""
    pretty = b'{\n  "b": "' + b"x" * (CAP - 14) + b'",\n  "a": 1\n}'  # canonical form: exactly CAP bytes
    it = intent_of(pretty, "application/json")
    assert len(it.request_body) == CAP and it.request_body.startswith(b'{"a":1,"b":"')
    assert it.request_body_truncated is False and it.request_body_size == len(pretty) > CAP
    assert intent_of(pretty.replace(b'"a": 1', b'"a": 10'), "application/json").request_body_truncated is True
