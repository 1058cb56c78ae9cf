"""Read rules that are not a plain GET, for the verifier controls: a POST-body read (a GraphQL query, executed by
graphql-core) and a read whose answer comes as server-sent events (an MCP tool that reports progress, served by
the official MCP SDK). A write is journaled as the proxy would have journaled the call (its operation name, its
JSON-RPC or GraphQL body), then done on the server or not, then made `outcome_unknown`.
"""

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proxy_addon.config import ReceiptsConfig, parse_config
from proxy_addon.rules.records import Intent
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from support.asgi import AsgiServer
from support.graphql_server import IssueTracker
from support.mcp_server import TicketDesk

ACCOUNT = "acct:protocol-reads"
LIST_REPORTING = {  # a progress token: the server answers with server-sent events
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "name": "list_tickets_reporting",
        "arguments": {},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
                  "progressToken": "controls"},
    },
}  # fmt: skip
MCP_SEARCH = {
    "strategy": "search",
    "method": "POST",
    "url": "{scheme}://{netloc}/mcp",
    "body": LIST_REPORTING,
    "items": "$.result.structuredContent.items",
    "match": {"$.title": "$.params.arguments.title"},
    "id": "$.id",
}
GRAPHQL_SEARCH = {
    "strategy": "search",
    "method": "POST",
    "url": "{scheme}://{netloc}/graphql",
    "body": {"query": "query { issues { id title } }"},
    "items": "$.data.issues",
    "match": {"$.title": "$.variables.title"},
    "id": "$.id",
}
CREATE_ISSUE = "mutation CreateIssue($title: String!) { createIssue(title: $title) { id title } }"


@dataclass
class Kind:
    """One kind of read: its server, the operation it settles, and how a write to it is made or done."""

    name: str
    server: AsgiServer
    app: TicketDesk | IssueTracker

    @property
    def mcp(self) -> bool:
        return isinstance(self.app, TicketDesk)

    def operation_rule(self, reconcile: dict[str, Any]) -> dict[str, Any]:
        common = {"method": "POST", "retry_safe": True, "reconcile": {"settle": "0s", "attempts": 1, **reconcile}}
        if self.mcp:
            return {"name": "tickets.create", "path": "/mcp", "call": "create_ticket",
                    "external_id": "$.result.structuredContent.id", **common}  # fmt: skip
        return {"name": "issues.create", "path": "/graphql", "call": "CreateIssue", "external_id": "$.data.createIssue.id", **common}

    def intent(self, title: str) -> Intent:
        if self.mcp:
            operation = "mcp tools/call create_ticket"
            document: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                        "params": {"name": "create_ticket", "arguments": {"title": title}}}  # fmt: skip
            path = "/mcp"
        else:
            operation, path = "graphql CreateIssue", "/graphql"
            document = {"query": CREATE_ISSUE, "variables": {"title": title}, "operationName": "CreateIssue"}
        body = json.dumps(document).encode()
        return Intent(operation=operation, method="POST", scheme="http", host="127.0.0.1", port=self.server.port, path=path,
                      intent_fingerprint="sha256:" + uuid.uuid4().hex * 2, account=ACCOUNT,
                      request_headers={"content-type": "application/json"}, request_body=body,
                      request_body_size=len(body))  # fmt: skip

    def act(self, title: str) -> str:
        """What the server does for the write (its tool, its resolver's effect); returns the id it gives."""
        if isinstance(self.app, TicketDesk):
            return str(self.app.act("create_ticket", title).id)
        with self.app.lock:
            issue = {"id": str(500 + len(self.app.issues)), "title": title}
            self.app.issues.append(issue)
        return issue["id"]


def config_for(kind: Kind, directory: Path, reconcile: dict[str, Any]) -> ReceiptsConfig:
    return parse_config(
        yaml.safe_dump(
            {
                "secret_file": str(directory / "secret"),
                "reconcile": {"per_host_rate": 1000},
                "logging": {"level": "warning", "format": "json"},
                "hosts": {kind.server.netloc: {"operations": [kind.operation_rule(reconcile)]}},
            }
        )
    )


def succeeded(store: ReceiptStore, kind: Kind) -> str:
    """A call the server did and answered: the known success."""
    intent = kind.intent(f"known {uuid.uuid4().hex[:8]}")
    store.receipts.record_and_submit(intent, None, "test")
    store.receipts.transition(intent.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "test"},
                              status_code=200, external_id=kind.act(_title(intent)))  # fmt: skip
    return intent.operation_id


def unknown(store: ReceiptStore, kind: Kind, committed: bool) -> str:
    """A call whose answer never came: the server did it, or never saw it."""
    intent = kind.intent(f"unknown {uuid.uuid4().hex[:8]}")
    store.receipts.record_and_submit(intent, None, "test")
    if committed:
        kind.act(_title(intent))
    store.receipts.transition(intent.operation_id, State.SUBMITTED, State.OUTCOME_UNKNOWN, {"who": "test"},
                              error_code="upstream_timeout")  # fmt: skip
    return intent.operation_id


def _title(intent: Intent) -> str:
    document = json.loads(intent.request_body or b"{}")
    return (document.get("params", {}).get("arguments") or document.get("variables"))["title"]
