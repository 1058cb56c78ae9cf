"""The agent's own receipts through a real proxy, with real clients (httpx, curl): the REST API at
`receipts.internal` over plain HTTP and HTTPS, never forwarded nor journaled, scoped to the asking agent (two agents
with their own tokens cannot see each other's receipts; anonymous agents share one scope), read only, with its
OpenAPI document; an agent restarted after a 504 finds its unknown receipt, waits, and gets the reconciler's
verdict; the admin API stays forbidden; and under plain `mitmdump -s` (connection_strategy eager) no connection
to the reserved host is ever tried.
"""

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openapi_spec_validator import validate
from support.agents_env import TOKENS, AgentsEnv, agents_env
from support.e2e import settled, stop_process, tag, wait_for
from support.proxy import REPO
from support.server import free_port, listens
from support.world import COMMIT_THEN_HANG

from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.views.documents import dumps, show_document
from tests.conftest import migrate

API = "http://receipts.internal"


class Env(AgentsEnv):
    def client(self, agent: str | None = None, **kw) -> httpx.Client:
        """A client of this agent, or an anonymous one, trusting the proxy's CA."""
        trusted = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(proxy=self.proxy_url(agent), trust_env=False, timeout=60, verify=trusted, **kw)

    def write(self, client: httpx.Client, title: str) -> httpx.Response:
        return client.post(f"{self.world.base}/api/articles", json={"title": title, "body_markdown": "x"})


@pytest.fixture(scope="module")
def env(module_db_url, tmp_path_factory) -> Iterator[Env]:
    with agents_env(Env, module_db_url, tmp_path_factory.mktemp("agent_api"), admin_port=free_port()) as started:
        yield started


def problem_type(r: httpx.Response) -> str:
    assert r.headers["content-type"] == "application/problem+json", r.text
    return r.json()["type"].rsplit(":", 1)[1]


def test_over_http_and_https_never_journaled_nor_forwarded(env: Env):
    with env.client("billing") as billing:
        made = env.write(billing, f"t-{tag()}")
        assert made.status_code == 201
        before = len(env.store.receipts.list(limit=None))
        upstream_before = len(env.world.requests)
        for base in (API, "https://receipts.internal"):
            mine = billing.get(f"{base}/receipts")
            assert mine.status_code == 200 and mine.headers["content-type"] == "application/json"
            assert made.headers["x-receipt-id"] in [r["operation_id"] for r in mine.json()]
            one = billing.get(f"{base}/receipts/{made.headers['x-receipt-id']}").json()
            assert (one["state"], one["open"], one["retry"]["decision"]) == ("succeeded", False, "replayed")
            assert one["request"]["method"] == "POST" and one["transitions"][0]["to_state"] == "planned"
            assert "x-receipt-id" not in mine.headers
        refused = billing.post(f"{API}/receipts", json={})  # read only
        assert refused.status_code == 405 and problem_type(refused) == "method-not-allowed"
    assert len(env.store.receipts.list(limit=None)) == before
    assert len(env.world.requests) == upstream_before


def test_its_openapi_document_is_valid_and_describes_what_it_serves(env: Env):
    with env.client() as anonymous:
        document = anonymous.get(f"{API}/openapi.json").json()
    validate(document)
    assert set(document["paths"]) == {"/receipts", "/receipts/{operation_id}", "/check", "/openapi.json"}
    assert document["paths"]["/check"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Check"
    }
    decisions = document["components"]["schemas"]["CheckDecision"]["properties"]["decision"]["enum"]
    assert set(decisions) == {"forward", "replay", "refuse", "approval_required", "not_journaled"}


def test_two_agents_cannot_see_each_others_receipts(env: Env):
    with env.client("billing") as billing, env.client("support") as support, env.client() as anonymous:
        bill = env.write(billing, f"bill-{tag()}").headers["x-receipt-id"]
        supp = env.write(support, f"supp-{tag()}").headers["x-receipt-id"]
        anon = env.write(anonymous, f"anon-{tag()}").headers["x-receipt-id"]
        seen = {name: {r["operation_id"] for r in c.get(f"{API}/receipts?limit=200").json()}
                for name, c in (("billing", billing), ("support", support), ("anonymous", anonymous))}
        assert bill in seen["billing"] and supp in seen["support"] and anon in seen["anonymous"]
        assert not {supp, anon} & seen["billing"] and not {bill, anon} & seen["support"]
        assert not {bill, supp} & seen["anonymous"]
        assert {r.agent for r in env.store.receipts.list(limit=None) if r.operation_id in seen["billing"]} == {"billing"}
        # another agent's receipt is answered as one that does not exist: nothing tells them apart
        theirs, none = billing.get(f"{API}/receipts/{supp}"), billing.get(f"{API}/receipts/op_{'0' * 32}")
        assert theirs.status_code == none.status_code == 404
        assert theirs.json()["detail"].replace(supp, "ID") == none.json()["detail"].replace(f"op_{'0' * 32}", "ID")
        assert billing.get(f"{API}/receipts/{supp}?wait=1s").status_code == 404
        paged = billing.get(f"{API}/receipts", params={"after": supp})
        assert paged.status_code == 400 and problem_type(paged) == "bad-request"


def test_what_an_agent_is_shown_is_redacted_as_the_operators_views_and_never_holds_its_token(env: Env):
    secret = f"sk-live-{tag()}"
    article = {"title": f"secret-{tag()}", "body_markdown": "x", "password": secret}
    headers = {"Authorization": f"Bearer {secret}"}
    with env.client("billing") as billing:
        op = billing.post(f"{env.world.base}/api/articles", json=article, headers=headers).headers["x-receipt-id"]
        settled(env.store, op)  # its verdict committed (it may commit while the answer travels)
        shown = billing.get(f"{API}/receipts/{op}")
        listed = billing.get(f"{API}/receipts")
        checked = billing.post(f"{API}/check", json={"method": "POST", "url": f"{env.world.base}/api/articles",
                                                     "headers": headers, "body": article})
    for answer in (shown, listed, checked):
        assert secret not in answer.text and TOKENS["billing"] not in answer.text
    operator = json.loads(dumps(show_document(env.store.receipts.get(op), env.store.receipts.history(op))))
    assert shown.json()["request"] == operator["request"] and shown.json()["response"] == operator["response"]
    assert {k: v for k, v in shown.json().items() if k in operator and k != "transitions"} == {
        k: v for k, v in operator.items() if k != "transitions"
    }
    assert (checked.json()["decision"], checked.json()["operation_id"]) == ("replay", op)  # the same account's repeat


def test_a_page_names_the_next_and_filters_hold(env: Env):
    with env.client("support") as support:
        titles = [f"page-{tag()}" for _ in range(3)]
        ids = [env.write(support, t).headers["x-receipt-id"] for t in titles]
        first = support.get(f"{API}/receipts", params={"limit": 2, "operation": "articles.create", "since": "10m"})
        assert [r["operation_id"] for r in first.json()] == ids[::-1][:2]
        link = first.headers["link"]
        assert link.endswith('>; rel="next"') and "operation=articles.create" in link
        second = support.get(API + link[1: link.index(">")])
        assert second.json()[0]["operation_id"] == ids[0]
        assert support.get(f"{API}/receipts", params={"state": "open"}).json() == []
        bad = support.get(f"{API}/receipts", params={"state": "nope"})
        assert bad.status_code == 400 and "unknown state 'nope'" in bad.json()["detail"]
        too_long = support.get(f"{API}/receipts/{ids[0]}", params={"wait": "5m"})
        assert too_long.status_code == 400 and "at most 60s" in too_long.json()["detail"]


def test_curl_over_http_and_https(env: Env, tmp_path):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    with env.client() as anonymous:
        made = env.write(anonymous, f"curl-{tag()}").headers["x-receipt-id"]
    for url, extra in ((f"{API}/receipts/{made}", []), (f"https://receipts.internal/receipts/{made}", ["--cacert", str(env.ca)])):
        done = subprocess.run([curl, "-sS", "--fail-with-body", "-x", env.proxy.url, *extra, url],
                              capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
        assert done.returncode == 0, done.stderr + done.stdout
        assert json.loads(done.stdout)["operation_id"] == made


def test_an_agent_restarted_after_a_504_finds_its_unknown_receipt_and_waits_for_the_verdict(env: Env):
    """The agent's write times out (504, the upstream made the article and hung); the agent restarts with no memory
    of it, lists its unknown receipts, finds it, and waits on it while the reconciler reads the upstream: the wait
    returns with the verdict, not at its timeout."""
    title = f"restart-{tag()}"
    env.world.article_mode = COMMIT_THEN_HANG
    try:
        with env.client("billing") as before_restart:
            lost = env.write(before_restart, title)
    finally:
        env.world.article_mode = "ok"
    assert lost.status_code == 504 and problem_type(lost) == "outcome-unknown"
    operation_id = lost.json()["operation_id"]
    assert lost.json()["receipt_url"] == f"{API}/receipts/{operation_id}"
    settled(env.store, operation_id)

    with env.client("billing") as agent:  # restarted: it knows nothing but where to ask
        unknown = agent.get(f"{API}/receipts", params={"state": "unknown"}).json()
        assert operation_id in [r["operation_id"] for r in unknown]
        answer: dict = {}
        waiting = threading.Thread(target=lambda: answer.update(agent.get(f"{API}/receipts/{operation_id}?wait=60s").json()))
        waiting.start()
        api = env.proxy.master.addons.get("agentapi")
        assert wait_for(lambda: api.receipts.waiters.waiting == 1, 15), "the wait did not begin"
        asyncio.run(Reconciler(load_config(env.config), env.store).run_once())
        waiting.join(30)
    assert not waiting.is_alive()
    assert (answer["state"], answer["open"], answer["external_id"]) == ("succeeded", False, env.world.article_ids_titled(title)[0])
    assert answer["what_happened"].startswith("The reconciler found it upstream")
    assert env.world.received("POST", "/api/articles") and len(env.world.article_ids_titled(title)) == 1


def test_the_admin_api_stays_forbidden_and_the_agent_api_settles_nothing(env: Env):
    with env.client("billing") as billing:
        admin = billing.get(f"http://127.0.0.1:{env.admin_port}/receipts")
        assert admin.status_code == 403 and problem_type(admin) == "forbidden-destination"
        op = env.write(billing, f"adm-{tag()}").headers["x-receipt-id"]
        settled(env.store, op)
        resolve = billing.post(f"{API}/receipts/{op}/resolve", json={"state": "succeeded", "note": "mine"})
        assert resolve.status_code in (404, 405)
        assert env.store.receipts.get(op).state == "succeeded"


# -- plain mitmdump: connection_strategy eager ---------------------------------------------------------------


class Listener:
    """A TCP port that counts the connections made to it (and closes them)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def test_under_mitmdump_no_connection_to_the_reserved_host_is_tried(tmp_path):
    """Plain `mitmdump -s` connects to the server before it answers a CONNECT, and asks its certificate first
    (connection_strategy eager). With the reserved host on a port something listens on, nothing connects to it,
    over HTTP or HTTPS; the same port under another name is connected to (the listener counts)."""
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(url)
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\nagent_api: {{host: localhost}}\n")
    listener, port = Listener(), free_port()
    mitmdump = str(Path(sys.executable).parent / "mitmdump")
    log_path = tmp_path / "mitmdump.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [mitmdump, "--listen-host", "127.0.0.1", "-p", str(port), "--set", f"confdir={tmp_path / 'confdir'}",
             "-s", str(REPO / "proxy_addon" / "addon.py"), "--set", f"receipts_config={config}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path), env={**os.environ, "RECEIPTS_DATABASE_URL": url},
        )
    try:
        assert wait_for(lambda: listens(proc.pid, port) or proc.poll() is not None, 30) and proc.poll() is None, log_path.read_text()
        ca = tmp_path / "confdir" / "mitmproxy-ca-cert.pem"
        trusted = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(proxy=f"http://127.0.0.1:{port}", trust_env=False, timeout=30, verify=trusted) as client:
            for scheme in ("http", "https"):
                r = client.get(f"{scheme}://localhost:{listener.port}/receipts")
                assert r.status_code == 200 and r.json() == [], r.text
            assert listener.accepted == 0, log_path.read_text()
            try:  # the listener speaks no TLS: mitmproxy fails the tunnel, or answers 502, as its timing falls
                assert client.get(f"https://127.0.0.1:{listener.port}/receipts", timeout=3).status_code >= 500
            except httpx.HTTPError:
                pass
        assert listener.accepted >= 1  # the listener counts what does connect
    finally:
        stop_process(proc)
        listener.sock.close()
