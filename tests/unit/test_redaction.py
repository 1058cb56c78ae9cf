"""What is a secret (rules/redaction.py), as tables; the account and the identity that secrets give an intent; and a
property test: random JSON documents with secret fields never store a secret value, and two documents that
differ only in a secret value are two intents."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_addon.config import parse_config
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules import redaction
from proxy_addon.rules.account import ANONYMOUS, AccountHasher
from proxy_addon.rules.fingerprint import analyse_body, canonical_json, intent_fingerprint
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.redaction import REDACTED, SecretFields, SecretHeaders

HASHER = AccountHasher(b"k" * 32)


@pytest.mark.parametrize("name, secret, rotating", [
    ("Authorization", True, False),
    ("Proxy-Authorization", True, True),
    ("Cookie", True, True),
    ("Set-Cookie", True, True),
    ("x-goog-api-key", True, False),
    ("Ocp-Apim-Subscription-Key", True, False),
    ("PRIVATE-TOKEN", True, False),
    ("X-Shopify-Access-Token", True, False),
    ("X-Api-Key", True, False),
    ("X-Amz-Security-Token", True, False),
    ("X-Hub-Signature-256", True, False),
    ("X-Client-Secret", True, False),
    ("X-Credential", True, False),
    ("WWW-Authenticate", True, False),
    ("Mcp-Session-Id", True, True),
    ("X-CSRF-Token", True, True),
    ("X-XSRF-TOKEN", True, True),
    ("X-Request-Nonce", True, True),
    ("Idempotency-Key", False, False),
    ("X-Idempotency-Key", False, False),
    ("Content-Type", False, False),
    ("Accept", False, False),
    ("User-Agent", False, False),
    ("X-Request-Id", False, False),
])
def test_secret_headers(name, secret, rotating):
    assert redaction.is_secret_header(name) is secret
    assert redaction.is_secret_header(name.upper()) is secret
    assert redaction.is_rotating_header(name) is rotating
    assert redaction.counts_for_account(name) is (secret and not rotating)


def test_configured_headers_are_added():
    assert not redaction.is_secret_header("X-Tenant")
    assert redaction.is_secret_header("x-tenant", frozenset({"x-tenant"}))
    assert "X-Tenant" in SecretHeaders({"x-tenant"}) and "Authorization" in SecretHeaders() and "Accept" not in SecretHeaders()


@pytest.mark.parametrize("name, secret, rotating", [
    ("password", True, False), ("Password", True, False), ("new_password", True, False), ("passwd", True, False),
    ("client_secret", True, False), ("clientSecret", True, False), ("refresh_token", True, False),
    ("access_token", True, False), ("accessToken", True, False), ("private_key", True, False),
    ("privateKey", True, False), ("apiKey", True, False), ("api_key", True, False), ("API-KEY", True, False),
    ("card_number", True, False), ("cardNumber", True, False), ("cvc", True, False), ("cvv", True, False),
    ("card_cvc", True, False), ("credentials", True, False), ("signature", True, False),
    ("key", True, False), ("KEY", True, False), ("sig", True, False), ("pin", True, False),
    ("csrf_token", True, True), ("_csrf", True, True), ("nonce", True, True), ("session_id", True, True),
    ("xsrf", True, True),
    ("keys", False, False), ("monkey", False, False), ("pinned", False, False), ("signal", False, False),
    ("title", False, False), ("id", False, False), ("author", False, False), ("spinach", False, False),
])
def test_secret_fields(name, secret, rotating):
    assert redaction.is_secret_field(name) is secret
    assert redaction.is_rotating_field(name) is rotating


def test_configured_fields_compare_like_the_built_in_ones():
    assert not redaction.is_secret_field("ssn")
    fields = SecretFields({"social_security"})
    assert "SocialSecurity" in fields and "social-security" in fields and "password" in fields and "title" not in fields


def test_documents_pairs_and_urls():
    doc = {"a": 1, "user": {"Password": "p", "list": [{"client_secret": "s"}, {"ok": "v"}]}, "key": {"x": 1}}
    assert redaction.redact_document(doc) == {
        "a": 1, "user": {"Password": REDACTED, "list": [{"client_secret": REDACTED}, {"ok": "v"}]}, "key": REDACTED,
    }
    assert redaction.redact_document({"title": "t", "n": [1, 2]}) == {"title": "t", "n": [1, 2]}
    assert redaction.contains_secret_field(doc) and not redaction.contains_secret_field({"title": [{"n": 1}]})
    deep: object = "leaf"
    for _ in range(redaction.MAX_DEPTH + 5):
        deep = [deep]
    assert "leaf" not in json.dumps(redaction.redact_document(deep))  # too deep to look at: redacted whole
    assert redaction.redact_pairs([("key", "k"), ("q", "v")]) == [("key", REDACTED), ("q", "v")]
    url = redaction.redact_url("https://user:pw@api.example.com/x?access_token=t&page=2&sig=s")
    assert url == "https://[REDACTED]@api.example.com/x?access_token=%5BREDACTED%5D&page=2&sig=%5BREDACTED%5D"


@pytest.mark.parametrize("depth", [redaction.MAX_DEPTH - 1, redaction.MAX_DEPTH, redaction.MAX_DEPTH + 1])
def test_a_document_is_looked_at_down_to_max_depth_and_redacted_whole_below(depth):
    """A member at MAX_DEPTH levels of nesting is still read (kept, or redacted by its name); one level deeper,
    whatever is there is replaced whole, and counts as a secret."""
    def nested(inner: object) -> object:
        for _ in range(depth):
            inner = [inner]
        return inner

    looked_at = depth <= redaction.MAX_DEPTH
    plain, secret = nested({"title": "t"}), nested({"title": "t", "password": "p"})
    assert redaction.redact_document(plain) == (plain if looked_at else nested(REDACTED))
    assert redaction.redact_document(secret) == nested({"title": "t", "password": REDACTED} if looked_at else REDACTED)
    assert redaction.contains_secret_field(plain) is not looked_at and redaction.contains_secret_field(secret)


@pytest.mark.parametrize("text, gone, kept", [
    ("Bad HTTP request line: b'GET http://user:hunter2@127.0.0.1:1/x?access_token=tok123&page=2 HTTP/1.1'",
     ["hunter2", "tok123"], ["Bad HTTP request line", "page=2", "127.0.0.1:1/x"]),
    ("POST /x?client_secret=cs-1&sig=s-1 HTTP/1.1", ["cs-1", "s-1"], ["POST /x?client_secret="]),
    ("Authorization: Bearer abc-123", ["abc-123"], ["Authorization:"]),
    ("header x-goog-api-key: g-1 refused", ["g-1"], ["x-goog-api-key"]),
    ("api_key=ak-1 status=200", ["ak-1"], ["status=200"]),
    ("[Errno 111] Connect call failed ('127.0.0.1', 1)", [], ["('127.0.0.1', 1)"]),
    ("KeyError: 'x'", [], ["KeyError: 'x'"]),
])
def test_scrub_text(text, gone, kept):
    out = redaction.scrub_text(text)
    for value in gone:
        assert value not in out, out
    for value in kept:
        assert value in out, out


def test_error_text_drops_the_data_an_error_quotes():
    """h11 quotes the header value it refused: the error may name the header, never show its value."""
    assert redaction.error_text("LocalProtocolError: Illegal header value b'Bearer s3cr3t\\x01'") == (
        "LocalProtocolError: Illegal header value [REDACTED]"
    )
    assert redaction.error_text(None) is None
    assert redaction.error_text("read timeout (10s)") == "read timeout (10s)"


# -- identity and account -----------------------------------------------------------------------------------

KEY_HEADERS = ["x-goog-api-key", "Ocp-Apim-Subscription-Key", "PRIVATE-TOKEN", "X-Shopify-Access-Token", "Authorization"]


@pytest.mark.parametrize("header", KEY_HEADERS)
def test_every_non_rotating_secret_header_names_the_account(header):
    a = HASHER.account_of([(header, "tenant-a")])
    b = HASHER.account_of([(header, "tenant-b")])
    assert a != b and a.startswith("acct:") and "tenant" not in a


@pytest.mark.parametrize("header", ["Cookie", "Proxy-Authorization", "Mcp-Session-Id", "X-Csrf-Token"])
def test_rotating_headers_name_no_account(header):
    assert HASHER.account_of([(header, "v1")]) == HASHER.account_of([(header, "v2")]) == ANONYMOUS
    same = HASHER.account_of([("Authorization", "a"), (header, "v1")])
    assert same == HASHER.account_of([("Authorization", "a"), (header, "v2")])


def _facts(body: bytes, headers=(), query=(), ct="application/json") -> RequestFacts:
    return RequestFacts("POST", "https", "api.example.com", 443, "/login", list(query), [("Content-Type", ct), *headers], ct, body)


POLICY = parse_config("defaults: {redact_fields: [ssn]}").policy_for("api.example.com", 443)


def intent_of(facts: RequestFacts):
    return build_intent(facts, POLICY, HASHER, "inst", 65536, None, "op_x")[0]


def test_a_login_with_another_password_is_another_intent():
    right = intent_of(_facts(b'{"user": "ann", "password": "right-one"}'))
    wrong = intent_of(_facts(b'{"user": "ann", "password": "wrong-one"}'))
    assert right.intent_fingerprint != wrong.intent_fingerprint
    assert right.request_body == wrong.request_body == b'{"password":"[REDACTED]","user":"ann"}'


def test_a_rotating_field_counts_for_nothing():
    a = intent_of(_facts(b"title=t&csrf_token=one", ct="application/x-www-form-urlencoded"))
    b = intent_of(_facts(b"title=t&csrf_token=two", ct="application/x-www-form-urlencoded"))
    assert a.intent_fingerprint == b.intent_fingerprint


def test_secret_query_parameters_count_through_the_key():
    a = intent_of(_facts(b"{}", query=[("access_token", "one"), ("page", "1")]))
    b = intent_of(_facts(b"{}", query=[("access_token", "two"), ("page", "1")]))
    assert a.intent_fingerprint != b.intent_fingerprint
    assert a.query == b.query == "access_token=%5BREDACTED%5D&page=1"


def test_a_hosts_own_idempotency_key_header_names_no_account():
    policy = parse_config("defaults: {idempotency_key_header: X-Request-Key}").policy_for("api.example.com", 443)
    a, b = (
        build_intent(_facts(b"{}", headers=[("X-Request-Key", key), ("Authorization", "a")]), policy, HASHER, "i", 100, key, "op")[0]
        for key in ("k1", "k2")
    )
    assert a.account == b.account and a.intent_fingerprint == b.intent_fingerprint  # a retry with a fresh key is refused


def test_two_tenants_with_the_same_body_are_two_accounts():
    a = intent_of(_facts(b'{"x": 1}', headers=[("x-goog-api-key", "tenant-a")]))
    b = intent_of(_facts(b'{"x": 1}', headers=[("x-goog-api-key", "tenant-b")]))
    assert a.account != b.account
    assert a.request_headers["x-goog-api-key"] == REDACTED


# -- property: random documents with secret fields --------------------------------------------------------

SECRET_NAMES = ["password", "client_secret", "refresh_token", "access_token", "private_key", "apiKey", "card_number",
                "cvc", "key", "pin", "X-Api-Key", "ssn"]
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda n: not redaction.is_secret_field(n, frozenset({"ssn"}))
)
scalars = st.none() | st.booleans() | st.integers(-10**40, 10**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(
    alphabet="abcdefghij XYZ", max_size=10
)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3), max_leaves=10)
secret_values = st.text(alphabet="0123456789abcdef", min_size=8, max_size=16).map(lambda h: f"~secret~{h}~")


@st.composite
def with_secret(draw):
    """(a document, the path of a dict in it where a secret field goes, the field's name)."""
    doc = draw(st.dictionaries(names, documents, max_size=4))
    holders = [[]]

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, dict):
                    holders.append([*path, k])
                walk(v, [*path, k])
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, dict):
                    holders.append([*path, i])
                walk(v, [*path, i])

    walk(doc, [])
    return doc, draw(st.sampled_from(holders)), draw(st.sampled_from(SECRET_NAMES))


def planted(doc, path, name, value):
    doc = json.loads(json.dumps(doc))
    holder = doc
    for step in path:
        holder = holder[step]
    holder[name] = value
    return doc


@settings(max_examples=300, deadline=None, database=None)
@given(case=with_secret(), value=secret_values, other=secret_values, shape=st.sampled_from(["plain", "list", "object"]))
def test_random_documents_never_store_a_secret_and_their_secrets_count(case, value, other, shape):
    doc, path, name = case
    wrap = {"plain": lambda v: v, "list": lambda v: [v, 1], "object": lambda v: {"inner": v}}[shape]
    first = json.dumps(planted(doc, path, name, wrap(value))).encode()
    second = json.dumps(planted(doc, path, name, wrap(other))).encode()
    a, b = analyse_body("application/json", first, POLICY.redact_fields, keyed=HASHER.digest), analyse_body(
        "application/json", second, POLICY.redact_fields, keyed=HASHER.digest
    )
    assert a.kind == "json"
    for body in (a, b):
        text = body.stored.decode() + canonical_json(body.identity)
        assert "~secret~" not in text
    target = ("POST", "api.example.com", 443, "/x", [])
    assert (intent_fingerprint(*target, a) == intent_fingerprint(*target, b)) is (value == other)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", intent_fingerprint(*target, a))


# -- errors and the log -------------------------------------------------------------------------------------


def test_the_senders_error_becomes_the_receipts_without_the_data_it_quotes():
    """One place turns the sender's error text into the receipt's error (verdicts.send_verdict)."""
    from proxy_addon.request.sender import SendEnd, SendResult
    from proxy_addon.rules.verdicts import send_verdict

    for end in (SendEnd.NOT_SENT, SendEnd.RESET):
        result = SendResult(end, error="LocalProtocolError: Illegal header value b'Bearer s3cr3t-6d1\\x00'")
        verdict = send_verdict(result, POLICY, None)
        assert "s3cr3t-6d1" not in verdict.error_message and "Illegal header value" in verdict.error_message
    url = SendResult(SendEnd.NOT_SENT, error="ValueError: no host in 'http://user:pw-6d1@/x?access_token=t-6d1'")
    assert "6d1" not in send_verdict(url, POLICY, None).error_message


def test_structlog_lines_are_scrubbed():
    import io

    from proxy_addon.log import configure_logging, get_logger

    stream = io.StringIO()
    configure_logging("info", "json", stream)
    try:
        get_logger("receipts.test").error("failed", error="Authorization: Bearer tok-5e2", url="http://u:pw-5e2@h/?key=k-5e2")
    finally:
        configure_logging("info", "json")
    line = json.loads(stream.getvalue())
    assert "5e2" not in stream.getvalue() and line["event"] == "failed" and "Authorization" in line["error"]


# -- the protocols' own identities: GraphQL literals and variables, MCP tool arguments ------------------------


def _protocol_intent(body: dict, path: str):
    from dataclasses import replace as replaced

    from proxy_addon.protocols import routing

    config = parse_config("")
    raw = json.dumps(body).encode()
    f = RequestFacts("POST", "https", "api.example.com", 443, path, [], [("Content-Type", "application/json")],
                     "application/json", raw)
    f = replaced(f, call=routing.recognise(f, config))
    return build_intent(f, config.policy_for("api.example.com", 443), HASHER, "i", 65536, None, "op")[0]


@pytest.mark.parametrize("make", [
    lambda pw: ({"query": f'mutation {{ login(user: "u", password: "{pw}") {{ ok }} }}'}, "/graphql"),
    lambda pw: ({"query": "mutation L($p: String!) { login(user: \"u\", password: $p) { ok } }", "variables": {"p": "x", "password": pw}},
                "/graphql"),
    lambda pw: ({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": "login", "arguments": {"user": "u", "client_secret": pw}}}, "/mcp"),
])
def test_protocol_secrets_count_through_the_key_and_are_never_stored(make):
    right, wrong = (_protocol_intent(*make(pw)) for pw in ("right-pw-3b1", "wrong-pw-3b1"))
    assert right.intent_fingerprint != wrong.intent_fingerprint
    assert right.intent_fingerprint == _protocol_intent(*make("right-pw-3b1")).intent_fingerprint
    assert b"pw-3b1" not in (right.request_body or b"") and right.operation.split()[0] in ("graphql", "mcp")
