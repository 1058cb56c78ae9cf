"""The admin server: JSON API shapes (as `receipts show --json`, as the OpenAPI document says), a person's
resolution, the proof, token and CSRF guards, escaping, and the real server on a loopback port."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate as validate_spec
from sqlalchemy import update
from support.proxy import REPO
from support.server import free_port
from support.store import intent, recorded, walk

from proxy_addon.admin.app import create_app
from proxy_addon.admin.server import AdminServer
from proxy_addon.cli import main as cli_main
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import ConfigError
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts
from tests.conftest import migrate

TOKEN = "s3cret-admin-token-for-tests"


def conforms(instance, name: str, client) -> None:
    """The instance is a `name` as the served OpenAPI document describes it."""
    doc = client.get("/openapi.json").get_json()
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(instance)


def config_for(tmp_path, extra: str = ""):
    return parse_config(f"secret_file: {tmp_path / 'secret'}\n{extra}")


def made(store: ReceiptStore, target: State, ago: timedelta = timedelta(0), path: str = "/api/articles", **updates) -> str:
    rec = recorded(store, dataclasses.replace(intent(), path=path))
    walk(store, rec.operation_id, target, **updates)
    if ago:
        with store.engine.begin() as conn:
            conn.execute(update(receipts).where(receipts.c.operation_id == rec.operation_id).values(created_at=utcnow() - ago))
    return rec.operation_id


@pytest.fixture
def sqlite_store(sqlite_url):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield ReceiptStore(engine)
    engine.dispose()


@pytest.fixture
def client(sqlite_store, tmp_path):
    return create_app(config_for(tmp_path), sqlite_store).test_client()


def page_token(client, url: str) -> str:
    html = client.get(url).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', html).group(1)


# -- the JSON API, on both databases ---------------------------------------------------------------------------


def test_api_shapes_are_the_cli_shapes(store, migrated_url, tmp_path, monkeypatch, capsys):
    unknown = made(store, State.OUTCOME_UNKNOWN, timedelta(minutes=15), error_code="upstream_timeout")
    fresh = made(store, State.OUTCOME_UNKNOWN)
    done = made(store, State.SUCCEEDED, status_code=201, external_id="A-1")
    client = create_app(config_for(tmp_path), store).test_client()

    shown = client.get(f"/receipts/{unknown}")
    assert shown.status_code == 200 and shown.mimetype == "application/json"
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", migrated_url)
    (tmp_path / "config.yaml").write_text(f"secret_file: {tmp_path / 'secret'}\n")
    assert cli_main(["show", unknown, "--json", "--config", str(tmp_path / "config.yaml")]) == 0
    assert shown.get_json() == json.loads(capsys.readouterr().out)
    conforms(shown.get_json(), "ReceiptWithHistory", client)
    assert [t["to_state"] for t in shown.get_json()["transitions"]] == ["planned", "submitted", "outcome_unknown"]

    listed = client.get("/receipts").get_json()
    assert [r["operation_id"] for r in listed] == [done, fresh, unknown]  # newest first
    for r in listed:
        conforms(r, "Receipt", client)
    assert [r["operation_id"] for r in client.get("/receipts?state=unknown&older_than=10m").get_json()] == [unknown]
    assert [r["operation_id"] for r in client.get("/receipts?state=succeeded,outcome_unknown&limit=1").get_json()] == [done]
    assert client.get("/receipts?host=other.example.com").get_json() == []

    proof = client.get(f"/receipts/{unknown}/proof").get_json()
    conforms(proof, "Proof", client)
    assert proof["retry"]["decision"] == "refused" and proof["retry"]["blocking_operation_id"] == unknown
    assert proof["open"] is True and proof["proven"] is False


def test_pages_follow_the_journal_order(store, migrated_url, tmp_path, monkeypatch, capsys):
    """Keyset pages: each `after` page starts right after the last receipt of the one before, on both databases,
    whatever the clock said (a receipt created "earlier" but journaled later is still newer); the API's `Link`
    header, the page's link and `ls --after` give the same pages."""
    ids = [made(store, State.SUCCEEDED, status_code=201) for _ in range(5)]
    skewed = made(store, State.SUCCEEDED, timedelta(hours=3), status_code=201)  # journaled last, clock says older
    newest_first = [skewed, *reversed(ids)]
    client = create_app(config_for(tmp_path), store).test_client()

    pages, url = [], "/receipts?state=succeeded&limit=2"
    while url:
        r = client.get(url)
        pages.append([d["operation_id"] for d in r.get_json()])
        link = r.headers.get("Link")
        url = re.fullmatch(r'<(.+)>; rel="next"', link).group(1) if link else None
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:6], []]

    def listed(html: str) -> list[str]:
        return re.findall(r'href="/ui/receipts/([^"]+)"', html)

    html = client.get("/?state=succeeded&limit=4").get_data(as_text=True)
    assert listed(html) == newest_first[:4]
    second = client.get(re.search(r'id="older" href="([^"]+)"', html).group(1).replace("&amp;", "&"))
    assert listed(second.get_data(as_text=True)) == newest_first[4:]
    assert 'id="older"' not in second.get_data(as_text=True)

    monkeypatch.setenv("RECEIPTS_DATABASE_URL", migrated_url)
    (tmp_path / "config.yaml").write_text(f"secret_file: {tmp_path / 'secret'}\n")
    cli = ["--config", str(tmp_path / "config.yaml"), "--limit", "3"]
    assert cli_main(["ls", *cli, "--json", "--after", newest_first[1]]) == 0
    assert [d["operation_id"] for d in json.loads(capsys.readouterr().out)] == newest_first[2:5]
    assert cli_main(["ls", *cli]) == 0
    assert f"older: --after {newest_first[2]}" in capsys.readouterr().out

    r = client.get("/receipts?after=op_nope")
    assert r.status_code == 400 and "after: no receipt op_nope" in r.get_json()["detail"]
    assert cli_main(["ls", *cli, "--after", "op_nope"]) == 1
    assert "no receipt op_nope" in capsys.readouterr().err


def test_bad_parameters_and_unknown_ids(client):
    for query, word in (("state=finished", "finished"), ("older_than=soon", "soon"), ("limit=0", "limit")):
        r = client.get(f"/receipts?{query}")
        assert r.status_code == 400 and r.mimetype == "application/problem+json" and word in r.get_json()["detail"]
    for url in ("/receipts/op_nope", "/receipts/op_nope/proof"):
        r = client.get(url)
        assert r.status_code == 404 and r.get_json()["type"].endswith("not-found")
    r = client.post("/receipts/op_nope/resolve", json={"state": "succeeded", "note": "x"})
    assert r.status_code == 404
    assert client.get("/ui/receipts/op_nope").status_code == 404


def test_resolve_through_the_api(client, sqlite_store):
    review = made(sqlite_store, State.MANUAL_REVIEW)
    done = made(sqlite_store, State.SUCCEEDED, status_code=201)
    url = f"/receipts/{review}/resolve"

    assert client.post(url, data="state=succeeded&note=x", content_type="text/plain").status_code == 415
    assert client.post(url, json=["not", "an", "object"]).status_code == 400
    for body, word in (
        ({"state": "rejected", "note": "x"}, "rejected"),
        ({"state": "succeeded"}, "note"),
        ({"state": "succeeded", "note": "   "}, "note"),
        ({"state": "succeeded", "note": "x", "extra": 1}, "extra"),
        ({"state": "succeeded", "note": 5}, "note"),
    ):
        r = client.post(url, json=body)
        assert r.status_code == 422 and word in r.get_json()["detail"], body
    assert sqlite_store.receipts.get(review).state == "manual_review"

    r = client.post(f"/receipts/{done}/resolve", json={"state": "safe_to_retry", "note": "x"})
    assert r.status_code == 409 and "succeeded" in r.get_json()["detail"]

    r = client.post(url, json={"state": "succeeded", "note": "found it upstream", "external_id": "A-9", "who": "ana"})
    assert r.status_code == 200
    conforms(r.get_json(), "ReceiptWithHistory", client)
    assert r.get_json()["state"] == "succeeded" and r.get_json()["external_id"] == "A-9"
    last = sqlite_store.receipts.history(review)[-1]
    assert (last.from_state, last.to_state) == ("manual_review", "succeeded")
    assert last.detail["note"] == "found it upstream" and last.detail["who"] == "person:ana"
    assert client.post(url, json={"state": "succeeded", "note": "again"}).status_code == 409


def test_proof_says_what_a_retry_would_get(sqlite_store, tmp_path):
    replay = create_app(config_for(tmp_path), sqlite_store).test_client()
    refuse = create_app(config_for(tmp_path, "defaults: {after_success: {policy: refuse, window: 15m}}"), sqlite_store).test_client()
    stored = {"status_code": 201, "response_body": b'{"id": 7}', "response_headers": {"content-type": "application/json"}}
    succeeded = made(sqlite_store, State.SUCCEEDED, external_id="7", **stored)
    old = made(sqlite_store, State.SUCCEEDED, status_code=201)
    with sqlite_store.engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.operation_id == old).values(completed_at=utcnow() - timedelta(hours=1)))
    rejected = made(sqlite_store, State.REJECTED, status_code=422)
    safe = made(sqlite_store, State.SAFE_TO_RETRY)

    p = replay.get(f"/receipts/{succeeded}/proof").get_json()
    assert p["retry"]["decision"] == "replayed" and p["retry"]["status"] == 201 and p["retry"]["until"]
    assert p["proven"] is True and p["external_id"] == "7" and "accepted" in p["what_happened"]
    assert [e["to_state"] for e in p["evidence"]] == ["succeeded"]
    p = refuse.get(f"/receipts/{succeeded}/proof").get_json()
    assert (p["retry"]["decision"], p["retry"]["status"], p["retry"]["problem"]) == ("refused", 409, "duplicate-succeeded")
    for op in (old, rejected, safe):
        p = replay.get(f"/receipts/{op}/proof").get_json()
        conforms(p, "Proof", replay)
        assert p["retry"]["decision"] == "forwarded", op


# -- guards ----------------------------------------------------------------------------------------------------


def test_a_token_is_required_when_configured(sqlite_store, tmp_path, monkeypatch):
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", TOKEN)
    op = made(sqlite_store, State.MANUAL_REVIEW)
    client = create_app(config_for(tmp_path), sqlite_store).test_client()
    for url in (f"/receipts/{op}", "/receipts", "/metrics", "/openapi.json", f"/receipts/{op}/proof"):
        r = client.get(url)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer"), url
        assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    r = client.post(f"/receipts/{op}/resolve", json={"state": "succeeded", "note": "x"})
    assert r.status_code == 401 and sqlite_store.receipts.get(op).state == "manual_review"

    r = client.get(f"/ui/receipts/{op}")
    assert r.status_code == 302 and "/login" in r.headers["Location"]
    csrf = page_token(client, "/login")
    r = client.post("/login", data={"token": "wrong", "csrf_token": csrf})
    assert r.status_code == 401 and client.get("/").status_code == 302
    r = client.post("/login", data={"token": TOKEN, "csrf_token": csrf, "next": f"/ui/receipts/{op}"})
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/ui/receipts/{op}")
    assert TOKEN not in r.headers["Set-Cookie"]
    assert client.get(f"/ui/receipts/{op}").status_code == 200
    assert client.get("/metrics").status_code == 200  # the login cookie opens the rest too
    client.post("/logout", data={"csrf_token": page_token(client, "/")})
    assert client.get("/").status_code == 302


def test_off_loopback_needs_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError) as err:
        config_for(tmp_path, "admin: {enabled: true, listen_host: 0.0.0.0}")
    assert "\n" not in str(err.value) and "admin" in str(err.value) and "RECEIPTS_ADMIN_TOKEN" in str(err.value)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert config_for(tmp_path, f"admin: {{listen_host: '{host}'}}").admin.loopback
    monkeypatch.setenv("OPS_TOKEN", TOKEN)
    config = config_for(tmp_path, "admin: {listen_host: 0.0.0.0, token_env: OPS_TOKEN}")
    assert config.admin.token == TOKEN and TOKEN not in repr(config.admin.model_dump())


def test_without_a_token_only_loopback_host_names_are_served(client):
    assert client.get("/receipts").status_code == 200
    assert client.get("/receipts", headers={"Host": "127.0.0.1:8081"}).status_code == 200
    r = client.get("/receipts", headers={"Host": "attacker.example:8081"})  # DNS rebinding
    assert r.status_code == 421


def test_forms_need_their_csrf_token_and_origin(client, sqlite_store):
    op = made(sqlite_store, State.OUTCOME_UNKNOWN)
    url = f"/ui/receipts/{op}/resolve"
    form = {"state": "safe_to_retry", "note": "checked: not there"}
    assert client.post(url, data=form).status_code == 403  # no session, no token
    csrf = page_token(client, f"/ui/receipts/{op}")
    assert client.post(url, data={**form, "csrf_token": "0" * 64}).status_code == 403
    r = client.post(url, data={**form, "csrf_token": csrf}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = client.post(url, data={**form, "csrf_token": csrf}, headers={"Origin": "null"})
    assert r.status_code == 403
    r = client.post(f"/receipts/{op}/resolve", json=form, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and sqlite_store.receipts.get(op).state == "outcome_unknown"

    r = client.post(url, data={**form, "note": "", "csrf_token": csrf}, headers={"Origin": "http://localhost"})
    assert r.status_code == 422 and "a note is required" in r.get_data(as_text=True)
    r = client.post(url, data={**form, "csrf_token": csrf}, headers={"Origin": "http://localhost"})
    assert r.status_code == 303 and sqlite_store.receipts.get(op).state == "safe_to_retry"
    page = client.get(r.headers["Location"]).get_data(as_text=True)
    assert "Resolved" in page and "checked: not there" in page and 'id="resolve"' not in page


def test_everything_shown_is_escaped(client, sqlite_store):
    evil = "/x/<script>alert('path')</script>"
    op = made(sqlite_store, State.MANUAL_REVIEW, timedelta(minutes=11), path=evil)
    csrf = page_token(client, f"/ui/receipts/{op}")
    note = "<script>alert('note')</script> & <b>bold</b>"
    r = client.post(f"/ui/receipts/{op}/resolve", data={"state": "succeeded", "note": note, "external_id": "<img src=x>",
                                                        "who": "<i>me</i>", "csrf_token": csrf})
    assert r.status_code == 303
    other = made(sqlite_store, State.OUTCOME_UNKNOWN, path=evil + "/2")
    pages = [client.get("/?state=open").get_data(as_text=True), client.get(f"/ui/receipts/{op}").get_data(as_text=True),
             client.get(f"/ui/receipts/{other}").get_data(as_text=True)]
    for html in pages:
        assert "<script" not in html and "<img" not in html and "<i>me" not in html and "<b>bold" not in html
        assert "&lt;script&gt;alert(" in html
    assert "&lt;script&gt;alert(&#39;note&#39;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in pages[1]
    assert "default-src 'none'" in client.get("/").headers["Content-Security-Policy"]


def test_the_list_page_filters(client, sqlite_store):
    old = made(sqlite_store, State.OUTCOME_UNKNOWN, timedelta(minutes=30))
    fresh = made(sqlite_store, State.OUTCOME_UNKNOWN)
    done = made(sqlite_store, State.SUCCEEDED, status_code=201)
    html = client.get("/").get_data(as_text=True)
    assert old in html and fresh in html and done not in html  # open receipts only
    html = client.get("/?state=unknown&older_than=10m").get_data(as_text=True)
    assert old in html and fresh not in html and "30m" in html
    assert client.get("/?older_than=whenever").status_code == 400


def test_openapi_document_is_valid(client):
    doc = client.get("/openapi.json").get_json()
    validate_spec(doc)
    assert {"/receipts", "/receipts/{operation_id}", "/receipts/{operation_id}/proof",
            "/receipts/{operation_id}/resolve", "/metrics"} <= set(doc["paths"])
    broken = json.loads(json.dumps(doc))
    broken["paths"]["/receipts"]["get"]["responses"] = "everything"
    with pytest.raises(Exception):
        validate_spec(broken)


# -- the real server -------------------------------------------------------------------------------------------


def test_the_real_server_on_a_loopback_port(sqlite_store, tmp_path):
    op = made(sqlite_store, State.OUTCOME_UNKNOWN)
    config = config_for(tmp_path, "admin: {enabled: true, listen_port: 0}")
    server = AdminServer(config, sqlite_store).start()
    port = server.port
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.port > 0
        with httpx.Client(base_url=server.url, timeout=5, trust_env=False) as http:
            assert http.get(f"/receipts/{op}").json()["state"] == "outcome_unknown"
            metrics = http.get("/metrics")
            assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
            assert 'receipts_by_state{state="outcome_unknown"} 1.0' in metrics.text
            assert "receipts_store_up 1.0" in metrics.text
            assert re.search(r"receipts_oldest_open_age_seconds \d", metrics.text)
            r = http.post(f"/receipts/{op}/resolve", json={"state": "safe_to_retry", "note": "not there"})
            assert r.status_code == 200 and r.json()["state"] == "safe_to_retry"
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1, trust_env=False)


def test_receipts_admin_serves_standalone(sqlite_url, tmp_path):
    migrate(sqlite_url)
    port = free_port()
    (tmp_path / "config.yaml").write_text(f"secret_file: {tmp_path / 'secret'}\n")
    env = {**os.environ, "RECEIPTS_DATABASE_URL": sqlite_url, "RECEIPTS_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy_addon.cli", "admin", "--config", str(tmp_path / "config.yaml"),
         "--listen-port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/receipts", headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        else:
            pytest.fail("receipts admin did not answer within 20 s")
        assert r.status_code == 200 and r.json() == []
        assert httpx.get(f"http://127.0.0.1:{port}/receipts", timeout=1, trust_env=False).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and f"receipts admin on http://127.0.0.1:{port}" in out

    bad = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "admin", "--config", str(tmp_path / "config.yaml"),
         "--listen-host", "0.0.0.0"],
        cwd=REPO, env={k: v for k, v in env.items() if k != "RECEIPTS_ADMIN_TOKEN"}, capture_output=True, text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "token is required" in bad.stderr
