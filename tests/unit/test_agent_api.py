"""The agent API's parts, in process: the config key, `receipt_url` in the proxy's own problems (and in MCP's and
GraphQL's shapes), `foresee` deciding as `record` decides (SQLite and PostgreSQL) with nothing written, the
bridge's ASGI scope, the arguments' one-line errors, and the REST app scoped to the asker (Starlette's TestClient
over a real store)."""

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from mitmproxy.test import tflow
from starlette.testclient import TestClient

from proxy_addon.agent_api import bridge
from proxy_addon.agent_api.api import SCOPE_AGENT, agent_app
from proxy_addon.agent_api.receipts import OwnReceipts, wait_arg
from proxy_addon.agent_api.scope import AgentScope
from proxy_addon.config import AfterSuccess, parse_config
from proxy_addon.exceptions import BadRequestError, ConfigError, DuplicateIntentError
from proxy_addon.protocols.base import problem_of
from proxy_addon.rules import answers
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.records import Intent, new_operation_id

URL = "http://receipts.internal/receipts/"


# -- the config -------------------------------------------------------------------------------------------------


def test_the_agent_api_is_on_at_receipts_internal_unless_turned_off():
    on = parse_config("")
    assert (on.agent_api.enabled, on.agent_api.host) == (True, "receipts.internal")
    assert on.agent_api.receipt_url("op_1") == URL + "op_1"
    assert parse_config("agent_api: {enabled: false}").agent_api.receipt_url("op_1") is None
    assert parse_config("agent_api: {host: Receipts.Example.}").agent_api.host == "receipts.example"


@pytest.mark.parametrize("host", ["http://receipts.internal", "receipts.internal:80", "", "a b"])
def test_a_bad_host_is_one_line_naming_the_key(host):
    with pytest.raises(ConfigError, match=r"agent_api\.host: .* is not a host name") as e:
        parse_config(f"agent_api: {{host: '{host}'}}")
    assert "\n" not in str(e.value)


# -- receipt_url --------------------------------------------------------------------------------------------------


def test_every_problem_naming_a_receipt_gets_its_url_and_nothing_else_changes():
    named = answers.with_receipt_url(answers.duplicate_open("op_1", "outcome_unknown"), lambda op: URL + op)
    document = json.loads(named.body)
    assert document["receipt_url"] == URL + "op_1" and named.header("content-length") == str(len(named.body))
    unnamed = answers.journal_unavailable("down")
    assert answers.with_receipt_url(unnamed, lambda op: URL + op) is unnamed
    upstream = answers.exact(409, [(b"content-type", b"application/problem+json")], b'{"type": "x", "operation_id": "theirs"}')
    assert answers.with_receipt_url(upstream, lambda op: URL + op) is upstream  # an upstream's own problem: untouched
    off = answers.duplicate_open("op_1", "submitted")
    assert answers.with_receipt_url(off, lambda op: None) is off


def test_mcp_and_graphql_answers_name_the_receipt_url_too():
    from proxy_addon.protocols.graphql import GraphQLCall
    from proxy_addon.protocols.jsonrpc import McpToolCall

    problem = answers.with_receipt_url(answers.outcome_unknown("op_2", "No answer"), lambda op: URL + op)
    assert problem_of(problem).receipt_url == URL + "op_2"
    tool_error = json.loads(McpToolCall(tool="pay", request_id=7, has_id=True).answer(problem).body)
    assert tool_error["result"]["isError"] and URL + "op_2" in tool_error["result"]["content"][0]["text"]
    errors = json.loads(GraphQLCall().answer(problem).body)["errors"]
    assert errors[0]["extensions"]["receipt_url"] == URL + "op_2"


# -- foresee decides as record decides, writing nothing -------------------------------------------------------------


def intent(fingerprint: str, key: str | None = None) -> Intent:
    return Intent(
        operation_id=new_operation_id(), operation="POST a /x", method="POST", scheme="https", host="a", port=443,
        path="/x", intent_fingerprint=fingerprint, account="acct", idempotency_key=key, proxy_instance="test",
    )


def counts(store) -> tuple[int, int]:
    with store.db.engine.connect() as conn:
        return tuple(conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar_one() for t in ("receipts", "approvals"))


def test_foresee_says_what_record_then_does(store):
    replay = AfterSuccess(policy="replay", window=900)
    first = intent("sha256:aa")
    assert store.receipts.foresee(first, replay).blocker is None
    store.receipts.record_and_submit(first, replay, "test")
    again = intent("sha256:aa")
    before = counts(store)
    foreseen = store.receipts.foresee(again, replay)
    assert counts(store) == before
    assert foreseen.blocker.receipt.operation_id == first.operation_id and foreseen.blocker.kind == "open"
    with pytest.raises(DuplicateIntentError) as refused:
        store.receipts.record_and_submit(again, replay, "test")
    assert refused.value.operation_id == first.operation_id


def test_foresee_finds_the_approval_record_would_use_answer_or_ask_for(store):
    ask = ApprovalAsk(3600)
    wanted = intent("sha256:bb")
    assert store.receipts.foresee(wanted, AfterSuccess(), ask).asks_approval
    assert counts(store) == (0, 0)  # nothing asked for by foreseeing it
    from proxy_addon.exceptions import ApprovalNeededError

    with pytest.raises(ApprovalNeededError) as asked:
        store.receipts.record_and_submit(wanted, AfterSuccess(), "test", ask)
    pending = store.receipts.foresee(intent("sha256:bb"), AfterSuccess(), ask).approval
    assert (pending.approval_id, pending.state) == (asked.value.approval.approval_id, "pending")
    store.approvals.decide(pending.approval_id, "approve", "fine", "test")
    usable = store.receipts.foresee(intent("sha256:bb"), AfterSuccess(), ask)
    assert (usable.approval.state, usable.blocker, usable.asks_approval) == ("approved", None, False)
    assert store.approvals.get(pending.approval_id).state == "approved"  # not used up by foreseeing it


# -- the bridge's scope and the arguments ---------------------------------------------------------------------------


def test_the_scope_keeps_the_query_as_sent_and_the_scheme_in_lower_case():
    flow = tflow.tflow()
    flow.request.scheme, flow.request.host = "https", "receipts.internal"
    flow.request.path = "/receipts?operation=a%26b&state=open"
    scope = bridge.scope_of(flow, {SCOPE_AGENT: AgentScope("billing")})
    assert (scope["scheme"], scope["path"], scope["query_string"]) == ("https", "/receipts", b"operation=a%26b&state=open")
    assert scope[SCOPE_AGENT] == AgentScope("billing")


@pytest.mark.parametrize("value, seconds", [("30s", 30.0), ("1m", 60.0), (0, 0.0), ("2.5", None)])
def test_wait_is_a_bounded_duration(value, seconds):
    if seconds is None:
        with pytest.raises(BadRequestError, match="wait: invalid duration"):
            wait_arg(value)
    else:
        assert wait_arg(value) == seconds
    with pytest.raises(BadRequestError, match=r"wait: at most 60s"):
        wait_arg("61s")


# -- the REST app, scoped ------------------------------------------------------------------------------------------


def seeded(store, agent: str | None, fingerprint: str) -> str:
    i = replace(intent(fingerprint), agent=agent)
    store.receipts.record_and_submit(i, AfterSuccess(), "test")
    return i.operation_id


def client_as(store, agent: str | None) -> TestClient:
    from concurrent.futures import ThreadPoolExecutor

    config = parse_config("")
    sources = SimpleNamespace(config=config, store=store, hasher=None, instance_id="test")
    app = agent_app(OwnReceipts(lambda: sources, ThreadPoolExecutor(1)))

    async def as_agent(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app({**scope, SCOPE_AGENT: AgentScope(agent)}, receive, send)

    return TestClient(as_agent, base_url="http://receipts.internal")


def test_each_agent_lists_and_reads_only_its_own(store):
    mine, theirs, anonymous = seeded(store, "billing", "sha256:01"), seeded(store, "support", "sha256:02"), seeded(store, None, "sha256:03")
    with client_as(store, "billing") as billing, client_as(store, None) as anon:
        assert [r["operation_id"] for r in billing.get("/receipts").json()] == [mine]
        assert [r["operation_id"] for r in anon.get("/receipts").json()] == [anonymous]
        assert billing.get(f"/receipts/{mine}").json()["receipt_url"] == URL + mine
        assert billing.get(f"/receipts/{theirs}").status_code == 404
        assert billing.get(f"/receipts/{anonymous}?wait=0s").status_code == 404
        bad = billing.get("/receipts?limit=0")
        assert bad.status_code == 400 and bad.json()["detail"] == "limit must be between 1 and 200"
        invalid = billing.post("/check", json={"method": "POST"})
        assert invalid.status_code == 422 and invalid.json()["detail"].startswith("url: ")


# -- the addon: which flows it answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("config, host, answered", [
    ("", "receipts.internal", True),
    ("", "RECEIPTS.INTERNAL.", True),
    ("", "api.example.com", False),
    ("agent_api: {enabled: false}", "receipts.internal", False),  # an ordinary host then: forwarded
    ("agent_api: {host: receipts.corp.example}", "receipts.corp.example", True),
])
def test_the_addon_answers_the_reserved_host_only_while_it_is_on(config, host, answered):
    from proxy_addon.addons.agent_api import AgentAPI, answered_here

    addon = AgentAPI(SimpleNamespace(config=parse_config(config), handler=None), forbidden=None)
    flow = tflow.tflow()
    flow.request.host = host
    addon.requestheaders(flow)
    assert answered_here(flow) is answered
    connect = tflow.tflow()
    connect.request.host = host
    addon.http_connect(connect)
    assert (connect.response is not None) is answered  # the tunnel's end is the proxy: nothing is connected
