"""What the proxy refuses before journaling, through a real proxy with its admin server enabled and a
real client: requests to the proxy's own admin server or listen address (403, any method, CONNECT too), journaled
bodies over proxy.max_body (413, declared or chunked), a header value HTTP/1.1 forbids (400); and a body whose
numbers would once hold the whole proxy, while other requests are answered."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import httpx
import pytest
from support.e2e import PROBLEM_JSON, open_store, proxy_client, received, settled, settled_history, tag
from support.proxy import start_inprocess_proxy
from support.server import LoopbackServer, free_port
from support.upstream import start_upstream

from proxy_addon.rules.states import State

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def upstream():
    up = start_upstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def env(module_db_url, upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admission")
    admin_port = free_port()
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        f"admin: {{enabled: true, listen_port: {admin_port}}}\n"
        f"proxy: {{max_body: {MAX_BODY}}}\n"
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield proxy, store, client, upstream, admin_port
    finally:
        proxy.stop()


def problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    document = r.json()
    assert document["type"].endswith(kind), document
    return document


def admin_up(port: int) -> None:
    """The admin server answers when asked directly (not through the proxy): the refusals below are the proxy's."""
    r = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5, trust_env=False)
    assert r.status_code == 200


# -- the proxy's own addresses ------------------------------------------------------------------------------


def test_an_agent_cannot_list_or_resolve_anything_on_the_admin_server(env):
    proxy, store, client, up, admin_port = env
    path = f"/status/503/{tag()}"
    op = problem(client.post(up.base + path, json={"n": 1}), 504, "outcome-unknown")["operation_id"]
    admin_up(admin_port)
    for url in (f"http://127.0.0.1:{admin_port}/receipts", f"http://localhost:{admin_port}/receipts?state=unknown",
                f"http://127.0.0.1:{admin_port}/receipts/{op}", f"http://127.0.0.1:{admin_port}/receipts/{op}/proof",
                f"http://127.0.0.1:{admin_port}/metrics", f"http://127.0.0.1:{admin_port}/"):
        r = client.get(url)
        document = problem(r, 403, "forbidden-destination")
        assert "admin server" in document["detail"] and op not in r.text, url
    for method in ("POST", "PUT", "DELETE"):
        r = client.request(method, f"http://127.0.0.1:{admin_port}/receipts/{op}/resolve",
                           json={"state": "safe_to_retry", "note": "the agent settles its own receipt"})
        problem(r, 403, "forbidden-destination")
    assert settled(store, op).state == State.OUTCOME_UNKNOWN  # still blocks its retry
    problem(client.post(up.base + path, json={"n": 1}), 409, "duplicate-open")
    assert [t.to_state for t in settled_history(store, op)][-1] == State.OUTCOME_UNKNOWN


def raw(port: int, data: bytes) -> bytes:
    """Send bytes to the proxy as they are; the whole answer (head and Content-Length body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
        head = answer.partition(b"\r\n\r\n")[0].lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
        while len(answer.partition(b"\r\n\r\n")[2]) < length and (chunk := s.recv(65536)):
            answer += chunk
        return answer


def test_connect_to_the_admin_server_is_refused(env):
    proxy, _, _, _, admin_port = env
    answer = raw(proxy.port, f"CONNECT 127.0.0.1:{admin_port} HTTP/1.1\r\nHost: 127.0.0.1:{admin_port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and b"forbidden-destination" in answer, answer


def test_the_proxy_does_not_forward_to_its_own_listen_address(env):
    proxy, store, client, _, _ = env
    before = len(store.receipts.list(limit=None))
    for method in ("GET", "POST"):
        r = client.request(method, f"http://127.0.0.1:{proxy.port}/anything", json={"x": 1})
        assert "this proxy" in problem(r, 403, "forbidden-destination")["detail"]
    assert len(store.receipts.list(limit=None)) == before  # nothing journaled


def test_other_local_ports_are_not_refused(env):
    _, _, client, up, _ = env
    assert client.get(up.base + f"/read/{tag()}").status_code == 200  # 127.0.0.1, another port: an upstream


# -- proxy.max_body -----------------------------------------------------------------------------------------


def test_a_declared_body_over_max_body_is_413_and_nothing_is_forwarded(env):
    _, store, client, up, _ = env
    path = f"/big/{tag()}"
    r = client.post(up.base + path, content=b"x" * (MAX_BODY + 1), headers={"Content-Type": "application/octet-stream"})
    document = problem(r, 413, "body-too-large")
    assert document["max_body"] == MAX_BODY and "X-Receipt-Id" not in r.headers
    assert received(up, path) == [] and [x for x in store.receipts.list(limit=None) if x.path == path] == []
    at_limit = client.post(up.base + path, content=b"x" * MAX_BODY, headers={"Content-Type": "application/octet-stream"})
    assert at_limit.status_code == 201 and len(received(up, path)) == 1


def test_a_chunked_body_over_max_body_is_413_and_nothing_is_forwarded(env):
    _, store, client, up, _ = env
    path = f"/chunked/{tag()}"

    def chunks(total: int):
        for _ in range(total // 4096):
            yield b"y" * 4096

    problem(client.post(up.base + path, content=chunks(4 * MAX_BODY)), 413, "body-too-large")
    assert received(up, path) == []
    small = client.post(up.base + path, content=chunks(MAX_BODY // 2))
    assert small.status_code == 201 and received(up, path)[0].body == b"y" * (MAX_BODY // 2)


def test_a_gzip_bomb_is_identified_by_its_bytes_not_inflated(env):
    import zlib

    _, store, client, up, _ = env
    path = f"/bomb/{tag()}"
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = compressor.compress(b"{" + b" " * (50 * 1024 * 1024)) + compressor.flush()  # 50 MiB of JSON-ish, ~50 KiB sent
    assert len(bomb) < MAX_BODY
    r = client.post(up.base + path, content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 201, r.text
    receipt = settled(store, r.headers["X-Receipt-Id"])
    assert receipt.request_body_size <= MAX_BODY and "fingerprinted as bytes" in (receipt.body_note or "")


# -- a request bad in itself ----------------------------------------------------------------------------------


def test_a_header_value_http1_forbids_is_400_naming_the_header_not_its_value(env):
    proxy, store, _, up, _ = env
    path = f"/nul/{tag()}"
    host = f"127.0.0.1:{up.port}"
    answer = raw(proxy.port, (
        f"POST http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Api-Key: key-value-7c1\x00tail\r\nContent-Length: 2\r\n\r\n{{}}"
    ).encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/problem+json" in head, answer
    document = json.loads(body)
    assert document["type"].endswith("bad-request") and "X-Api-Key" in document["detail"]
    assert b"key-value-7c1" not in answer
    assert received(up, path) == [] and [x for x in store.receipts.list(limit=None) if x.path == path] == []


# -- bounded canonicalisation: the proxy goes on answering --------------------------------------------------------


class Gate(BaseHTTPRequestHandler):
    """An upstream that holds each request under /held until `release` is set, and says when one arrived."""

    protocol_version = "HTTP/1.1"
    arrived: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/held"):
            self.arrived.set()
            self.release.wait(30)
        self.send_response(201)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST


@pytest.mark.timeout(90)
@pytest.mark.parametrize("body", [b'{"a":1e999999}', b'{"a":1e1000000}', b'{"a":' + b"9" * 4000 + b"}"])
def test_a_huge_number_holds_nothing_up(env, body):
    """{"a":1e999999} once held every request of the proxy for 25-40 s, and 1e1000000 answered 503: now each
    is journaled at once, and the proxy answers other requests (reads and writes) meanwhile."""
    proxy, store, _, _, _ = env
    handler = type("G", (Gate,), {"arrived": threading.Event(), "release": threading.Event()})
    server = LoopbackServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    box: dict = {}

    def send_huge() -> None:
        with proxy_client(proxy.url, timeout=60) as c:
            box["answer"] = c.post(f"{base}/held/{tag()}", content=body, headers={"Content-Type": "application/json"})

    sender = threading.Thread(target=send_huge, daemon=True)
    sender.start()
    try:
        assert handler.arrived.wait(20), "the huge-number request should reach the upstream (journaled at once)"
        with proxy_client(proxy.url, timeout=10) as other:  # bounded waits: a stalled proxy fails these
            assert other.get(f"{base}/read/{tag()}").status_code == 201
            r = other.post(f"{base}/write/{tag()}", json={"n": 1})
            assert r.status_code == 201 and r.headers["X-Receipt-State"] == "succeeded"
    finally:
        handler.release.set()
        sender.join(30)
        server.shutdown()
        server.server_close()
    answer = box["answer"]
    assert answer.status_code == 201, answer.text  # never 503: the journal was never down
    assert settled(store, answer.headers["X-Receipt-Id"]).state == State.SUCCEEDED
