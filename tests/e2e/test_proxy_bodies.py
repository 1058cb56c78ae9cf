"""Every kind of request body journals through the real proxy, gets a fingerprint, and reaches the upstream
byte for byte; stored copies are capped, and a response too big to keep whole is refused, not replayed."""

import re

import pytest
from support.bodies import binary
from support.e2e import open_store, proxy_client, received, settled, tag
from support.proxy import start_inprocess_proxy
from support.upstream import start_upstream

MAX_STORED_BODY = 1024
MAX_STORED_RESPONSE = 64  # the upstream's usual answer (id, echo, token) is longer; /location's is shorter
FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def upstream():
    up = start_upstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def env(module_db_url, upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy")
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "proxy:\n"
        "  max_stored_body: 1KiB\n"
        f"  max_stored_response: {MAX_STORED_RESPONSE}\n"
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield store, client, upstream
    finally:
        proxy.stop()


def journaled(env, path: str, **request):
    """POST through the proxy; the answer must be the upstream's success with a receipt that says so."""
    store, client, up = env
    r = client.post(up.base + path, **request)
    assert r.status_code == 201, r.text
    assert r.headers["X-Receipt-State"] == "succeeded"
    receipt = settled(store, r.headers["X-Receipt-Id"])
    assert receipt.state == "succeeded"
    assert FINGERPRINT.match(receipt.intent_fingerprint), receipt.intent_fingerprint
    [seen] = received(up, path)
    return receipt, seen


def test_json_body(env):
    body = b'{"title": "hello", "password": "pw-json-secret", "n": 1.0}'
    receipt, seen = journaled(env, f"/json/{tag()}", content=body, headers={"Content-Type": "application/json"})
    assert seen.body == body  # forwarded untouched
    assert receipt.request_body == b'{"n":1,"password":"[REDACTED]","title":"hello"}'
    assert receipt.request_body_size == len(body)
    assert receipt.request_body_truncated is False
    assert receipt.body_note is None


def test_form_urlencoded_body(env):
    receipt, seen = journaled(env, f"/form/{tag()}", data={"b": "2", "a": "1", "password": "pw-form-secret"})
    assert seen.body == b"b=2&a=1&password=pw-form-secret"
    assert receipt.request_body == b"b=2&a=1&password=%5BREDACTED%5D"
    assert receipt.request_body_size == len(seen.body)


def test_text_plain_body(env):
    body = "plain text, ünïcode\n".encode()
    receipt, seen = journaled(env, f"/text/{tag()}", content=body, headers={"Content-Type": "text/plain; charset=utf-8"})
    assert seen.body == body
    assert receipt.request_body == body
    assert receipt.request_body_size == len(body)


def test_binary_octet_stream_body(env):
    body = bytes(range(256)) * 2
    receipt, seen = journaled(
        env, f"/bin/{tag()}", content=body, headers={"Content-Type": "application/octet-stream"}
    )
    assert seen.body == body
    assert receipt.request_body == body
    assert receipt.request_body_size == 512
    assert receipt.request_body_truncated is False


def test_empty_body(env):
    receipt, seen = journaled(env, f"/empty/{tag()}")
    assert seen.body == b""
    assert receipt.request_body in (None, b"")
    assert receipt.request_body_size == 0
    assert receipt.request_body_truncated is False


def test_non_utf8_bytes_declared_as_json_are_fingerprinted_as_bytes(env):
    body = b'{"name": "caf\xe9 \xff\xfe"}'  # latin-1, not UTF-8
    receipt, seen = journaled(env, f"/badjson/{tag()}", content=body, headers={"Content-Type": "application/json"})
    assert seen.body == body
    assert receipt.body_note and "json" in receipt.body_note.lower()
    assert receipt.request_body_size == len(body)


def test_large_body_is_capped_in_storage_but_fingerprinted_whole(env):
    store, _, up = env
    size = 2 * 1024 * 1024
    body = binary(size - 1) + b"\x00"  # never JSON: such a body would be stored as the redaction marker
    other = body[:-1] + b"\x01"  # differs only in the last byte, far past the stored cap
    path = f"/large/{tag()}"
    headers = {"Content-Type": "application/octet-stream"}
    first, seen = journaled(env, path, content=body, headers=headers)
    assert len(first.request_body) <= MAX_STORED_BODY
    assert first.request_body == body[: len(first.request_body)]
    assert first.request_body_truncated is True
    assert first.request_body_size == size
    assert seen.body == body

    _, client, _ = env
    r = client.post(up.base + path, content=other, headers=headers)
    assert r.status_code == 201, r.text
    assert r.headers["X-Receipt-Id"] != first.operation_id  # a new intent, not a replay of the first
    assert "X-Receipt-Replayed" not in r.headers
    second = settled(store, r.headers["X-Receipt-Id"])
    assert second.intent_fingerprint != first.intent_fingerprint
    assert second.request_body_size == size
    assert [s.body[-1] for s in received(up, path)] == [0, 1]


def test_multipart_form_body(env):
    files = {"upload": ("notes.txt", b"file content \x00\x01", "application/octet-stream")}
    receipt, seen = journaled(env, f"/multipart/{tag()}", data={"field": "value"}, files=files)
    assert seen.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert b"file content \x00\x01" in seen.body
    assert receipt.body_note and "multipart" in receipt.body_note
    assert receipt.request_body_size == len(seen.body)


def test_multipart_fingerprint_ignores_the_boundary(env):
    """The same fields under another boundary are the same intent: the retry is replayed, not sent."""
    store, client, up = env
    path = f"/location/{tag()}"  # a short answer, small enough to be kept for replay
    fields = {"name": "same"}
    files = {"f": ("a.bin", b"\x00same\xff", "application/octet-stream")}
    first = client.post(up.base + path, data=fields, files=files)
    assert first.status_code == 201
    again = client.post(up.base + path, data=fields, files=files)  # httpx picks a new random boundary
    assert again.headers.get("X-Receipt-Replayed") == "true", again.text
    assert again.headers["X-Receipt-Id"] == first.headers["X-Receipt-Id"]
    assert len(received(up, path)) == 1


def test_a_small_stored_response_is_replayed(env):
    store, client, up = env
    path = f"/location/{tag()}"
    first = client.post(up.base + path, json={"k": "small"})
    assert first.status_code == 201
    receipt = settled(store, first.headers["X-Receipt-Id"])
    assert receipt.response_body_truncated is False
    again = client.post(up.base + path, json={"k": "small"})
    assert again.status_code == 201
    assert again.headers["X-Receipt-Replayed"] == "true"
    assert again.content == first.content  # byte for byte
    assert again.headers["Location"] == first.headers["Location"]
    assert len(received(up, path)) == 1


def test_a_response_too_big_to_store_is_refused_not_replayed_truncated(env):
    store, client, up = env
    path = f"/big-answer/{tag()}"
    body = {"k": "big " * 40}  # echoed back, so the answer is far longer than the cap even when compacted
    first = client.post(up.base + path, json=body)
    assert first.status_code == 201
    assert len(first.content) > MAX_STORED_RESPONSE
    receipt = settled(store, first.headers["X-Receipt-Id"])
    assert receipt.response_body_truncated is True
    assert len(receipt.response_body or b"") <= MAX_STORED_RESPONSE
    again = client.post(up.base + path, json=body)
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    doc = again.json()
    assert doc["type"].endswith("duplicate-succeeded")
    assert (doc["operation_id"], doc["upstream_status"]) == (receipt.operation_id, 201)
    assert "X-Receipt-Replayed" not in again.headers
    assert len(received(up, path)) == 1


def test_a_compressed_request_body_is_fingerprinted_by_its_content(env):
    """gzip on the wire: the identity is the decoded JSON, so the same document sent plain is a duplicate."""
    import gzip

    store, client, up = env
    path = f"/location/{tag()}"
    document = b'{"title": "zipped"}'
    headers = {"Content-Type": "application/json"}
    first = client.post(up.base + path, content=gzip.compress(document), headers={**headers, "Content-Encoding": "gzip"})
    assert first.status_code == 201, first.text
    receipt = settled(store, first.headers["X-Receipt-Id"])
    assert receipt.request_body == b'{"title":"zipped"}'
    [seen] = received(up, path)
    assert gzip.decompress(seen.body) == document  # the upstream got the compressed bytes it was sent
    again = client.post(up.base + path, content=document, headers=headers)
    assert again.headers.get("X-Receipt-Replayed") == "true"
    assert len(received(up, path)) == 1
