"""A proxy with two agents named in its config, in-process on a module's journal, before the articles world: the
agent API's and the MCP server's tests (tests/e2e/test_agent_api.py, test_agent_mcp.py) both start from it."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from proxy_addon.agents.tokens import new_token, token_hash
from proxy_addon.store import ReceiptStore
from support.e2e import open_store
from support.proxy import RunningProxy, start_inprocess_proxy
from support.reconcile import articles_rule, search
from support.world import World, start_world

TOKENS = {"billing": new_token(), "support": new_token()}


@dataclass
class AgentsEnv:
    proxy: RunningProxy
    store: ReceiptStore
    world: World
    config: Path
    database_url: str
    admin_port: int | None

    @property
    def ca(self) -> Path:
        """The proxy's CA, as SSL_CERT_FILE would give it to an agent."""
        return self.config.parent / "confdir" / "mitmproxy-ca-cert.pem"

    def proxy_url(self, agent: str | None) -> str:
        """This agent's proxy URL (its token in it, as HTTPS_PROXY would carry it), or an anonymous one."""
        auth = f"{agent}:{TOKENS[agent]}@" if agent else ""
        return f"http://{auth}127.0.0.1:{self.proxy.port}"


@contextmanager
def agents_env[E: AgentsEnv](kind: type[E], database_url: str, tmp: Path, admin_port: int | None = None) -> Iterator[E]:
    """The proxy (with its admin server on `admin_port`, when given) and the world, as a `kind` (AgentsEnv or a
    test module's own with its helpers), stopped afterwards."""
    world = start_world()
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({
        "secret_file": str(tmp / "secret"),
        "logging": {"level": "warning"},
        **({"admin": {"enabled": True, "listen_port": admin_port}} if admin_port else {}),
        "agents": {name: {"token_hash": token_hash(token)} for name, token in TOKENS.items()},
        "defaults": {"upstream_timeout": "1s"},
        "reconcile": {"backoff": "50ms", "per_host_rate": 1000},
        "hosts": {world.netloc: {"operations": [articles_rule(search())]}},
    }))  # fmt: skip
    proxy = start_inprocess_proxy(config, database_url, tmp / "confdir")
    try:
        with open_store(database_url) as store:
            yield kind(proxy, store, world, config, database_url, admin_port)
    finally:
        proxy.stop()
        world.stop()
