"""Every secret form the contract names, sent through a real `receipts proxy` process with a unique marker, then
looked for where it must never be: the SQLite file and its WAL, a `pg_dump` of the PostgreSQL database, and the
proxy's log. Zero hits each. The upstream still gets every credential it was sent.

Forms: vendor key headers, configured headers, cookies; query parameters; JSON fields at depth; form fields;
multipart parts (and their unsalted SHA-256); a token the upstream returns in a success body and a cookie it
sets; a header value HTTP/1.1 forbids (the error path, answered 400); a connection refused (the sender's error);
an unknown outcome and its refused duplicate; a replayed success; URL userinfo in a request mitmproxy itself
refuses (its bad-request line in the log).

Also here: two tenants sending the same body are two intents, each forwarded.
"""

import hashlib
import json
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from support.e2e import migrate, proxy_client, stop_process, tag
from support.pg import libpq_url
from support.proxy import start_proxy_process
from support.server import LoopbackServer, free_port

FORMS = (
    "header authorization", "header x-goog-api-key", "header ocp-apim-subscription-key", "header private-token",
    "header x-shopify-access-token", "header cookie", "header configured (x-tenant-pass)",
    "query access_token", "query key", "query sig", "query client_secret",
    "json client_secret (depth 2)", "json refresh_token (depth 3, in a list)", "json access_token", "json private_key",
    "json apiKey", "json card_number", "json cvc", "json configured (ssn)",
    "form password", "form client_secret",
    "multipart card_number part", "multipart api_key part",
    "response body token", "response set-cookie",
    "error: header value h11 refuses (400)", "error: connection refused (not_sent)", "unknown outcome (503)",
    "duplicate of the unknown (409)", "replay of a success", "repeat of a success whose answer held a token (409)",
    "log: URL userinfo (mitmproxy bad request line)",
)
WHERE = ("SQLite file", "SQLite WAL", "PostgreSQL dump", "log")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


class Recorder(BaseHTTPRequestHandler):
    """An upstream that answers 201 with a token (the value of X-Answer-Token) and a cookie (X-Answer-Session),
    or 503 under /status/503; it records what it received."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[bytes]] = []
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.seen.append(self.requestline.encode() + bytes(self.headers) + body)
        status = 503 if self.path.startswith("/status/503") else 201
        try:
            echo = json.loads(body) if body[:1] == b"{" else {}
        except ValueError:
            echo = {}
        document = {"id": 1, "echo": echo}
        if self.headers.get("X-Answer-Token"):
            document["access_token"] = self.headers["X-Answer-Token"]
        answer = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        if self.headers.get("X-Answer-Session"):
            self.send_header("Set-Cookie", f"session={self.headers['X-Answer-Session']}; HttpOnly")
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def upstream():
    handler = type("Handler", (Recorder,), {"seen": []})
    server = LoopbackServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


def send_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and len(b"".join(chunks)) > 200:
                    break
        except TimeoutError:
            pass
    return b"".join(chunks)


def exercise(proxy_port: int, base: str, m: dict[str, str], title: str) -> None:
    """Send every form through the proxy; each answer is checked for what the contract says it is."""
    creds = {
        "Authorization": f"Bearer {m['header authorization']}",
        "x-goog-api-key": m["header x-goog-api-key"],
        "Ocp-Apim-Subscription-Key": m["header ocp-apim-subscription-key"],
        "PRIVATE-TOKEN": m["header private-token"],
        "X-Shopify-Access-Token": m["header x-shopify-access-token"],
        "Cookie": f"sid={m['header cookie']}",
        "X-Tenant-Pass": m["header configured (x-tenant-pass)"],
    }
    query = {
        "access_token": m["query access_token"], "key": m["query key"], "sig": m["query sig"],
        "client_secret": m["query client_secret"], "page": "2",
    }
    document = {
        "title": title,
        "app": {"client_secret": m["json client_secret (depth 2)"]},
        "grants": [{"kind": "refresh", "auth": {"refresh_token": m["json refresh_token (depth 3, in a list)"]}}],
        "access_token": m["json access_token"], "private_key": m["json private_key"], "apiKey": m["json apiKey"],
        "payment": {"card_number": m["json card_number"], "cvc": m["json cvc"]}, "ssn": m["json configured (ssn)"],
    }
    answer_headers = {"X-Answer-Token": m["response body token"], "X-Answer-Session": m["response set-cookie"]}
    with proxy_client(f"http://127.0.0.1:{proxy_port}") as client:
        r = client.post(f"{base}/json/{tag()}", params=query, json=document, headers={**creds, **answer_headers})
        assert r.status_code == 201 and r.json()["access_token"] == m["response body token"], r.text  # the agent's answer is whole
        r = client.post(f"{base}/form/{tag()}", data={"title": title, "password": m["form password"],
                                                      "client_secret": m["form client_secret"]}, headers=creds)
        assert r.status_code == 201, r.text
        files = {"card_number": (None, m["multipart card_number part"]), "api_key": (None, m["multipart api_key part"]),
                 "title": (None, title)}
        r = client.post(f"{base}/multipart/{tag()}", files=files, headers=creds)
        assert r.status_code == 201, r.text
        # the error paths: a connection refused (the sender's error text), an unknown outcome and its duplicate
        r = client.post(f"http://127.0.0.1:{free_port()}/refused", params=query, json=document,
                        headers={**creds, "X-Api-Key": m["error: connection refused (not_sent)"]})
        assert r.status_code == 502 and r.headers["X-Receipt-State"] == "rejected", r.text
        unknown = {**creds, "X-Api-Key": m["unknown outcome (503)"]}
        path = f"{base}/status/503/{tag()}"
        assert client.post(path, json=document, headers=unknown).status_code == 504
        # a rotating secret (a session id) is redacted but names no account: this is the same intent again
        duplicate = {**creds, "X-Api-Key": m["unknown outcome (503)"], "Mcp-Session-Id": m["duplicate of the unknown (409)"]}
        r = client.post(path, json=document, headers=duplicate)
        assert r.status_code == 409 and r.json()["type"].endswith("duplicate-open"), r.text
        replayed = {**creds, "X-Api-Key": m["replay of a success"]}
        path = f"{base}/replay/{tag()}"
        first = client.post(path, json={"title": title}, headers=replayed)
        again = client.post(path, json={"title": title}, headers=replayed)
        assert first.status_code == again.status_code == 201 and again.headers.get("X-Receipt-Replayed") == "true"
        # an answer that held a token was stored redacted: its repeat is refused, never replayed altered
        holding = {**creds, "X-Answer-Token": m["repeat of a success whose answer held a token (409)"]}
        path = f"{base}/holding/{tag()}"
        first = client.post(path, json={"title": title}, headers=holding)
        again = client.post(path, json={"title": title}, headers=holding)
        assert first.status_code == 201 and again.status_code == 409 and "duplicate-succeeded" in again.text
    # a header value HTTP/1.1 forbids (NUL): mitmproxy takes it, the upstream protocol would not
    host = base.removeprefix("http://")
    answer = send_raw(proxy_port, (
        f"POST {base}/nul/{tag()} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Auth-Token: Bearer {m['error: header value h11 refuses (400)']}\x00x\r\nContent-Length: 2\r\n\r\n{{}}"
    ).encode())
    assert answer.startswith(b"HTTP/1.1 400") and b"bad-request" in answer and b"X-Auth-Token" in answer, answer
    assert m["error: header value h11 refuses (400)"].encode() not in answer
    # URL userinfo: mitmproxy refuses the request line and logs it
    userinfo = m["log: URL userinfo (mitmproxy bad request line)"]
    answer = send_raw(proxy_port, (
        f"GET http://agent:{userinfo}@{host}/x?access_token={userinfo} HTTP/1.1\r\nHost: {host}\r\n\r\n"
    ).encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer


def pg_dump(url: str) -> bytes:
    if shutil.which("pg_dump") is None:
        pytest.skip("pg_dump is not installed")
    return subprocess.run(["pg_dump", "--data-only", libpq_url(url)], capture_output=True, check=True, timeout=60).stdout


@pytest.mark.timeout(180)
def test_no_secret_form_reaches_the_database_or_the_log(db_url, upstream, tmp_path):
    migrate(db_url)
    server, handler = upstream
    base = f"http://127.0.0.1:{server.server_address[1]}"
    run = tag()
    markers = {form: f"m{i:02d}x{run}" for i, form in enumerate(FORMS)}
    title = f"title-{run}"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"secret_file: {tmp_path / 'secret'}\n"
        "defaults:\n  redact_headers: [X-Tenant-Pass]\n  redact_fields: [ssn]\n"
    )
    log_path = tmp_path / "proxy.log"
    proc, port = start_proxy_process(config, db_url, tmp_path / "confdir", log_path)
    try:
        exercise(port, base, markers, title)
        wal = b""
        if db_url.startswith("sqlite"):
            db_file = Path(db_url.removeprefix("sqlite:///"))
            wal_file = Path(f"{db_file}-wal")
            wal = wal_file.read_bytes() if wal_file.exists() else b""  # as it is while the proxy runs
    finally:
        stop_process(proc)
    assert proc.returncode == 0

    places: dict[str, bytes | None] = {"SQLite file": None, "SQLite WAL": None, "PostgreSQL dump": None}
    if db_url.startswith("sqlite"):
        wal_now = Path(f"{db_file}-wal")
        places["SQLite file"] = db_file.read_bytes()
        places["SQLite WAL"] = wal + (wal_now.read_bytes() if wal_now.exists() else b"")
        assert title.encode() in places["SQLite file"] + places["SQLite WAL"], "wrong file? the stored title is not in it"
    else:
        places["PostgreSQL dump"] = pg_dump(db_url)
        dump = places["PostgreSQL dump"]
        assert title.encode().hex().encode() in dump, "wrong database? the stored title is not in the dump"
    places["log"] = log_path.read_bytes()
    assert b"receipt_succeeded" in places["log"] and b"Bad HTTP request line" in places["log"], "wrong log?"

    with handler.lock:
        received = b"\n".join(handler.seen)
    for form in ("header x-goog-api-key", "query sig", "json cvc", "multipart card_number part"):
        assert markers[form].encode() in received, f"{form}: the upstream should still receive it"

    hits: dict[str, dict[str, int | None]] = {}
    for form in FORMS:
        value = markers[form].encode()
        # as written, as pg_dump writes bytea (hex), and as earlier versions kept multipart parts (unsalted SHA-256)
        forms = (value, value.hex().encode(), hashlib.sha256(value).hexdigest().encode())
        hits[form] = {w: None if data is None else sum(data.count(f) for f in forms) for w, data in places.items()}
    backend = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"secret-grep-{backend}.json").write_text(json.dumps(hits, indent=1))
    leaks = {form: {w: n for w, n in found.items() if n} for form, found in hits.items() if any(found.values())}
    assert not leaks, leaks


def test_two_tenants_with_the_same_body_are_two_intents_and_two_upstream_requests(sqlite_url, upstream, tmp_path):
    migrate(sqlite_url)
    server, handler = upstream
    base = f"http://127.0.0.1:{server.server_address[1]}"
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    proc, port = start_proxy_process(config, sqlite_url, tmp_path / "confdir", tmp_path / "proxy.log")
    path = f"{base}/tenants/{tag()}"
    try:
        with proxy_client(f"http://127.0.0.1:{port}") as client:
            a = client.post(path, json={"x": 1}, headers={"x-goog-api-key": "tenant-a"})
            b = client.post(path, json={"x": 1}, headers={"x-goog-api-key": "tenant-b"})
            again = client.post(path, json={"x": 1}, headers={"x-goog-api-key": "tenant-a"})
    finally:
        stop_process(proc)
    assert (a.status_code, b.status_code) == (201, 201)
    assert "X-Receipt-Replayed" not in b.headers  # forwarded: never tenant A's answer
    assert a.headers["X-Receipt-Id"] != b.headers["X-Receipt-Id"]
    assert again.headers.get("X-Receipt-Replayed") == "true" and again.headers["X-Receipt-Id"] == a.headers["X-Receipt-Id"]
    with handler.lock:
        assert sum(1 for r in handler.seen if path.removeprefix(base).encode() in r) == 2
