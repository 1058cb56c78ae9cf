"""Approval before a consequential write, end to end over REST: a real proxy, a real upstream, an httpx agent,
and the person's `receipts approvals`, `approve` and `deny` commands, and the admin API; receipts on SQLite
(test_approvals_store.py runs the decision on both databases, test_approvals_replicas.py the proxies on
PostgreSQL).

What is checked is what each side sees: the agent's 403 `approval-required` (the same approval while it is
pending), the person's list with the request as journaled (redacted), the one forwarded request after the
approval, and what a repeat, other arguments, a denial and an expiry get. Nothing sleeps: expiry is polled for,
bounded."""

import json

import httpx
import pytest
from support.e2e import PROBLEM_JSON, open_store, proxy_client, received, tag, wait_for
from support.proxy import start_inprocess_proxy
from support.server import free_port
from support.upstream import start_upstream

from proxy_addon.cli import main
from tests.conftest import migrate

SECRET = "Bearer agent-secret-5f1e"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("approvals")
    module_db_url = f"sqlite:///{tmp / 'receipts.db'}"  # what either side sees does not depend on the database
    migrate(module_db_url)
    up, short = start_upstream(), start_upstream()
    admin_port = free_port()
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        f"admin: {{enabled: true, listen_port: {admin_port}}}\n"
        "hosts:\n"
        f'  "127.0.0.1:{up.port}":\n'
        "    operations:\n"
        "      - {name: payments.send, method: POST, path: /payments, approval: required}\n"
        f'  "127.0.0.1:{short.port}": {{approval: {{required: true, expires: 300ms}}}}\n'
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield {"up": up, "short": short, "client": client, "store": store, "config": config, "url": module_db_url,
                   "admin": f"http://127.0.0.1:{admin_port}"}
    finally:
        proxy.stop()
        up.stop()
        short.stop()


@pytest.fixture
def person(env, monkeypatch, capsys):
    """The person's `receipts` command: (exit code, stdout)."""
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", env["url"])

    def run(*args: str) -> tuple[int, str]:
        code = main([*args, "--config", str(env["config"])])
        return code, capsys.readouterr().out

    return run


def send(env, body: dict, upstream: str = "up", path: str = "/payments"):
    url = f"http://127.0.0.1:{env[upstream].port}{path}"
    return env["client"].post(url, json=body, headers={"Authorization": SECRET})


def refused(response, kind: str) -> dict:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    document = response.json()
    assert document["type"].endswith(kind), document
    return document


def test_a_write_waits_for_approval_then_is_forwarded_once(env, person):
    body = {"to": "acct-" + tag(), "amount": 125}
    first = refused(send(env, body), "approval-required")
    approval_id = first["approval_id"]
    assert "a person must approve it" in first["detail"] and "sent again" in first["detail"]
    assert refused(send(env, body), "approval-required")["approval_id"] == approval_id  # one per intent
    assert received(env["up"], "/payments") == []  # nothing forwarded

    code, out = person("approvals", "--state", "pending", "--json")
    shown = next(a for a in json.loads(out) if a["approval_id"] == approval_id)
    assert code == 0 and shown["asked"] == 2 and shown["operation"] == "payments.send"
    assert shown["request"]["headers"]["authorization"] == "[REDACTED]"
    assert shown["request"]["body"]["document"] == body
    code, out = person("approvals")
    assert code == 0 and approval_id in out and '"amount": 125' in out and "agent-secret" not in out

    code, out = person("approve", approval_id, "--note", "invoice 88 checked", "--who", "alice")
    assert code == 0 and "pending -> approved" in out

    forwarded = send(env, body)
    assert forwarded.status_code == 201, forwarded.text
    operation_id = forwarded.headers["x-receipt-id"]
    assert len(received(env["up"], "/payments")) == 1
    repeat = send(env, body)  # answered from the receipt (this upstream's answer holds a secret field: not replayable)
    assert repeat.status_code == 409 and repeat.headers["x-receipt-id"] == operation_id
    assert len(received(env["up"], "/payments")) == 1

    used = env["store"].approvals.get(approval_id)
    assert (used.state, used.operation_id, used.decided_by, used.note) == ("used", operation_id, "alice", "invoice 88 checked")
    assert env["store"].receipts.history(operation_id)[0].detail["approval_id"] == approval_id


def test_other_arguments_need_another_approval(env, person):
    body = {"to": "acct-" + tag(), "amount": 5}
    approval_id = refused(send(env, body), "approval-required")["approval_id"]
    assert person("approve", approval_id, "--note", "ok")[0] == 0
    other = refused(send(env, {**body, "amount": 5000}), "approval-required")
    assert other["approval_id"] != approval_id
    assert received(env["up"], "/payments") == [] or all(json.loads(r.body)["amount"] != 5000 for r in received(env["up"], "/payments"))


def test_denied_is_refused_with_the_note(env, person):
    body = {"to": "acct-" + tag(), "amount": 9}
    approval_id = refused(send(env, body), "approval-required")["approval_id"]
    code, out = person("deny", approval_id, "--note", "not this customer", "--who", "bob")
    assert code == 0 and "pending -> denied" in out
    denied = refused(send(env, body), "approval-denied")
    assert denied["approval_id"] == approval_id and denied["note"] == "not this customer" and "bob" in denied["detail"]
    assert person("approve", approval_id, "--note", "changed my mind")[0] == 1  # decided already
    assert not any(json.loads(r.body)["to"] == body["to"] for r in received(env["up"], "/payments"))


def test_writes_the_rule_does_not_name_are_forwarded_at_once(env):
    response = send(env, {"title": tag()}, path="/things")
    assert response.status_code == 201 and response.headers["x-receipt-state"] == "succeeded"


def test_an_expired_request_asks_anew(env, person):
    body = {"n": tag()}
    approval_id = refused(send(env, body, "short", "/x"), "approval-required")["approval_id"]
    assert wait_for(lambda: env["store"].approvals.get(approval_id).state == "expired", timeout=10)
    assert person("approve", approval_id, "--note", "too late")[0] == 1
    again = refused(send(env, body, "short", "/x"), "approval-required")
    assert again["approval_id"] != approval_id
    assert received(env["short"], "/x") == []


# -- the admin API: for people, never for the agent through the proxy -------------------------------------------


def test_the_admin_api_lists_shows_and_decides(env):
    body = {"to": "acct-" + tag(), "amount": 77}
    approval_id = refused(send(env, body), "approval-required")["approval_id"]
    with httpx.Client(base_url=env["admin"], trust_env=False, timeout=10) as admin:
        before = metric(admin, 'receipts_approval_decisions_total{decision="approved"}')
        assert metric(admin, "receipts_approvals_pending") >= 1
        listed = admin.get("/approvals", params={"state": "pending"}).json()
        assert approval_id in [a["approval_id"] for a in listed]
        shown = admin.get(f"/approvals/{approval_id}").json()
        assert shown["request"]["headers"]["authorization"] == "[REDACTED]" and shown["asked"] == 1
        assert admin.get("/approvals", params={"state": "nope"}).status_code == 400
        assert admin.post(f"/approvals/{approval_id}/approve", json={}).status_code == 400  # a note is required
        assert admin.get("/approvals/ap_missing").status_code == 404
        decided = admin.post(f"/approvals/{approval_id}/approve", json={"note": "fine", "who": "carol"})
        assert decided.status_code == 200 and decided.json()["state"] == "approved"
        again = admin.post(f"/approvals/{approval_id}/deny", json={"note": "too late"})
        assert again.status_code == 409 and again.headers["content-type"] == PROBLEM_JSON
        assert metric(admin, 'receipts_approval_decisions_total{decision="approved"}') == before + 1
        assert approval_id not in [a["approval_id"] for a in admin.get("/approvals", params={"state": "pending"}).json()]
    assert send(env, body).status_code == 201


def metric(admin: httpx.Client, series: str) -> float:
    """One series' value from the admin server's /metrics."""
    lines = admin.get("/metrics").text.splitlines()
    return float(next(line.rsplit(" ", 1)[1] for line in lines if line.startswith(series + " ")))


def test_an_agent_cannot_list_or_approve_through_the_proxy(env):
    approval_id = refused(send(env, {"to": "acct-" + tag(), "amount": 1}), "approval-required")["approval_id"]
    client = env["client"]
    for method, path, body in (("GET", "/approvals", None), ("GET", f"/approvals/{approval_id}", None),
                               ("POST", f"/approvals/{approval_id}/approve", {"note": "self-approved"}),
                               ("POST", f"/approvals/{approval_id}/deny", {"note": "x"})):
        r = client.request(method, env["admin"] + path, json=body)
        assert r.status_code == 403 and r.json()["type"].endswith("forbidden-destination"), (method, path)
        assert approval_id not in r.text
    assert env["store"].approvals.get(approval_id).state == "pending"
