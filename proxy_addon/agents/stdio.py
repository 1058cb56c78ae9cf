"""`receipts mcp --agent NAME`: the agent API's MCP server over stdio, for an agent host on the proxy's machine that
starts its MCP servers from a config file (Claude Desktop, an IDE, an agent framework's `mcpServers`).

It reads the proxy's database directly, as the agent named (without `--agent`: the anonymous agents' receipts),
with the proxy's config and account key, so `check_write` decides as the proxy would. Stdout is the protocol's:
every log line goes to stderr.
"""

import argparse
import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.db import check_schema, make_engine, resolve_database_url
from proxy_addon.log import configure_logging
from proxy_addon.rules.account import AccountHasher, load_or_create_key
from proxy_addon.store import ReceiptStore


@dataclass(frozen=True)
class LocalSources:
    """What the MCP server reads, set up from the config (agents/receipts.py, Sources)."""

    config: ReceiptsConfig
    store: ReceiptStore
    hasher: AccountHasher
    instance_id: str


def add_command(command: Any) -> None:
    """`receipts mcp`, added to the CLI's parser (`command` is cli.py's helper)."""
    p = command("mcp", cmd_mcp, "the agent's own receipts as an MCP server over stdio (tools: list_receipts, "
                "get_receipt, wait_for_receipt, check_write)")
    p.add_argument("--agent", metavar="NAME", help="the agent whose receipts it serves (default: the anonymous agents')")
    p.add_argument("--proxy-port", type=int, default=8080, help="the proxy's listen port: check_write names it as the proxy's own")


def cmd_mcp(args: argparse.Namespace) -> int:
    # imported here: the MCP SDK alone takes a second or two to import, which no other command should pay
    from proxy_addon.addons.admission import OwnAddresses
    from proxy_addon.agents.mcp import mcp_server
    from proxy_addon.agents.receipts import OwnReceipts
    from proxy_addon.agents.scope import AgentScope

    config = load_config(args.config)
    configure_logging(config.logging.level, config.logging.format)  # on stderr: stdout carries the protocol
    engine = make_engine(resolve_database_url(config.database.url))
    check_schema(engine)
    sources = LocalSources(
        config, ReceiptStore(engine), AccountHasher(load_or_create_key(config.secret_file)), f"mcp-{uuid.uuid4().hex[:12]}"
    )
    own = OwnAddresses()
    own.add("127.0.0.1", args.proxy_port, "the proxy")
    own.add(config.admin.listen_host, config.admin.listen_port, "the receipts admin server")
    executor = ThreadPoolExecutor(2, thread_name_prefix="receipts-mcp")
    receipts = OwnReceipts(lambda: sources, executor, own.forbidden)
    scope = AgentScope(args.agent)
    try:
        asyncio.run(mcp_server(receipts, lambda _ctx: scope).run_stdio_async())
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        engine.dispose()
    return 0
