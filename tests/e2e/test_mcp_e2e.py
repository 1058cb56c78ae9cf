"""MCP through the proxy, with the official SDK on both sides: its `Client` against an `MCPServer` over
streamable HTTP, at protocol 2026-07-28 (`mode="auto"`: server/discover, per-request envelopes) and at the
handshake era (`mode="legacy"`: initialize, Mcp-Session-Id, answers in server-sent events), on SQLite and
PostgreSQL.

Discovery and tools/list pass through; a tool call is journaled once, as `mcp tools/call <name>`; the same
call again (another session, another JSON-RPC id) is not executed twice and the model gets the tool result;
a call that times out gives the model an error result naming its receipt, and its retry is not executed; the
reconciler settles it by calling the server's read tool; a call that asks for more input (multi-round-trip)
is not refused when it continues.
"""

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp_types import ElicitResult
from support.asgi import AsgiServer, serve_asgi
from support.e2e import open_store, tag
from support.mcp_server import TicketDesk, mcp_client
from support.proxy import RunningProxy, start_inprocess_proxy
from support.shown import ls_table, review_page

from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.store import ReceiptStore

MODES = ["auto", "legacy"]
LIST_TICKETS = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "name": "list_tickets",
        "arguments": {},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}},
    },
}


@dataclass
class Env:
    proxy: RunningProxy
    store: ReceiptStore
    desk: TicketDesk
    server: AsgiServer
    config: Path
    database_url: str

    @property
    def url(self) -> str:
        return f"{self.server.base}/mcp"


@pytest.fixture(scope="module")
def env(module_db_url, tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("mcp")
    desk = TicketDesk()
    server = serve_asgi(desk.app())
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning}\n"
        "hosts:\n"
        f'  "127.0.0.1:{server.port}":\n'
        "    upstream_timeout: 2s\n"
        "    operations:\n"
        "      - name: tickets.slow\n"
        "        method: POST\n"
        "        path: /mcp\n"
        "        call: slow_ticket\n"
        "        retry_safe: true\n"
        "        reconcile:\n"
        "          strategy: search\n"
        "          method: POST\n"
        '          url: "{scheme}://{netloc}/mcp"\n'
        f"          body: {json.dumps(LIST_TICKETS)}\n"
        "          items: $.result.structuredContent.items\n"
        "          match: {$.title: $.params.arguments.title}\n"
        "          id: $.id\n"
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store:
            yield Env(proxy, store, desk, server, config, module_db_url)
    finally:
        proxy.stop()
        server.stop()


def receipts_of(env: Env, title: str) -> list[ReceiptRecord]:
    """The receipts whose journaled request names this title, oldest first."""
    found = [r for r in env.store.receipts.list(port=env.server.port, limit=None) if title in (r.request_body or b"").decode()]
    return sorted(found, key=lambda r: r.created_at)


def text_of(result) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "type", None) == "text")


@pytest.mark.parametrize("mode", MODES)
def test_discovery_passes_and_a_tool_call_is_journaled_once(env: Env, mode: str):
    title = f"ticket-{tag()}"

    async def scenario() -> tuple:
        async with mcp_client(env.proxy.url, env.url, mode) as client:
            tools = await client.list_tools()
            first = await client.call_tool("create_ticket", {"title": title})
            version = client.protocol_version
        async with mcp_client(env.proxy.url, env.url, mode) as client:  # another session
            await client.list_tools()
            await client.list_tools()  # so that the call's JSON-RPC id is another too
            again = await client.call_tool("create_ticket", {"title": title})
        return tools, first, again, version

    tools, first, again, version = asyncio.run(scenario())
    assert version == ("2026-07-28" if mode == "auto" else "2025-11-25")
    assert "create_ticket" in [t.name for t in tools.tools]
    assert not first.is_error and not again.is_error
    assert text_of(again) == text_of(first) and title in text_of(first)  # the model gets the tool's result
    assert env.desk.ran("create_ticket", title) == 1  # executed once
    [receipt] = receipts_of(env, title)  # discovery, initialize, tools/list, notifications: no receipts
    assert (receipt.operation, receipt.state) == ("mcp tools/call create_ticket", "succeeded")
    assert {r.operation for r in env.store.receipts.list(port=env.server.port, limit=None)} <= {
        f"mcp tools/call {name}" for name in ("create_ticket", "slow_ticket", "progress_ticket", "guarded_ticket")
    }


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_in_server_sent_events_is_journaled_and_replayed_under_the_new_id(env: Env, mode: str):
    title = f"progress-{tag()}"
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def scenario() -> tuple:
        async with mcp_client(env.proxy.url, env.url, mode) as client:
            await client.list_tools()
            first = await client.call_tool("progress_ticket", {"title": title}, progress_callback=on_progress)
            again = await client.call_tool("progress_ticket", {"title": title}, progress_callback=on_progress)
        return first, again

    first, again = asyncio.run(scenario())
    assert progress[:1] == [0.5]  # the first answer came as server-sent events, progress and all
    assert not again.is_error and text_of(again) == text_of(first)
    assert env.desk.ran("progress_ticket", title) == 1
    [receipt] = receipts_of(env, title)
    assert receipt.state == "succeeded" and json.loads(receipt.response_body)["result"]["content"]


@pytest.mark.parametrize("mode", MODES)
def test_a_call_that_times_out_tells_the_model_and_its_retry_is_not_executed(env: Env, mode: str):
    title = f"slow-{tag()}"

    async def scenario() -> tuple:
        async with mcp_client(env.proxy.url, env.url, mode) as client:
            await client.list_tools()
            first = await client.call_tool("slow_ticket", {"title": title, "seconds": 4})
            retry = await client.call_tool("slow_ticket", {"title": title, "seconds": 4})
        return first, retry

    first, retry = asyncio.run(scenario())
    [receipt] = receipts_of(env, title)
    assert receipt.state == "outcome_unknown" and receipt.operation == "mcp tools/call slow_ticket"
    assert first.is_error and receipt.operation_id in text_of(first) and "outcome_unknown" in text_of(first)
    assert retry.is_error and receipt.operation_id in text_of(retry) and "Duplicate of an open receipt" in text_of(retry)
    assert "Do not send it again" in text_of(retry)
    assert env.desk.ran("slow_ticket", title) == 1  # the retry never reached the server

    # the reconciler reads the server with its read tool and finds the ticket
    config = load_config(env.config)
    report = asyncio.run(Reconciler(config, env.store).run_once())
    assert report.claimed >= 1
    settled = env.store.receipts.get(receipt.operation_id)
    ticket = next(t for t in env.desk.tickets if t.title == title)
    assert (settled.state, settled.external_id) == ("succeeded", str(ticket.id))


def test_a_call_that_asks_for_more_input_continues_and_is_then_replayed(env: Env):
    title = f"guarded-{tag()}"
    asked: list[str] = []

    async def confirm(context, params) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"ok": True})

    async def scenario() -> tuple:
        async with mcp_client(env.proxy.url, env.url, "auto", elicitation_callback=confirm) as client:
            await client.list_tools()
            first = await client.call_tool("guarded_ticket", {"title": title})
            again = await client.call_tool("guarded_ticket", {"title": title})
        return first, again

    first, again = asyncio.run(scenario())
    assert len(asked) == 1  # the continuation went through; the repeat was answered from its receipt
    assert not first.is_error and title in text_of(first) and text_of(again) == text_of(first)
    assert env.desk.ran("guarded_ticket", title) == 1
    asking, done = receipts_of(env, title)
    assert (asking.state, asking.error_code) == ("rejected", "input_required")
    assert done.state == "succeeded" and asking.intent_fingerprint == done.intent_fingerprint


def test_the_cli_and_the_page_show_the_tools_operation_name(env: Env):
    async def call() -> None:
        async with mcp_client(env.proxy.url, env.url) as client:
            await client.call_tool("create_ticket", {"title": f"shown-{tag()}"})

    asyncio.run(call())
    host = env.server.netloc
    assert "mcp tools/call create_ticket" in ls_table(env.config, env.database_url, host)
    assert "mcp tools/call create_ticket" in review_page(env.config, env.store, host)
