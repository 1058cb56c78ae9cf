"""The intent fingerprint, body redaction, header redaction and account hashing, as parametrized tables."""

import hashlib
import json
import os
import re
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl

import pytest
from mitmproxy.net.http.multipart import encode_multipart
from pydantic import ValidationError
from support.bodies import binary

from proxy_addon.config import BUILTIN_SECRET_HEADERS, DEFAULT_REDACT_FIELDS
from proxy_addon.exceptions import ConfigError
from proxy_addon.rules.account import ANONYMOUS, SECRET_ENV, AccountHasher, load_or_create_key
from proxy_addon.rules.fingerprint import (
    MAX_CANONICAL_BODY,
    MAX_ITEMS,
    MAX_JSON_DEPTH,
    MAX_NUMBER_CHARS,
    analyse_body,
    canonical_json,
    intent_fingerprint,
)
from proxy_addon.rules.operations import FingerprintRule
from proxy_addon.rules.redaction import REDACTED, redact_headers

RF = frozenset(DEFAULT_REDACT_FIELDS)
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
FORMAT = re.compile(r"^sha256:[0-9a-f]{64}$")
BASE = {"method": "POST", "host": "api.example.com", "port": 443, "path": "/api/articles", "query": []}


def fingerprint(body: bytes = b"", ct: str | None = JSON, rule: FingerprintRule | None = None, **target) -> str:
    t = {**BASE, **target}
    return intent_fingerprint(t["method"], t["host"], t["port"], t["path"], t["query"], analyse_body(ct, body, RF, rule))


@pytest.mark.parametrize("a, b", [
    (b'{"a":1,"b":2}', b'{"b": 2, "a": 1}'),
    (b'{"n": 1}', b'{"n": 1.0}'),
    (b'{"n": 1}', b'{"n": 1e0}'),
    (b'{"n": 100}', b'{"n": 1E2}'),
    (b'{"n": 0.5}', b'{"n": 0.50}'),
    (b'{"n": 1e30}', b'{"n": 1000000000000000000000000000000}'),
    (b'{"x": {"b": [1, 2], "a": null}}', b'\n{ "x" : { "a" : null , "b" : [ 1 , 2.0 ] } }\n'),
    (b'{"s": "\\u00fc"}', '{"s": "ü"}'.encode()),
])
def test_equivalent_json_has_one_fingerprint(a, b):
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize("a, b", [
    (b'{"title": "Hello"}', b'{"title": "Hello!"}'),
    (b'{"n": 1}', b'{"n": "1"}'),
    (b'{"n": 1}', b'{"n": 1.5}'),
    (b'{"n": 0.3}', b'{"n": 0.30000000000000004}'),
    (b'{"a": true}', b'{"a": 1}'),
    (b'{"a": null}', b"{}"),
    (b'{"tags": ["a", "b"]}', b'{"tags": ["b", "a"]}'),
    (b'{"a": {"b": 1}}', b'{"a": {"b": 1, "c": 2}}'),
    (b"[1, 2]", b"[1, 2, 3]"),
])
def test_near_duplicate_payloads_differ(a, b):
    assert fingerprint(a) != fingerprint(b)


@pytest.mark.parametrize("change, same", [
    ({"method": "PUT"}, False),
    ({"method": "post"}, True),
    ({"host": "api.example.org"}, False),
    ({"host": "API.Example.COM"}, True),
    ({"port": 8443}, False),
    ({"path": "/api/articles/1"}, False),
    ({"path": "/API/articles"}, False),
    ({"query": [("draft", "1")]}, False),
])
def test_target_is_part_of_the_intent(change, same):
    body = b'{"title": "T"}'
    assert (fingerprint(body, **change) == fingerprint(body)) is same


def test_query_order_does_not_matter_but_values_do():
    assert fingerprint(query=[("a", "1"), ("b", "2")]) == fingerprint(query=[("b", "2"), ("a", "1")])
    assert fingerprint(query=[("a", "1")]) != fingerprint(query=[("a", "2")])


@pytest.mark.parametrize("body, ct", [
    (b'{"a": 1}', JSON), (b"a=1&b=2", FORM), (b"\x00\xff" * 10, "application/octet-stream"), (b"", None),
])
def test_format_is_sha256_hex(body, ct):
    assert FORMAT.match(fingerprint(body, ct))


@pytest.mark.parametrize("a, b, same", [
    (b"a=1&b=2", b"b=2&a=1", True),
    (b"a=hello+world", b"a=hello%20world", True),
    (b"a=1&b=", b"b=&a=1", True),
    (b"a=1", b"a=2", False),
    (b"a=1", b"a=1&b=2", False),
])
def test_form_pairs_are_sorted(a, b, same):
    assert (fingerprint(a, FORM) == fingerprint(b, FORM)) is same


def multipart(boundary: str, parts: list[tuple[bytes, bytes]]) -> tuple[str, bytes]:
    ct = f"multipart/form-data; boundary={boundary}"
    return ct, encode_multipart(ct, parts)


def test_multipart_ignores_the_boundary_and_redacts_secret_parts():
    a = multipart("AAAA", [(b"title", b"hi"), (b"file", b"\x89PNG..."), (b"password", b"hunter2")])
    b = multipart("zz-other-123", [(b"password", b"hunter2"), (b"title", b"hi"), (b"file", b"\x89PNG...")])
    c = multipart("AAAA", [(b"title", b"hi"), (b"file", b"\x89PNG!!!"), (b"password", b"hunter2")])
    d = multipart("AAAA", [(b"title", b"hi"), (b"file", b"\x89PNG..."), (b"password", b"other")])
    assert a[1] != b[1] and fingerprint(a[1], a[0]) == fingerprint(b[1], b[0])
    assert fingerprint(a[1], a[0]) != fingerprint(c[1], c[0])
    assert fingerprint(a[1], a[0]) != fingerprint(d[1], d[0])  # another password is another intent
    body = analyse_body(a[0], a[1], RF)
    assert body.kind == "multipart" and b"hunter2" not in body.stored
    assert ["password", REDACTED] in json.loads(body.stored)["multipart"]


def test_multipart_parts_are_identified_by_a_keyed_hmac_not_an_unsalted_digest():
    """An unsalted SHA-256 of a part is a brute-force away from a card number or a PIN; a keyed one is not."""
    card, pin = b"4111111111111111", b"1234"
    ct, raw = multipart("AAAA", [(b"card", card), (b"pin", pin)])
    body = analyse_body(ct, raw, RF)
    stored, identity = dict(json.loads(body.stored)["multipart"]), dict(body.identity)
    assert stored["pin"] == REDACTED and stored["card"].startswith("hmac:")  # a secret part: the marker alone
    assert identity["pin"].startswith("hmac:") and identity["card"] == stored["card"]
    # where a value could leak: as a part's value, or as its unsalted digest (a per-run key's hex digest may well
    # hold "1234" as a substring, so the digests are compared whole, never searched for the value's digits)
    for value in (card, pin):
        unsalted = hashlib.sha256(value).hexdigest()
        for digest in (*stored.values(), *identity.values()):
            assert digest not in (value.decode(), unsalted, "sha256:" + unsalted, "hmac:" + unsalted)
        assert unsalted not in body.stored.decode() + canonical_json(body.identity)  # 64 hex digits: never by chance
    key_a = analyse_body(ct, raw, RF, keyed=AccountHasher(b"a" * 32).digest)
    key_b = analyse_body(ct, raw, RF, keyed=AccountHasher(b"b" * 32).digest)
    assert key_a.identity != key_b.identity  # it depends on the key


SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize("document, where", [
    ({"password": SECRET, "title": "T"}, ["password"]),
    ({"user": {"Password": SECRET}}, ["user", "Password"]),
    ({"items": [{"id": 1}, {"token": SECRET}]}, ["items", 1, "token"]),
    ({"a": [[{"API_KEY": SECRET}]]}, ["a", 0, 0, "API_KEY"]),
    ({"secret": {"nested": SECRET, "n": 1}}, ["secret"]),
])
def test_secret_fields_are_redacted_at_any_depth(document, where):
    raw = json.dumps(document).encode()
    body = analyse_body(JSON, raw, RF)
    assert body.kind == "json" and b'"[REDACTED]"' in body.stored
    for text in (body.stored.decode(), canonical_json(body.identity), json.dumps(body.document)):
        assert SECRET not in text
    stored = json.loads(body.stored)
    for key in where:
        stored = stored[key]
    assert stored == REDACTED
    changed = raw.replace(SECRET.encode(), b"another-secret")
    assert fingerprint(raw) != fingerprint(changed)  # the secret counts for identity, through a keyed HMAC
    assert fingerprint(raw) == fingerprint(json.dumps(document, indent=2).encode())


def test_configured_redact_fields_and_forms():
    body = analyse_body(JSON, json.dumps({"ssn": SECRET, "password": SECRET, "title": "kept"}).encode(), frozenset({"ssn"}))
    assert json.loads(body.stored) == {"ssn": REDACTED, "password": REDACTED, "title": "kept"}  # built-in names too
    form = analyse_body(FORM, f"a=1&Password={SECRET}".encode(), RF)
    assert parse_qsl(form.stored.decode()) == [("a", "1"), ("Password", REDACTED)]
    assert SECRET not in form.stored.decode() and SECRET not in repr(form.identity)


@pytest.mark.parametrize("ct, body", [
    (JSON, f'{{"password": "{SECRET}",'.encode()),
    ("application/vnd.api+json", b"{not json"),
    (JSON, b'{"a": "\xff\xfe"}'),
    (JSON, b"[" * 100_000),
    (FORM, f"password={SECRET}&&&\xff".encode("latin-1")),
    ("multipart/form-data; boundary=a", b'--a\r\nContent-Disposition: form-data; name="password"\r\n' + SECRET.encode()),
])
def test_unparsable_structured_body_is_bytes_with_a_note_and_stored_redacted(ct, body):
    got = analyse_body(ct, body, RF)
    assert got.kind == "bytes" and got.note and "fingerprinted as bytes" in got.note
    assert got.identity["size"] == len(body) and got.identity["keyed"].startswith("hmac:")
    assert hashlib.sha256(body).hexdigest() not in repr(got.identity)  # a keyed digest: secrets in it cannot be guessed
    assert got.stored == REDACTED.encode()  # its secret fields cannot be found, so none of it is kept
    assert FORMAT.match(fingerprint(body, ct)) and fingerprint(body, ct) != fingerprint(body + b" ", ct)


@pytest.mark.parametrize("ct, body, kind", [
    ("application/octet-stream", bytes(range(256)) * 4, "bytes"),
    ("text/plain", b"caf\xe9 \xff\xfe", "bytes"),
    (None, b'{"looks": "like json"}', "json"),  # undeclared JSON is sniffed, so its secrets are redacted
    (JSON, b"", "empty"),
    (None, b"", "empty"),
    (JSON, json.dumps([{"i": i, "text": "x" * 100} for i in range(5_000)]).encode(), "json"),
    ("application/octet-stream", binary(5 * 1024 * 1024), "bytes"),  # far over MAX_CANONICAL_BODY, never JSON
])
def test_binary_empty_non_utf8_and_large_bodies(ct, body, kind):
    got = analyse_body(ct, body, RF)
    assert got.kind == kind
    if kind == "bytes":
        assert got.stored == body and got.identity["size"] == len(body)
    if kind == "empty":
        assert (got.identity, got.stored) == (None, b"")
    assert fingerprint(body, ct) == fingerprint(body, ct)
    assert (fingerprint(body, ct) == fingerprint(b"", ct)) is (kind == "empty")


ARTICLE = {"title": "T", "body_markdown": "B", "published_at": "2026-01-01", "client_ts": 1, "meta": {"trace": "x"}}


@pytest.mark.parametrize("rule, change, same", [
    ({"fields": ["$.title", "$.body_markdown"]}, {"published_at": "2027-01-01", "extra": 1}, True),
    ({"fields": ["$.title", "$.body_markdown"]}, {"title": "T2"}, False),
    ({"fields": ["$.title", "$.body_markdown"]}, {"body_markdown": None}, False),
    ({"exclude": ["$.client_ts", "$.meta.trace"]}, {"client_ts": 2, "meta": {"trace": "y"}}, True),
    ({"exclude": ["$.client_ts", "$.meta.trace"]}, {"title": "T2"}, False),
    ({"exclude": ["$.client_ts"]}, {"meta": {"trace": "y"}}, False),
])
def test_fingerprint_rule_allowlist_and_exclude(rule, change, same):
    r = FingerprintRule.model_validate(rule)
    a, b = json.dumps(ARTICLE).encode(), json.dumps({**ARTICLE, **change}).encode()
    assert (fingerprint(a, rule=r) == fingerprint(b, rule=r)) is same
    assert analyse_body(JSON, b, RF, r).stored == canonical_json({**ARTICLE, **change}).encode()  # all stored


def test_fingerprint_rule_takes_fields_or_exclude_not_both():
    with pytest.raises(ValidationError):
        FingerprintRule.model_validate({"fields": ["$.a"], "exclude": ["$.b"]})


def test_redact_headers_keeps_names_and_hides_values():
    secret_headers = frozenset([*BUILTIN_SECRET_HEADERS, "x-custom-token"])
    got = redact_headers([("Authorization", f"Bearer {SECRET}"), ("Content-Type", JSON), ("Cookie", SECRET),
                          ("X-Custom-Token", SECRET), ("Proxy-Authorization", SECRET), ("Accept", "a"),
                          ("accept", "b")], secret_headers)
    assert got == {"authorization": REDACTED, "content-type": JSON, "cookie": REDACTED, "x-custom-token": REDACTED,
                   "proxy-authorization": REDACTED, "accept": "a, b"}
    assert SECRET not in json.dumps(got)


CREDS = frozenset(BUILTIN_SECRET_HEADERS)
KEY = b"k" * 64


def account(headers: list[tuple[str, str]], key: bytes = KEY) -> str:
    return AccountHasher(key).account_of(headers, CREDS)


@pytest.mark.parametrize("a, b, same", [
    ([("Authorization", "Bearer one")], [("Authorization", "Bearer one")], True),
    ([("Authorization", "Bearer one")], [("authorization", "Bearer one"), ("Accept", "x")], True),
    ([("Authorization", "Bearer one")], [("Authorization", "Bearer two")], False),
    # two credentials in either order (not Cookie: it rotates, and so counts for no account at all)
    ([("Authorization", "x"), ("X-Api-Key", "c")], [("X-Api-Key", "c"), ("Authorization", "x")], True),
    ([("Authorization", "x")], [("X-Api-Key", "x")], False),  # the same value as another credential
    ([("Authorization", "x"), ("X-Api-Key", "c")], [("Authorization", "c"), ("X-Api-Key", "x")], False),
    ([("X-Api-Key", "x"), ("Proxy-Authorization", "p1")], [("X-Api-Key", "x"), ("Proxy-Authorization", "p2")], True),
])
def test_account_is_a_keyed_hash_of_the_credentials(a, b, same):
    assert (account(a) == account(b)) is same
    assert re.fullmatch(r"acct:[0-9a-f]{40}", account(a))


@pytest.mark.parametrize("headers", [[], [("Accept", "x")], [("Proxy-Authorization", "Basic cHJveHk=")]])
def test_no_credential_is_anonymous(headers):
    assert account(headers) == ANONYMOUS


def test_account_depends_on_the_key_and_never_shows_the_secret():
    headers = [("Authorization", f"Bearer {SECRET}")]
    assert account(headers) != account(headers, key=b"q" * 64)
    assert SECRET not in account(headers) and "Bearer" not in account(headers)


def test_load_or_create_key_makes_a_private_file_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret"
    old_umask = os.umask(0)  # the mode must not depend on a permissive umask
    try:
        key = load_or_create_key(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 32
    assert load_or_create_key(path) == key and path.read_text().strip().encode() == key
    assert load_or_create_key(tmp_path / "other") != key


def test_secret_env_wins_over_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "shared-by-every-replica-0123456789")
    assert load_or_create_key(tmp_path / "secret") == b"shared-by-every-replica-0123456789"
    assert not (tmp_path / "secret").exists()


@pytest.mark.parametrize("setup", ["short", "no-dir"])
def test_unusable_secret_file_is_one_config_error(tmp_path, monkeypatch, setup):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret" if setup == "short" else tmp_path / "missing" / "secret"
    if setup == "short":
        path.write_text("too-short")
    with pytest.raises(ConfigError) as err:
        load_or_create_key(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_undeclared_json_is_redacted_like_declared_json():
    body = b'{"title": "t", "password": "undeclared-secret"}'
    sniffed = analyse_body(None, body, frozenset({"password"}))
    assert sniffed.kind == "json"
    assert b"undeclared-secret" not in sniffed.stored
    assert analyse_body(None, b"{not json", frozenset({"password"})).kind == "bytes"


def test_replicas_creating_the_key_file_at_once_all_read_the_same_whole_key(tmp_path, monkeypatch):
    """Proxies started together on one secret_file: none may read it half-written, and all must use one key."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for attempt in range(20):
        path = tmp_path / f"secret-{attempt}"
        start = threading.Barrier(8)

        def load() -> bytes:
            start.wait(10)
            return load_or_create_key(path)

        with ThreadPoolExecutor(8) as pool:
            keys = {f.result() for f in [pool.submit(load) for _ in range(8)]}
        assert keys == {path.read_text().strip().encode()}
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(f"secret-{i}" for i in range(20))  # no drafts left


# -- bounded work on any input ------------------------------------------------------------------------------


@pytest.mark.timeout(10)  # on the code before, each of these held the GIL for half a minute
@pytest.mark.parametrize("body, stored", [
    (b'{"a":1e999999}', b'{"a":1E999999}'),
    (b'{"a":1e1000000}', b'{"a":1E1000000}'),
    (b'{"a":-1E-999999999}', b'{"a":-1E-999999999}'),
    (b'{"a":[1e999999, 2.50e3]}', b'{"a":[1E999999,2500]}'),
])
def test_huge_exponents_cost_nothing_and_stay_exact(body, stored):
    got = analyse_body(JSON, body, RF)
    assert (got.kind, got.stored, got.note) == ("json", stored, None)
    assert not isinstance(got.document["a"], int)  # never expanded into a million-digit int
    assert FORMAT.match(fingerprint(body))


@pytest.mark.parametrize("a, b", [
    (b'{"n": 12345678901234567890123456789012}', b'{"n": 12345678901234567890123456789013}'),
    (b'{"n": ' + b"7" * 300 + b"}", b'{"n": ' + b"7" * 299 + b"8}"),  # integers are exact up to Python's 4300 digits
    (b'{"n": 1.00000000000000000000000000000001}', b'{"n": 1.00000000000000000000000000000002}'),
    (b'{"n": 1e999999}', b'{"n": 1e999998}'),
])
def test_numbers_are_never_rounded_into_one_another(a, b):
    """Decimal.normalize() rounds to 28 digits: two different 32-digit numbers were one intent."""
    assert fingerprint(a) != fingerprint(b)


@pytest.mark.parametrize("body, why", [
    (b'{"a": 1.' + b"9" * 300 + b"}", "a number 302 characters long"),
    (b'{"a": ' + b"9" * 5000 + b"}", "a number over 4300 digits"),
    (b"[" * 70 + b"]" * 70, "nested over"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    (b"[" * 100_000, "over 50000 items"),
    (json.dumps([[i] for i in range(30_000)]).encode(), "over 50000 items"),
    (b'{"a": "' + b"x" * (1024 * 1024) + b'"}', "over 1048576 bytes"),
])
def test_a_body_too_costly_to_canonicalise_is_identified_by_its_bytes(body, why):
    got = analyse_body(JSON, body, RF)
    assert got.kind == "bytes" and why in (got.note or ""), got.note
    assert got.stored == REDACTED.encode()
    assert fingerprint(body) != fingerprint(b" " + body)  # the bytes are the identity


def test_a_form_too_long_to_canonicalise_is_identified_by_its_bytes():
    body = b"&".join(b"f%d=1" % i for i in range(60_000)) + b"&password=hunter2-s3cr3t"
    got = analyse_body(FORM, body, RF)
    assert got.kind == "bytes" and "over 50000 items" in (got.note or "") and got.stored == REDACTED.encode()


def _json_of_length(n: int) -> bytes:
    return b'{"a": "' + b"x" * (n - 9) + b'"}'


def _json_of_items(n: int) -> bytes:  # n separators: `[` and n - 1 commas
    return b"[" + b"0," * (n - 1) + b"0]"


def _json_of_number(n: int) -> bytes:  # a number literal n characters long
    return b'{"a": 1.' + b"9" * (n - 2) + b"}"


def _json_of_depth(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _form_of_items(n: int) -> bytes:  # n separators: the `&` between n + 1 pairs
    return b"&".join(b"f=1" for _ in range(n + 1))


@pytest.mark.parametrize("make, bound, ct, kind", [
    (_json_of_length, MAX_CANONICAL_BODY, JSON, "json"),
    (_json_of_items, MAX_ITEMS, JSON, "json"),
    (_json_of_number, MAX_NUMBER_CHARS, JSON, "json"),
    (_json_of_depth, MAX_JSON_DEPTH + 1, JSON, "json"),  # the outermost container is level 0
    (_json_of_length, MAX_CANONICAL_BODY, "text/plain", "json"),  # undeclared JSON, sniffed
    (_form_of_items, MAX_ITEMS, FORM, "form"),
], ids=["length", "items", "number", "depth", "sniffed-length", "form-items"])
def test_a_body_at_a_canonicalisation_bound_is_canonicalised_and_one_past_it_is_not(make, bound, ct, kind):
    """At the bound itself, and one past it: `over` a bound means past it, as each bound's note says."""
    at, past = make(bound), make(bound + 1)
    assert analyse_body(ct, at, RF).kind == kind
    got = analyse_body(ct, past, RF)
    assert got.kind == "bytes" and got.note and "fingerprinted as bytes" in got.note and got.stored == REDACTED.encode()


@pytest.mark.parametrize("parts, kind", [(9, "multipart"), (10, "bytes")])
def test_a_multipart_body_at_the_parts_bound_is_read_and_one_past_it_is_not(monkeypatch, parts, kind):
    """n parts have n + 1 delimiters (the closing one too); the bound is lowered to 10 to keep the test fast."""
    monkeypatch.setattr("proxy_addon.rules.fingerprint.MAX_ITEMS", 10)
    ct, raw = multipart("b0undary", [(b"f", b"1")] * parts)
    assert raw.count(b"--b0undary") == parts + 1
    assert analyse_body(ct, raw, RF).kind == kind


@pytest.mark.parametrize("size", [MAX_CANONICAL_BODY, MAX_CANONICAL_BODY + 1])
def test_text_that_only_looks_like_json_is_kept_as_text_up_to_the_bound(size):
    """Undeclared JSON is sniffed; text that starts like JSON but is not is identified and kept as the text it says
    it is, unless it is too long to have been looked at: then it may be JSON whose secrets were never found."""
    body = b"{ not json " + b"x" * (size - 11)
    got = analyse_body("text/plain", body, RF)
    assert len(body) == size and got.kind == "bytes"
    assert got.stored == (body if size <= MAX_CANONICAL_BODY else REDACTED.encode())


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/octet-stream"])
def test_text_that_looks_like_json_with_a_secret_member_is_kept_redacted(content_type):
    """A truncated or malformed JSON body does not parse, so its secret fields cannot be found one by one: when it
    names one, all of it is redacted and its identity is keyed, as for declared JSON that does not parse."""
    body = b'{"user": "ann", "password": "hunter2-s3cret",'
    got = analyse_body(content_type, body, RF)
    assert got.stored == REDACTED.encode() and b"hunter2" not in got.stored
    assert "hunter2" not in json.dumps(got.identity) and got.identity["keyed"].startswith("hmac:")
    other = analyse_body(content_type, body.replace(b"hunter2", b"letmein"), RF)
    assert other.identity != got.identity  # another password: another intent
    plain = analyse_body(content_type, b'{"user": "ann", "note": "unfinished",', RF)
    assert plain.stored == b'{"user": "ann", "note": "unfinished",'  # nothing secret named: kept as the text it is
