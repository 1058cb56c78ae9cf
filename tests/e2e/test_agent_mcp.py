"""The agent's own receipts as an MCP server, with the official SDK's `Client`: through the proxy at
`http://receipts.internal/mcp` (streamable HTTP; at protocol 2026-07-28 and at the handshake era), and over stdio
against `receipts mcp --agent NAME`. Its tools are read only and say when to call them; each agent sees its own
receipts; an agent whose write timed out finds it after a restart, waits for the reconciler's verdict with
`wait_for_receipt`, and `check_write` tells it that a retry would not be sent again.
"""

import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from support.agents_env import AgentsEnv, agents_env
from support.e2e import settled, tag, wait_for
from support.mcp_server import mcp_client
from support.proxy import REPO
from support.world import COMMIT_THEN_HANG

from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler

MCP_URL = "http://receipts.internal/mcp"
TOOLS = {"list_receipts", "get_receipt", "wait_for_receipt", "check_write"}


class Env(AgentsEnv):
    def write(self, agent: str | None, title: str) -> Any:
        import httpx

        with httpx.Client(proxy=self.proxy_url(agent), trust_env=False, timeout=30) as client:
            return client.post(f"{self.world.base}/api/articles", json={"title": title, "body_markdown": "x"})


@pytest.fixture(scope="module")
def env(module_db_url, tmp_path_factory) -> Iterator[Env]:
    with agents_env(Env, module_db_url, tmp_path_factory.mktemp("agent_mcp")) as started:
        yield started


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return result.structured_content


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_client_through_the_proxy_sees_its_own_receipts(env: Env, mode: str):
    mine = env.write("billing", f"mcp-{tag()}").headers["x-receipt-id"]
    theirs = env.write("support", f"mcp-{tag()}").headers["x-receipt-id"]

    async def scenario() -> tuple[Any, ...]:
        async with mcp_client(env.proxy_url("billing"), MCP_URL, mode) as client:
            tools = (await client.list_tools()).tools
            listed = structured(await client.call_tool("list_receipts", {"limit": 200}))
            one = structured(await client.call_tool("get_receipt", {"operation_id": mine}))
            other = await client.call_tool("get_receipt", {"operation_id": theirs})
            bad = await client.call_tool("list_receipts", {"state": "nope"})
        return tools, listed, one, other, bad

    tools, listed, one, other, bad = asyncio.run(scenario())
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.annotations.read_only_hint is True
        assert "Call it" in tool.description  # when to call it, said to a model
    assert "before you retry" in next(t for t in tools if t.name == "get_receipt").description
    ids = [r["operation_id"] for r in listed["receipts"]]
    assert mine in ids and theirs not in ids
    assert (one["operation_id"], one["state"], one["open"]) == (mine, "succeeded", False)
    assert other.is_error and f"no receipt {theirs}" in other.content[0].text  # as for one that does not exist
    assert bad.is_error and "unknown state 'nope'" in bad.content[0].text


def test_after_a_timeout_the_agent_finds_its_write_waits_for_the_verdict_and_is_told_not_to_resend(env: Env):
    title = f"mcp-restart-{tag()}"
    env.world.article_mode = COMMIT_THEN_HANG
    try:
        lost = env.write("support", title)
    finally:
        env.world.article_mode = "ok"
    assert lost.status_code == 504
    operation_id = lost.json()["operation_id"]
    settled(env.store, operation_id)
    request = {"method": "POST", "url": f"{env.world.base}/api/articles", "headers": {"content-type": "application/json"},
               "body": {"title": title, "body_markdown": "x"}}

    async def scenario() -> tuple[Any, ...]:
        async with mcp_client(env.proxy_url("support"), MCP_URL) as client:  # a new session: the agent restarted
            unknown = structured(await client.call_tool("list_receipts", {"state": "unknown"}))
            before = structured(await client.call_tool("check_write", request))
            waiting = asyncio.create_task(client.call_tool("wait_for_receipt", {"operation_id": operation_id, "timeout_seconds": 60}))
            api = env.proxy.master.addons.get("agentapi")
            await asyncio.to_thread(wait_for, lambda: api.receipts.waiters.waiting == 1, 15)
            await asyncio.to_thread(lambda: asyncio.run(Reconciler(load_config(env.config), env.store).run_once()))
            verdict = structured(await waiting)
            after = structured(await client.call_tool("check_write", request))
        return unknown, before, verdict, after

    unknown, before, verdict, after = asyncio.run(scenario())
    assert operation_id in [r["operation_id"] for r in unknown["receipts"]]
    assert (before["decision"], before["problem"], before["operation_id"]) == ("refuse", "duplicate-open", operation_id)
    assert before["receipt"]["operation_id"] == operation_id  # its own: shown whole
    assert (verdict["state"], verdict["open"]) == ("succeeded", False)
    assert after["decision"] in ("replay", "refuse") and after["operation_id"] == operation_id
    assert len(env.world.article_ids_titled(title)) == 1


def test_receipts_mcp_over_stdio(env: Env):
    """`receipts mcp --agent billing` as an agent host starts it from its config file: the SDK's stdio client."""
    mine = env.write("billing", f"stdio-{tag()}").headers["x-receipt-id"]
    theirs = env.write(None, f"stdio-{tag()}").headers["x-receipt-id"]
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "proxy_addon.cli", "mcp", "--agent", "billing", "--config", str(env.config)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "RECEIPTS_DATABASE_URL": env.database_url},
        cwd=str(env.config.parent),
    )

    async def scenario() -> tuple[Any, ...]:
        async with Client(server, read_timeout_seconds=60) as client:
            tools = (await client.list_tools()).tools
            listed = structured(await client.call_tool("list_receipts", {"limit": 200}))
            one = structured(await client.call_tool("wait_for_receipt", {"operation_id": mine, "timeout_seconds": 5}))
            other = await client.call_tool("get_receipt", {"operation_id": theirs})
            check = structured(await client.call_tool("check_write", {
                "method": "POST", "url": f"{env.world.base}/api/articles", "body": {"title": f"new-{tag()}", "body_markdown": "x"},
            }))
        return tools, listed, one, other, check

    tools, listed, one, other, check = asyncio.run(scenario())
    assert {t.name for t in tools} == TOOLS
    ids = [r["operation_id"] for r in listed["receipts"]]
    assert mine in ids and theirs not in ids
    assert one["state"] == "succeeded"  # settled already: answered at once
    assert other.is_error
    assert (check["decision"], check["operation"]) == ("forward", "articles.create")


def test_receipts_mcp_refuses_an_agent_the_config_does_not_name(env: Env):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "mcp", "--agent", "nobody", "--config", str(env.config)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "RECEIPTS_DATABASE_URL": env.database_url},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["receipts: agent 'nobody' is not in the config's agents: (receipts agents ls)"]

