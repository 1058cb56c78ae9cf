"""`receipts mcp --agent NAME`: the agent API's MCP server over stdio, for an agent host on the proxy's machine that
starts its MCP servers from a config file (Claude Desktop, an IDE, an agent framework's `mcpServers`).

It reads the proxy's database directly, as the agent named (without `--agent`: the anonymous agents' receipts),
with the proxy's config and account key, so `check_write` decides as the proxy would. Stdout is the protocol's:
every log line goes to stderr.
"""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from proxy_addon.agent_api.check import Forbidden
from proxy_addon.agent_api.mcp import mcp_server
from proxy_addon.agent_api.receipts import OwnReceipts
from proxy_addon.agent_api.scope import AgentScope
from proxy_addon.config import ReceiptsConfig
from proxy_addon.db import check_schema, make_engine, resolve_database_url
from proxy_addon.exceptions import ConfigError
from proxy_addon.keyfiles import load_or_create_key
from proxy_addon.log import configure_logging
from proxy_addon.rules.account import AccountHasher
from proxy_addon.store import ReceiptStore


@dataclass(frozen=True)
class LocalSources:
    """What the MCP server reads, set up from the config (agent_api/receipts.py, Sources)."""

    config: ReceiptsConfig
    store: ReceiptStore
    hasher: AccountHasher
    instance_id: str


def serve_stdio(config: ReceiptsConfig, agent: str | None, forbidden: Forbidden) -> None:
    """Serve the agent's own receipts over stdin and stdout until the client closes them. `forbidden`: the proxy's
    own addresses, which `check_write` says a write to is refused (cli/mcp.py names them)."""
    if agent is not None and agent not in config.agents:
        raise ConfigError(f"agent {agent!r} is not in the config's agents: (receipts agents ls)")
    configure_logging(config.logging.level, config.logging.format)  # on stderr: stdout carries the protocol
    engine = make_engine(resolve_database_url(config.database.url))
    check_schema(engine)
    sources = LocalSources(
        config, ReceiptStore(engine), AccountHasher(load_or_create_key(config.secret_file)), f"mcp-{uuid.uuid4().hex[:12]}"
    )
    executor = ThreadPoolExecutor(2, thread_name_prefix="receipts-mcp")
    receipts = OwnReceipts(lambda: sources, executor, forbidden)
    scope = AgentScope(agent)
    try:
        asyncio.run(mcp_server(receipts, lambda _ctx: scope).run_stdio_async())
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        engine.dispose()
