"""What passes through streams through, end to end: the official `openai` SDK streaming a chat completion from
an OpenAI-compatible upstream reached as api.openai.com (a model API: not journaled), an SSE stream over GET,
a POST route and a host (a wildcard key) that say `journal: false`, an upload to such a host, and a custom
method token in `proxy.methods` (journaled). Every stream waits for the client to have seen one piece before it
sends the next (support.asgi.Gate): buffered by the proxy, each piece would come late.
"""

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from support.asgi import AsgiServer, serve_asgi
from support.e2e import once_moved_on, open_store, proxy_client, settled, tag
from support.proxy import RunningProxy, start_inprocess_proxy
from support.redirect import add_redirect
from support.streams import StreamsApp

from proxy_addon.store import ReceiptStore


@dataclass
class Env:
    proxy: RunningProxy
    store: ReceiptStore
    app: StreamsApp
    plain: AsgiServer
    ca: Path
    client: httpx.Client


@pytest.fixture(scope="module")
def env(module_db_url, tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("passthrough")
    app = StreamsApp()
    plain, secure = serve_asgi(app), serve_asgi(app, tls_dir=tmp)
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning}\n"
        "proxy:\n"
        "  methods: [POST, PUT, PATCH, DELETE, PURGE, MKCOL]\n"
        "hosts:\n"
        f'  "127.0.0.1:{plain.port}":\n'
        "    operations:\n"
        "      - {name: search, method: POST, path: '/search/{tag}', journal: false}\n"
        '  "*.receipts.test": {journal: false}\n'
        '  "pay.receipts.test": {journal: true}\n'
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir", ssl_insecure=True)
    add_redirect(proxy, {"api.openai.com": secure.port, ".receipts.test": plain.port})
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield Env(proxy, store, app, plain, tmp / "confdir" / "mitmproxy-ca-cert.pem", client)
    finally:
        proxy.stop()
        plain.stop()
        secure.stop()


def receipts_at(store: ReceiptStore, host: str) -> list:
    return once_moved_on(lambda: [r for r in store.receipts.list(limit=None) if r.host == host])


def test_openai_sdk_stream_arrives_as_sent_and_is_not_journaled(env: Env):
    t = tag()
    gate = env.app.gate(t, 4)
    http_client = openai.DefaultHttpxClient(proxy=env.proxy.url, verify=ssl.create_default_context(cafile=str(env.ca)))
    client = openai.OpenAI(api_key="sk-test-key", base_url="https://api.openai.com/v1", max_retries=0, http_client=http_client)
    with client:
        stream = client.chat.completions.create(
            model=f"gate-{t}", messages=[{"role": "user", "content": "count"}], stream=True
        )
        texts = []
        for i, chunk in enumerate(stream):
            texts.append(chunk.choices[0].delta.content)
            gate.arrived(i)  # only now may the upstream send the next chunk
    assert gate.late == []  # each chunk reached the SDK before the next one was sent
    assert texts == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]
    assert receipts_at(env.store, "api.openai.com") == []
    assert env.app.count("POST", "/v1/chat/completions") == 1  # sent upstream once, by mitmproxy


def test_a_get_stream_reaches_the_client_as_it_is_sent(env: Env):
    t = tag()
    gate = env.app.gate(t, 3)
    with env.client.stream("GET", f"{env.plain.base}/sse/{t}") as r:
        assert r.status_code == 200 and "x-receipt-id" not in r.headers
        seen = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(line)
                gate.arrived(len(seen) - 1)
    assert gate.late == [] and seen == ["data: piece-0", "data: piece-1", "data: piece-2"]


def test_a_post_route_with_journal_false_passes_streamed_every_time(env: Env):
    t = tag()
    for _ in range(2):  # a read sent as POST: the second is forwarded too, never replayed
        gate = env.app.gate(t, 2)
        with env.client.stream("POST", f"{env.plain.base}/search/{t}", json={"q": "receipts"}) as r:
            assert "x-receipt-id" not in r.headers
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    gate.arrived(seen)
                    seen += 1
        assert gate.late == [] and seen == 2
    assert env.app.count("POST", f"/search/{t}") == 2
    assert [r for r in receipts_at(env.store, "127.0.0.1") if r.path == f"/search/{t}"] == []


def test_a_host_with_journal_false_passes_and_its_uploads_stream(env: Env):
    t = tag()
    for _ in range(2):
        r = env.client.post(f"http://api.receipts.test/record/{t}", json={"same": "body"})
        assert r.status_code == 201 and "x-receipt-id" not in r.headers
    assert env.app.count("POST", f"/record/{t}") == 2
    gate = env.app.gate(t, 3)

    def pieces() -> Iterator[bytes]:
        for i in range(3):
            yield f"piece-{i};".encode()
            gate.sent(i)  # the next piece only once the upstream has this one

    r = env.client.post(f"http://upload.receipts.test/upload/{t}", content=pieces())
    assert r.status_code == 200 and r.json()["pieces"] >= 3
    assert gate.late == []
    assert receipts_at(env.store, "api.receipts.test") == [] and receipts_at(env.store, "upload.receipts.test") == []


def test_a_host_key_wins_over_a_wildcard_key(env: Env):
    # pay.receipts.test says journal: true: journaled (nothing resolves it here, so the proxy's own send finds
    # no connection: 502 not-sent, with a receipt), where *.receipts.test passes
    r = env.client.post(f"http://pay.receipts.test/record/{tag()}", json={"amount": 1})
    assert r.status_code == 502 and r.headers["x-receipt-id"].startswith("op_")
    assert settled(env.store, r.headers["x-receipt-id"]).error_code == "not_sent"


def test_a_custom_method_in_proxy_methods_is_journaled_once(env: Env):
    # a segment that is never id-like: 12 hex digits are all decimal in 1 run of ~280, and shown as `{id}`
    path = f"/record/r{tag()}"
    first = env.client.request("PURGE", env.plain.base + path)
    assert first.status_code == 201 and first.headers["x-receipt-state"] == "succeeded"
    receipt = settled(env.store, first.headers["x-receipt-id"])
    assert (receipt.method, receipt.operation) == ("PURGE", f"PURGE 127.0.0.1 {path}")
    again = env.client.request("PURGE", env.plain.base + path)
    assert again.headers["x-receipt-replayed"] == "true" and again.headers["x-receipt-id"] == receipt.operation_id
    assert env.app.count("PURGE", path) == 1
    made = env.client.request("MKCOL", env.plain.base + path + "/dir")
    assert settled(env.store, made.headers["x-receipt-id"]).method == "MKCOL"
    # a token not in proxy.methods passes through untouched
    locked = env.client.request("LOCK", env.plain.base + path)
    assert locked.status_code == 201 and "x-receipt-id" not in locked.headers

