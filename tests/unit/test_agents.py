"""Agents (agents/): names, tokens and their salted hashes; the `agents:` config; AgentAuth, mitmproxy's ProxyAuth
checking the configured agents, in a taddons context; the metric's label, bounded by the configured names.
Through a real proxy with real clients: e2e/test_agents_e2e.py."""

import base64
from types import SimpleNamespace

import pytest
from mitmproxy.test import taddons, tflow
from prometheus_client.parser import text_string_to_metric_families
from support.e2e import read_until
from support.handler import post

from proxy_addon import metrics, tracing
from proxy_addon.addons.agent_auth import AgentAuth
from proxy_addon.agents.identity import agent_of
from proxy_addon.agents.tokens import HASH_PATTERN, check_hash, check_name, new_token, token_hash, token_matches
from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.request.sender import SendEnd, SendResult

BILLING, SUPPORT = new_token(), new_token()


# -- tokens and names ---------------------------------------------------------------------------------------


def test_a_token_is_checked_against_its_salted_hash_and_nothing_else():
    stored = token_hash(BILLING)
    assert HASH_PATTERN.match(stored) and BILLING not in stored
    assert token_matches(BILLING, stored)
    assert not token_matches(SUPPORT, stored) and not token_matches(BILLING[:-1], stored) and not token_matches("", stored)
    assert token_hash(BILLING) != stored  # a new salt each time: equal tokens do not have equal hashes
    assert token_hash(BILLING, bytes(16)) == token_hash(BILLING, bytes(16))
    assert len(BILLING) >= 43 and new_token() != BILLING  # 32 random bytes, URL-safe


@pytest.mark.parametrize("name", ["billing-agent", "a", "Agent_7.prod", "x" * 64])
def test_names_an_agent_may_have(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    ("name", "said"),
    [("", "invalid agent name"), ("bad name", "invalid agent name"), ("a:b", "invalid agent name"),
     ("a@b", "invalid agent name"), ("-a", "invalid agent name"), ("x" * 65, "invalid agent name"),
     ("é", "invalid agent name"), ("anonymous", "reserved"), ("Other", "reserved")],
)
def test_names_an_agent_may_not_have_are_refused_in_one_line(name, said):
    with pytest.raises(ValueError, match=said) as e:
        check_name(name)
    assert "\n" not in str(e.value)


def test_a_broken_hash_is_refused():
    with pytest.raises(ValueError, match="not a token hash"):
        check_hash("sha256$abc$def")
    with pytest.raises(ConfigError, match=r"agents\.billing\.token_hash: not a token hash"):
        parse_config("agents:\n  billing: {token_hash: " + BILLING + "}\n")  # a token pasted where its hash goes


def test_requiring_an_agent_needs_one_configured():
    with pytest.raises(ConfigError, match="proxy.require_agent is true, but agents: names no agent") as e:
        parse_config("proxy: {require_agent: true}\n")
    assert not str(e.value).startswith("config: config:")
    config = parse_config(f"proxy: {{require_agent: true}}\nagents:\n  billing: {{token_hash: '{token_hash(BILLING)}'}}\n")
    assert config.proxy.require_agent and set(config.agents) == {"billing"}
    assert parse_config("").agents == {} and not parse_config("").proxy.require_agent


# -- AgentAuth ----------------------------------------------------------------------------------------------


def journal(required: bool = False, agents: tuple[str, ...] = ("billing", "support")) -> SimpleNamespace:
    tokens = {"billing": BILLING, "support": SUPPORT}
    listed = "".join(f"  {name}: {{token_hash: '{token_hash(tokens[name])}'}}\n" for name in agents)
    text = f"proxy: {{require_agent: {str(required).lower()}}}\n" + (f"agents:\n{listed}" if agents else "")
    return SimpleNamespace(config=parse_config(text))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def checked(addon: AgentAuth, credentials: str | None = None, connect: bool = False):
    """A flow through the addon's hook (http_connect for a CONNECT, else requestheaders), as a proxy sees it."""
    f = tflow.tflow()
    if connect:
        f.request.method = "CONNECT"
    if credentials is not None:
        f.request.headers["Proxy-Authorization"] = credentials
    with taddons.context(addon) as tctx:
        tctx.configure(addon)
        (addon.http_connect if connect else addon.requestheaders)(f)
    return f


def refused_407(f) -> bool:
    return f.response is not None and f.response.status_code == 407 and "Proxy-Authenticate" in f.response.headers


def test_a_configured_agent_is_known_by_its_name_and_its_token_goes_nowhere():
    addon = AgentAuth(journal())
    f = checked(addon, basic("billing", BILLING))
    assert f.response is None and agent_of(f) == "billing"
    assert "Proxy-Authorization" not in f.request.headers
    assert BILLING not in repr(f.metadata) and BILLING not in repr(f.get_state())


@pytest.mark.parametrize(
    "credentials",
    [basic("billing", SUPPORT), basic("nobody", BILLING), basic("billing", ""), "Bearer " + BILLING, "Basic !!!"],
)
@pytest.mark.parametrize("required", [True, False])
def test_wrong_credentials_get_407_whether_or_not_an_agent_is_required(credentials, required):
    f = checked(AgentAuth(journal(required)), credentials)
    assert refused_407(f) and agent_of(f) is None
    assert f.response.headers["Proxy-Authenticate"].startswith('Basic realm="receipts"')
    assert f.response.headers["Content-Type"] == "application/problem+json"
    assert b"agent-required" in f.response.content and BILLING.encode() not in f.response.content
    assert "Proxy-Authorization" not in f.request.headers  # the wrong token is not kept either


def test_without_credentials_an_agent_is_anonymous_unless_one_is_required():
    f = checked(AgentAuth(journal(required=False)))
    assert f.response is None and agent_of(f) is None
    assert refused_407(checked(AgentAuth(journal(required=True))))


def test_with_no_agent_configured_nothing_is_checked():
    f = checked(AgentAuth(journal(agents=())), basic("billing", BILLING))
    assert f.response is None and agent_of(f) is None
    assert f.request.headers["Proxy-Authorization"] == basic("billing", BILLING)  # as before agents existed


def test_a_tunnel_is_checked_once_at_its_connect_and_its_requests_are_that_agents():
    addon = AgentAuth(journal(required=True))
    connect = checked(addon, basic("support", SUPPORT), connect=True)
    assert connect.response is None and agent_of(connect) == "support"
    inner = tflow.tflow(client_conn=connect.client_conn)  # a request inside the tunnel carries no credentials
    with taddons.context(addon) as tctx:
        tctx.configure(addon)
        addon.requestheaders(inner)
    assert inner.response is None and agent_of(inner) == "support"
    assert all(BILLING not in str(v) and SUPPORT not in str(v) for v in addon.authenticated.values())
    assert refused_407(checked(addon, connect=True))


def test_an_agent_removed_from_the_config_loses_its_open_tunnels():
    state = journal(required=True)
    addon = AgentAuth(state)
    connect = checked(addon, basic("support", SUPPORT), connect=True)
    state.config = journal(required=True, agents=("billing",)).config
    inner = tflow.tflow(client_conn=connect.client_conn)
    with taddons.context(addon) as tctx:
        tctx.configure(addon)
        addon.requestheaders(inner)
    assert refused_407(inner)


# -- the metric's label ---------------------------------------------------------------------------------------


def agent_samples() -> dict[str, float]:
    body, _ = metrics.exposition(metrics.registry_for(None))
    return {s.labels["agent"]: s.value for family in text_string_to_metric_families(body.decode())
            for s in family.samples if s.name == "receipts_agent_journaled_total"}


def test_the_agent_label_is_a_configured_name_anonymous_or_other():
    metrics.name_agents(["billing", "support"])
    before = agent_samples()
    assert {"billing", "support", "anonymous", "other"} <= set(before)
    for agent in ("billing", "billing", None, "from-htpasswd", "another"):
        metrics.agent_journaled(agent)
    after = agent_samples()
    grew = {name: after[name] - before.get(name, 0.0) for name in after}
    assert grew == {**dict.fromkeys(after, 0.0), "billing": 2, "anonymous": 1, "other": 2}


# -- through the journal addon: the receipt names its agent; the agent decides nothing about duplicates ----------


def test_the_receipt_names_the_agent_and_another_agents_repeat_is_still_a_duplicate(journal):
    """Two agents sharing one API key are one account upstream: the second one's repeat of an intent still open
    is refused (the agent is not part of the intent's identity), and the refusal names who was refused."""
    run, addon, sender = journal(SendResult(SendEnd.TIMEOUT, error="read timeout"))
    first, again = post(), post()
    first.metadata["proxyauth"] = ("billing", "")
    again.metadata["proxyauth"] = ("support", "")
    run(first, again)
    assert addon.store is not None
    receipt = addon.store.receipts.get(first.response.headers["X-Receipt-Id"])
    assert receipt.agent == "billing" and receipt.state == "outcome_unknown"
    assert again.response.status_code == 409 and again.response.headers["X-Receipt-Id"] == receipt.operation_id
    assert len(sender.sent) == 1
    refusals = wait_for_refusals(addon.store, receipt.operation_id)
    assert [r.agent for r in refusals] == ["support"]


def wait_for_refusals(store, operation_id: str) -> list:
    """The refusals noted for this receipt (noted on a journal thread, not awaited by the answer)."""
    return read_until(lambda: store.refusals.list(blocking_operation_id=operation_id), bool, timeout=10)


def test_the_write_span_names_the_agent_and_an_anonymous_ones_names_none():
    facts = RequestFacts("POST", "https", "api.example.com", 443, "/charges", [], [], None, b"")
    assert "gen_ai.agent.name" not in tracing._request_attributes(facts)
    named = tracing._request_attributes(RequestFacts(**{**facts.__dict__, "agent": "billing-agent"}))
    assert named["gen_ai.agent.name"] == "billing-agent"
