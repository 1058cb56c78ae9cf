"""Bad input, generated: the pure decisions never raise and never keep a secret, config files fail in one
line, and a real proxy fed generated requests never crashes and never forwards without a receipt.

Pure level: fingerprint.analyse_body / intent_fingerprint / journal.build_intent over arbitrary bytes,
content types, header lists, paths and queries; canonical JSON under key reordering and whitespace;
config.parse_config over generated YAML documents and broken text.

Through the proxy: one in-process proxy per database (SQLite file, PostgreSQL) for the module, with a real
upstream that records what it received. The upstream host has `inject_idempotency_key`, so every request it
received names the receipt it was sent under (the agent's own key, or the operation id).
"""

import json
import os
import re
import string
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from support.e2e import PROBLEM_JSON, migrate, open_store, pg_database, proxy_client, settled
from support.proxy import start_inprocess_proxy
from support.upstream import start_upstream

from faults.invariants import SUMMARY, ScenarioRow
from proxy_addon.config import DEFAULT_REDACT_FIELDS, ReceiptsConfig, parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.fingerprint import analyse_body, intent_fingerprint
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.redaction import REDACTED
from proxy_addon.rules.states import State
from proxy_addon.store.receipts import receipts, transitions

FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")
PURE = settings(max_examples=250, deadline=None, database=None)
SECRET_HEADERS = ("Authorization", "Cookie", "Proxy-Authorization", "X-Api-Key", "Api-Key", "X-Auth-Token", "X-Custom-Token")
SECRET_FIELDS = (*DEFAULT_REDACT_FIELDS, "client_secret")
CONTENT_TYPES = (
    None, "", "application/json", "application/json; charset=utf-8", "application/vnd.api+json", "APPLICATION/JSON",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=zzz", "multipart/form-data",
    "text/plain", "application/octet-stream", "application/xml", ";;;", "application/json;", "\u00e9/\u00e9",
)
POLICY_CONFIG = parse_config(
    yaml.safe_dump(
        {
            "defaults": {"redact_headers": ["X-Custom-Token"], "redact_fields": [*DEFAULT_REDACT_FIELDS, "client_secret"]},
            "hosts": {
                "api.example.com": {
                    "operations": [
                        {"name": "articles.create", "method": "POST", "path": "/api/articles",
                         "fingerprint": {"fields": ["$.title", "$.body_markdown"]}},
                        {"name": "articles.update", "method": "PUT", "path": "/api/articles/{id}",
                         "fingerprint": {"exclude": ["$.updated_at"]}},
                    ]
                }
            },
        }
    )
)
HASHER = AccountHasher(b"k" * 32)

# -- generators -----------------------------------------------------------------------------------------------

# A secret contains "~", which no other generated text does: finding "~" in stored bytes means a leak.
_PLAIN = string.ascii_letters + string.digits + " _.,:;!?'\"()[]{}<>@#$%^*+=|\\/-\u00e9\u4e2d\U0001f600\t\n"
plain_text = st.text(alphabet=_PLAIN, max_size=20)
secrets = st.builds(lambda h: f"~s3cr3t~{h}~", st.text(alphabet="0123456789abcdef", min_size=6, max_size=12))
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | plain_text
json_docs = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def secret_json(draw):
    """A JSON document with secret fields (any case) holding secrets, at any depth, beside ordinary data."""
    planted: list[str] = []

    def plant(doc, depth=0):
        if isinstance(doc, dict) or depth == 0:
            doc = dict(doc) if isinstance(doc, dict) else {"data": doc}
            if draw(st.booleans()) or depth == 0:
                field = draw(st.sampled_from(SECRET_FIELDS))
                field = draw(st.sampled_from([field, field.upper(), field.title()]))
                value = draw(secrets)
                planted.append(value)
                doc[field] = draw(st.sampled_from([value, [value], {"inner": value}]))
            for k in list(doc)[:3]:
                if isinstance(doc[k], dict | list) and str(k).lower() not in SECRET_FIELDS:
                    doc[k] = plant(doc[k], depth + 1)
            return doc
        if isinstance(doc, list):
            return [plant(v, depth + 1) if isinstance(v, dict | list) else v for v in doc]
        return doc

    return plant(draw(json_docs)), planted


@st.composite
def secret_bodies(draw):
    """(content type, body bytes, secrets in it) for the structured kinds whose secret fields can be found."""
    kind = draw(st.sampled_from(["json", "undeclared_json", "form", "multipart"]))
    if kind in ("json", "undeclared_json"):
        doc, planted = draw(secret_json())
        body = json.dumps(doc, indent=draw(st.sampled_from([None, 2]))).encode()
        # declared JSON, or JSON under another type (text/plain, or a form as `curl -d` labels it)
        labels = st.sampled_from([c for c in CONTENT_TYPES if c and not c.startswith("multipart")]) | st.text(max_size=20)
        ct = draw(labels.filter(lambda c: not c.strip().lower().startswith("multipart"))) if kind == "json" else None
        return ct, body, planted
    pairs = draw(st.lists(st.tuples(plain_text, plain_text), max_size=4))
    value = draw(secrets)
    pairs.insert(draw(st.integers(0, len(pairs))), (draw(st.sampled_from(SECRET_FIELDS)), value))
    if kind == "form":
        return "application/x-www-form-urlencoded", urlencode(pairs).encode(), [value]
    parts = b"".join(
        b"--zzz\r\nContent-Disposition: form-data; name=\"" + quote(k).encode() + b"\"\r\n\r\n" + v.encode() + b"\r\n"
        for k, v in pairs
    )
    return "multipart/form-data; boundary=zzz", parts + b"--zzz--\r\n", [value]


header_names = st.text(alphabet=string.ascii_letters + string.digits + "-_!#$&'*+.^`|~", min_size=1, max_size=20)
header_values = st.text(alphabet=string.printable + "\u00e9\u00ff\x00\x7f", max_size=40)
headers_lists = st.lists(st.tuples(header_names | st.sampled_from(SECRET_HEADERS), header_values), max_size=8)
paths = st.text(min_size=0, max_size=40).map(lambda s: "/" + s)
queries = st.lists(st.tuples(plain_text | st.sampled_from(SECRET_FIELDS), plain_text), max_size=4)


def facts(method, path, query, headers, content_type, body) -> RequestFacts:
    return RequestFacts(method=method, scheme="https", host="api.example.com", port=443, path=path, query=query,
                        headers=headers, content_type=content_type, body=body)


def stored_text(intent) -> str:
    """Everything of an intent that goes into the receipts table, as one text to search."""
    return "\n".join([
        (intent.request_body or b"").decode("utf-8", "surrogateescape"),
        json.dumps(intent.request_headers, ensure_ascii=False),
        intent.query or "",
        intent.operation,
        intent.account,
        intent.body_note or "",
    ])


# -- pure: fingerprint and intent -----------------------------------------------------------------------------


@PURE
@given(
    ct=st.sampled_from(CONTENT_TYPES) | st.text(max_size=30),
    body=st.binary(max_size=300) | json_docs.map(lambda d: json.dumps(d).encode()),
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE", "post"]),
    host=st.text(max_size=20),
    port=st.integers(0, 65535),
    path=paths,
    query=st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=4),
)
def test_analyse_body_and_fingerprint_never_raise(ct, body, method, host, port, path, query):
    identity = analyse_body(ct, body, frozenset(SECRET_FIELDS))
    assert identity.kind in {"json", "form", "multipart", "bytes", "empty"}
    assert isinstance(identity.stored, bytes)
    assert FINGERPRINT.match(intent_fingerprint(method, host, port, path, query, identity))


@PURE
@given(
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]),
    path=paths | st.sampled_from(["/api/articles", "/api/articles/7", "/api/articles/7/"]),
    query=queries,
    headers=headers_lists,
    ct=st.sampled_from(CONTENT_TYPES) | st.text(max_size=30),
    body=st.binary(max_size=300),
    cap=st.integers(0, 400),
    key=st.none() | st.text(max_size=40),
)
def test_build_intent_never_raises_on_arbitrary_requests(method, path, query, headers, ct, body, cap, key):
    policy = POLICY_CONFIG.policy_for("api.example.com", 443)
    intent, _rule = build_intent(facts(method, path, query, headers, ct, body), policy, HASHER, "inst", cap, key, "op_x")
    assert FINGERPRINT.match(intent.intent_fingerprint)
    assert intent.request_body is None or len(intent.request_body) <= cap
    assert intent.request_body_size == len(body)
    assert intent.account == "anonymous" or re.fullmatch(r"acct:[0-9a-f]{40}", intent.account)


@PURE
@given(
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]),
    path=paths | st.sampled_from(["/api/articles", "/api/articles/7"]),
    body=secret_bodies(),
    secret_headers=st.lists(st.tuples(st.sampled_from(SECRET_HEADERS), secrets), min_size=1, max_size=3),
    other_headers=st.lists(st.tuples(header_names, plain_text), max_size=4),
    query_secret=secrets,
    query=st.lists(st.tuples(plain_text, plain_text), max_size=3),
    case=st.sampled_from([str.lower, str.upper, str.title]),
)
def test_secrets_are_never_in_what_is_stored(method, path, body, secret_headers, other_headers, query_secret, query, case):
    ct, raw, _planted = body
    headers = [*other_headers, *[(case(n), v) for n, v in secret_headers]]
    if ct is not None:
        headers.append(("Content-Type", ct))
    query = [*query, (case("token"), query_secret)]
    policy = POLICY_CONFIG.policy_for("api.example.com", 443)
    intent, _ = build_intent(facts(method, path, query, headers, ct, raw), policy, HASHER, "inst", 1 << 20, None, "op_x")
    text = stored_text(intent)
    assert "~s3cr3t~" not in text, text
    if any(n.lower() not in ("cookie", "proxy-authorization") for n, _ in secret_headers):
        assert intent.account.startswith("acct:")  # the credentials still name an account, by a keyed hash
    for name, _ in secret_headers:
        assert intent.request_headers[name.lower()].split(", ")[-1] == REDACTED


def _reorder(doc, rnd):
    if isinstance(doc, dict):
        items = [(k, _reorder(v, rnd)) for k, v in doc.items()]
        rnd.shuffle(items)
        return dict(items)
    if isinstance(doc, list):
        return [_reorder(v, rnd) for v in doc]
    return doc


@PURE
@given(
    doc=json_docs,
    rnd=st.randoms(use_true_random=False),
    indent=st.sampled_from([None, 0, 1, 4, "\t"]),
    separators=st.sampled_from([None, (",", ":"), (" , ", " : ")]),
    padding=st.sampled_from(["", " ", "\n", "\r\n\t "]),
    ct=st.sampled_from(["application/json", "application/vnd.x+json", None]),
)
def test_canonical_json_ignores_key_order_and_whitespace(doc, rnd, indent, separators, padding, ct):
    assume(ct is not None or isinstance(doc, dict | list))  # undeclared bodies are sniffed as JSON from { or [
    compact = json.dumps(doc, separators=(",", ":")).encode()
    other = (padding + json.dumps(_reorder(doc, rnd), indent=indent, separators=separators) + padding).encode()
    a = analyse_body(ct, compact, frozenset(SECRET_FIELDS))
    b = analyse_body(ct, other, frozenset(SECRET_FIELDS))
    assert a.kind == b.kind == "json"
    assert a.stored == b.stored
    target = ("POST", "api.example.com", 443, "/x", [])
    assert intent_fingerprint(*target, a) == intent_fingerprint(*target, b)


# what the fuzzing found, kept as plain examples
@pytest.mark.parametrize(("ct", "body"), [
    ("application/x-www-form-urlencoded", b'{"user": "a=1", "password": "~s3cr3t~curl~"}'),  # `curl -d '{...}'`
    ("text/plain", b'{"password": "~s3cr3t~text~"}'),
    ("application/octet-stream", b'[{"token": "~s3cr3t~bin~"}]'),
])
def test_json_under_another_content_type_is_redacted(ct, body):
    identity = analyse_body(ct, body, frozenset(SECRET_FIELDS))
    assert identity.kind == "json" and b"~s3cr3t~" not in identity.stored


@pytest.mark.parametrize(("text", "key"), [
    ("defaults: {upstream_timeout: .inf}", "defaults.upstream_timeout"),
    ("defaults: {after_success: {window: .nan}}", "defaults.after_success.window"),
    ("reconcile: {lease: 99999999d}", "reconcile.lease"),
    ("proxy: {heartbeat_interval: 100000000000000000000000000000000000000000}", "proxy.heartbeat_interval"),
    ('"a\\nb": 1', "unknown key"),
])
def test_found_config_errors_are_one_line(text, key):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="found.yaml")
    assert key in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- pure: config files ---------------------------------------------------------------------------------------

durations = st.sampled_from(["30s", "15m", "1.5h", "500ms", "2d", "0s", "5x", "-1s", "s", "", "1 h", "10", "ten"]) | (
    st.integers(-5, 10**6) | st.floats() | st.sampled_from([float("inf"), float("-inf"), float("nan")])
)
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
VALID_DOCUMENT = {
    "database": {"url": "sqlite:///receipts.db"},
    "defaults": {
        "upstream_timeout": "30s", "connect_timeout": "10s", "unknown_statuses": [500, 502],
        "after_success": {"policy": "replay", "window": "15m"}, "redact_headers": ["X-Custom-Token"],
        "redact_fields": ["password", "token"], "inject_idempotency_key": False, "idempotency_key_header": "Idempotency-Key",
    },
    "hosts": {
        "api.example.com": {
            "upstream_timeout": "10s",
            "operations": [
                {
                    "name": "articles.create", "method": "POST", "path": "/api/articles/{id}",
                    "fingerprint": {"fields": ["$.title"]}, "external_id": "$.id", "retry_safe": True,
                    "reconcile": {
                        "strategy": "search", "url": "{scheme}://{netloc}/api/articles?q={path.id}",
                        "headers": {"Authorization": "Bearer ${KEY}"}, "items": "$.items", "match": {"$.title": "$.title"},
                        "id": "$.id", "settle": "30s", "attempts": 3, "absent_means": "safe_to_retry", "timeout": "5s",
                    },
                }
            ],
        },
        "api.example.com:8443": {"after_success": {"policy": "allow", "window": 0}},
    },
    "proxy": {"methods": ["POST", "DELETE"], "fail_open": False, "max_stored_body": "64KiB", "heartbeat_interval": "5s",
              "instance_dead_after": "15s", "database_threads": 4},
    "reconcile": {"interval": "10s", "lease": "60s", "concurrency": 2, "per_host_rate": 5.0, "batch_size": 10, "backoff": "5s"},
    "admin": {"enabled": False, "listen_host": "127.0.0.1", "listen_port": 8081, "token_env": "RECEIPTS_ADMIN_TOKEN"},
    "logging": {"level": "info", "format": "json"},
    "secret_file": ".receipts-secret",
}


def _places(doc, at=()):
    """Every (path of keys/indexes) in a document, inner nodes included."""
    found = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _places(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += _places(v, (*at, i))
    return found


@st.composite
def documents(draw):
    """The valid document with a few mutations: a value replaced (wrong type, bad duration, junk), a key
    added or removed. Most mutations break it in one place, so the error has one place to name."""
    import copy

    doc = copy.deepcopy(VALID_DOCUMENT)
    for _ in range(draw(st.integers(0, 3))):
        places = _places(doc)
        where = draw(st.sampled_from(places[1:])) if len(places) > 1 else ()
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        how = draw(st.sampled_from(["replace", "duration", "add", "delete"]))
        if not where or not isinstance(parent, dict | list):
            continue
        if how == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(anything)
        else:
            parent[where[-1]] = draw(durations if how == "duration" else anything | durations)
    return doc


def _durations_of(config: ReceiptsConfig) -> list[float]:
    found = [config.defaults.upstream_timeout, config.defaults.connect_timeout, config.defaults.after_success.window,
             config.proxy.heartbeat_interval, config.proxy.instance_dead_after, config.reconcile.interval,
             config.reconcile.lease, config.reconcile.backoff]
    for host in config.hosts.values():
        found += [v for v in (host.upstream_timeout, host.connect_timeout) if v is not None]
        for op in host.operations:
            if op.reconcile:
                found += [op.reconcile.settle, op.reconcile.timeout]
    return found


def check_config_text(text: str) -> None:
    try:
        config = parse_config(text, source="fuzz.yaml")
    except ConfigError as e:
        message = str(e)
        assert message.startswith("fuzz.yaml: ") and "\n" not in message and "Traceback" not in message, message
        return
    assert isinstance(config, ReceiptsConfig)
    now = datetime.now(UTC)
    for seconds in _durations_of(config):  # a duration accepted is one the clock arithmetic can use
        assert seconds >= 0, f"accepted duration {seconds!r}"
        assert now - timedelta(seconds=seconds) <= now <= now + timedelta(seconds=seconds)


@settings(max_examples=300, deadline=None, database=None)
@given(doc=documents() | anything)
def test_generated_config_documents_load_or_fail_in_one_line(doc, monkeypatch_env):
    check_config_text(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=200, deadline=None, database=None)
@given(doc=documents(), cut=st.integers(0, 400), junk=st.text(alphabet=":-{}[]&*!|>'\"%@`#\n\t ,?", max_size=6))
def test_broken_config_text_fails_in_one_line(doc, cut, junk, monkeypatch_env):
    text = yaml.safe_dump(doc, allow_unicode=True)
    cut = min(cut, len(text))
    check_config_text(text[:cut] + junk + text[cut:])


@pytest.fixture(scope="module")
def monkeypatch_env():
    """No admin token in the environment, so the admin section's rule (a token off loopback) is exercised."""
    mp = pytest.MonkeyPatch()
    mp.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    yield
    mp.undo()


# -- through a real proxy -------------------------------------------------------------------------------------

SENT_STATES = {State.SUBMITTED, State.SUCCEEDED, State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW,
               State.SAFE_TO_RETRY}
ROUTES = ("/fuzz", "/fuzz", "/fuzz", "/status/404", "/status/500", "/status/200", "/reset", "/location")
_PCHAR = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@"
segments = st.lists(
    st.text(alphabet=_PCHAR, max_size=8) | st.text(max_size=4).map(lambda s: quote(s, safe="")), max_size=4
)
url_queries = st.none() | st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=3).map(urlencode)
# what a client may put in a header value: visible ASCII and obs-text, spaces and tabs inside
wire_values = st.binary(max_size=30).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128).strip(b" \t")
)
FRAMING = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te", "trailer",
           "keep-alive", "proxy-connection", "proxy-authorization", "idempotency-key"}
wire_headers = st.lists(
    st.tuples(header_names.filter(lambda n: n.lower() not in FRAMING)
              | st.sampled_from(["Authorization", "Cookie", "X-Api-Key", "X-Custom-Token", "Content-Encoding"]),
              wire_values),
    max_size=6,
)
# an agent's own Idempotency-Key (kept apart: the upstream must see exactly the key the receipt holds)
_keys = st.text(alphabet=string.ascii_letters + string.digits + "-_.:", min_size=1, max_size=20)
agent_keys = st.one_of(  # mostly none; a fresh key; or a short one that hypothesis repeats (a key reused)
    st.none(), st.none(), st.none(), st.builds(lambda k, u: f"{k}-{u.hex}", _keys, st.uuids()), _keys
)
# (content type, body): anything under any type, or secrets in a body whose fields can be found
wire_bodies = st.tuples(
    st.sampled_from([c for c in CONTENT_TYPES if c is not None and c.isascii()]) | st.none(),
    st.binary(max_size=400) | json_docs.map(lambda d: json.dumps(d).encode()),
) | secret_bodies().filter(lambda t: t[0] is None or t[0].isascii()).map(lambda t: t[:2])
wire_secret_headers = st.lists(
    st.tuples(st.sampled_from(["Authorization", "Cookie", "X-Api-Key", "X-Custom-Token", "Api-Key"]), secrets), max_size=2
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_proxy(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp / 'receipts.db'}"
        else:
            url = stack.enter_context(pg_database(request.getfixturevalue("pg_server")))
        migrate(url)
        upstream = start_upstream()
        stack.callback(upstream.stop)
        config = tmp / "config.yaml"
        config.write_text(
            f"secret_file: {tmp / 'secret'}\n"
            "logging: {level: error}\n"
            "defaults: {upstream_timeout: 5s, connect_timeout: 2s, redact_headers: [X-Custom-Token],\n"
            f"  redact_fields: {json.dumps(list(SECRET_FIELDS))}}}\n"
            f'hosts:\n  "127.0.0.1:{upstream.port}": {{inject_idempotency_key: true}}\n'
        )
        proxy = start_inprocess_proxy(config, url, tmp / "confdir")
        stack.callback(proxy.stop)
        client = stack.enter_context(proxy_client(proxy.url, timeout=20.0))
        store = stack.enter_context(open_store(url))
        sent = [0]
        yield upstream, store, client, sent
        forwarded, journaled = _forwarded(upstream), _sent_receipts(store)
        with store.engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(receipts)).scalar_one()
        lost = sum(max(0, n - journaled.get(k, 0)) for k, n in forwarded.items())
        duplicates = len(_open_overlaps(store))
        SUMMARY.add(ScenarioRow(f"fuzzed requests through a proxy ({request.param})", sent=sent[0],
                                received=sum(forwarded.values()), receipts=count, duplicates=duplicates, lost=lost,
                                ok=lost == 0 and duplicates == 0))


def _forwarded(upstream) -> dict[str | None, int]:
    """Idempotency key -> how many writes the upstream received with it."""
    forwarded: dict[str | None, int] = {}
    with upstream.lock:
        for rec in upstream.received:
            if rec.method != "GET":
                forwarded[rec.headers.get("idempotency-key")] = forwarded.get(rec.headers.get("idempotency-key"), 0) + 1
    return forwarded


def _open_overlaps(store) -> list[tuple[str, str]]:
    """Pairs of receipts of one intent (account, fingerprint) where the later one was created while the
    earlier one was still open: a second forward of an open intent."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(receipts.c.operation_id, receipts.c.account, receipts.c.intent_fingerprint, receipts.c.created_at,
                   receipts.c.completed_at).order_by(receipts.c.created_at)
        ).all()
    last: dict[tuple[str, str], object] = {}
    overlaps = []
    for r in rows:
        before = last.get((r.account, r.intent_fingerprint))
        if before is not None and (before.completed_at is None or before.completed_at > r.created_at):
            overlaps.append((before.operation_id, r.operation_id))
        last[(r.account, r.intent_fingerprint)] = r
    return overlaps


def _unsettled(store) -> list[str]:
    with store.engine.connect() as conn:
        return list(conn.execute(
            select(receipts.c.operation_id).where(receipts.c.state.in_([State.PLANNED.value, State.SUBMITTED.value]))
        ).scalars())


def _sent_receipts(store) -> dict[str, int]:
    """Idempotency key -> how many receipts under it were sent (their state shows the upstream may have it)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(receipts.c.idempotency_key, receipts.c.state, receipts.c.status_code, func.count())
            .group_by(receipts.c.idempotency_key, receipts.c.state, receipts.c.status_code)
        ).all()
    sent: dict[str, int] = {}
    for key, state, status, n in rows:
        if State(state) in SENT_STATES or (state == State.REJECTED and status is not None):
            sent[key] = sent.get(key, 0) + n
    return sent


# what the upstream does on each route, as (state, error_code) of the receipt of a request sent there
EXPECTED = {
    "/fuzz": {(State.SUCCEEDED, None)},
    "/location": {(State.SUCCEEDED, None)},
    "/status/200": {(State.SUCCEEDED, None)},
    "/status/404": {(State.REJECTED, "upstream_status")},
    "/status/500": {(State.OUTCOME_UNKNOWN, "upstream_status")},
    "/reset": {(State.OUTCOME_UNKNOWN, "upstream_reset")},
}


def document_type(r: httpx.Response) -> str | None:
    if not r.headers.get("content-type", "").startswith(PROBLEM_JSON):
        return None
    return r.json().get("type", "").rpartition(":")[2]


def _stored_rows_text(store, since: datetime) -> str:
    """The receipts changed since `since` and their history, as one text to search (bytes shown by repr)."""
    changed = select(receipts.c.operation_id).where(receipts.c.updated_at >= since)
    with store.engine.connect() as conn:
        rows = [*conn.execute(select(receipts).where(receipts.c.updated_at >= since)),
                *conn.execute(select(transitions).where(transitions.c.operation_id.in_(changed)))]
    return "\n".join(repr(tuple(row)) for row in rows)


@settings(
    max_examples=int(os.environ.get("FUZZ_PROXY_EXAMPLES", "60")),  # more, to hunt: FUZZ_PROXY_EXAMPLES=1000
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]),
    route=st.sampled_from(ROUTES),
    segs=segments,
    query=url_queries,
    query_secret=st.none() | secrets,
    headers=wire_headers,
    secret_headers=wire_secret_headers,
    body=wire_bodies,
    agent_key=agent_keys,
)
def test_the_proxy_never_crashes_and_never_forwards_without_a_receipt(
    fuzz_proxy, method, route, segs, query, query_secret, headers, secret_headers, body, agent_key
):
    upstream, store, client, sent = fuzz_proxy
    started = datetime.now(UTC) - timedelta(seconds=1)
    ct, content = body
    if query_secret is not None:
        query = "&".join(q for q in (query, urlencode({"api_key": query_secret})) if q)
    url = upstream.base + route + "".join("/" + s for s in segs) + (f"?{query}" if query else "")
    sent_headers = [(n.encode(), v) for n, v in headers] + [(n.encode(), v.encode()) for n, v in secret_headers]
    if ct is not None:
        sent_headers.append((b"Content-Type", ct.encode()))
    if agent_key is not None:
        sent_headers.append((b"Idempotency-Key", agent_key.encode()))
    sent[0] += 1
    r = client.request(method, url, headers=sent_headers, content=content)
    event(f"{r.status_code} {r.headers.get('x-receipt-state', '-')}")

    problem = r.headers.get("content-type", "").startswith(PROBLEM_JSON)
    if "x-receipt-id" in r.headers:
        receipt = settled(store, r.headers["x-receipt-id"])  # the receipt it names exists, in the state it says
        assert r.headers.get("x-receipt-state") == receipt.state, (r.status_code, r.headers, receipt)
        forwarded = not problem and "x-receipt-replayed" not in r.headers  # the upstream's own answer
        fresh = forwarded or document_type(r) in ("outcome-unknown", "not-sent")
        if fresh:  # this request's own receipt: its verdict is what the upstream did
            assert (receipt.state, receipt.error_code) in EXPECTED[route], (route, receipt.state, receipt.error_message)
        if forwarded:
            assert receipt.state == (State.SUCCEEDED if 200 <= r.status_code < 300 else State.REJECTED)
            assert receipt.status_code == r.status_code
    else:
        assert problem, (r.status_code, r.headers, r.text[:300])
    if problem:
        document = r.json()
        assert document["type"].startswith("urn:agent-receipts:problem:") and document["detail"], document
        assert document["status"] == r.status_code

    control = client.get(upstream.base + "/control")  # the proxy still answers, and lets reads through
    assert control.status_code == 200 and "x-receipt-id" not in control.headers

    received = _forwarded(upstream)
    assert None not in received, "a request reached the upstream without a receipt's key"
    assert received == _sent_receipts(store)  # every write the upstream got has exactly one sent receipt
    assert _open_overlaps(store) == []  # no intent forwarded again while its receipt was open
    assert _unsettled(store) == []  # every request answered, so no receipt is left planned or submitted
    assert "~s3cr3t~" not in _stored_rows_text(store, started)
