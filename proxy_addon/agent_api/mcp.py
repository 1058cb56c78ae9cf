"""The agent's own receipts as an MCP server (the official `mcp` SDK): tools `list_receipts`, `get_receipt`,
`wait_for_receipt`, `check_write`, the same reads as the REST API (receipts.py), described for a model.

Served two ways: by the proxy at `http://receipts.internal/mcp` (streamable HTTP, stateless, answers in JSON:
the proxy hands an answer over whole, agent_api/bridge.py), for the agent the proxy identifies; and as
`receipts mcp --agent NAME` over stdio (stdio.py), for an agent host on the same machine that starts its MCP
servers from a config file.
"""

from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import Field

from proxy_addon.agent_api.check import CheckRequest
from proxy_addon.agent_api.receipts import MAX_WAIT, OwnReceipts
from proxy_addon.agent_api.scope import AgentScope
from proxy_addon.exceptions import ReceiptsError

INSTRUCTIONS = (
    "Every write you send through the receipts proxy (POST, PUT, PATCH, DELETE, MCP tools/call, GraphQL mutations) "
    "gets a receipt that says what is proven about its outcome. Ask here before you act again: after an error or a "
    "timeout, after a restart, or when you are not sure a write went through. Never retry a write whose receipt is "
    "open (outcome_unknown, reconciling, manual_review): the proxy refuses the retry, and the first one may still "
    "have taken effect. Wait for its verdict instead."
)
READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)

Scoper = Callable[[Context], AgentScope]  # who asks, from the request


def mcp_server(receipts: OwnReceipts, scope_of: Scoper) -> MCPServer:
    server = MCPServer("receipts", instructions=INSTRUCTIONS)
    _add_reads(server, receipts, scope_of)
    _add_wait_and_check(server, receipts, scope_of)
    return server


def _add_reads(server: MCPServer, receipts: OwnReceipts, scope_of: Scoper) -> None:
    @server.tool(annotations=READ_ONLY)
    async def list_receipts(
        ctx: Context,
        state: Annotated[str | None, Field(description="`open` (not settled), `unknown` (outcome_unknown, reconciling, "
                                                       "manual_review), or a state; commas for several")] = None,
        operation: Annotated[str | None, Field(description="an operation name, as the receipts show it")] = None,
        since: Annotated[str | None, Field(description="journaled since: `10m`, `2h`, or an RFC 3339 time")] = None,
        limit: Annotated[int, Field(ge=1, le=200)] = 20,
        after: Annotated[str | None, Field(description="the `next_after` of the page before")] = None,
    ) -> dict[str, Any]:
        """List the writes you made through the proxy, newest first, with their states.

        Call it after a restart or when you lost your context, to find writes whose outcome you do not know
        (state=unknown), or the ones still open (state=open), before you do any of them again."""
        page: list[dict[str, Any]]
        next_after: str | None
        page, next_after = await _asked(receipts.list(scope_of(ctx), [state or ""], operation, since, limit, after))
        return {"receipts": page, "next_after": next_after}

    @server.tool(annotations=READ_ONLY)
    async def get_receipt(
        ctx: Context, operation_id: Annotated[str, Field(description="the receipt's id: op_ and 32 hex digits")]
    ) -> dict[str, Any]:
        """One of your receipts: what the system can prove happened (`what_happened`, `state`, `open`), its history,
        and what the proxy would do now with the same request again (`retry`).

        Call it before you retry a write that failed, timed out or was answered with an error naming a receipt
        (the error's `operation_id` or `receipt_url`)."""
        return await _asked(receipts.get(scope_of(ctx), operation_id))


def _add_wait_and_check(server: MCPServer, receipts: OwnReceipts, scope_of: Scoper) -> None:
    @server.tool(annotations=READ_ONLY)
    async def wait_for_receipt(
        ctx: Context,
        operation_id: Annotated[str, Field(description="the receipt's id: op_ and 32 hex digits")],
        timeout_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT)] = 30,
    ) -> dict[str, Any]:
        """Wait until one of your receipts is settled (it leaves every open state), at most timeout_seconds, and
        return it as get_receipt does.

        Call it when a write's outcome is unknown (outcome_unknown, reconciling): the reconciler reads the upstream
        to find out whether it took effect. If it is still `open` when this returns, call it again later; do not
        send the write again meanwhile."""
        return await _asked(receipts.wait(scope_of(ctx), operation_id, timeout_seconds, _gone(ctx)))

    @server.tool(annotations=READ_ONLY)
    async def check_write(
        ctx: Context,
        method: Annotated[str, Field(description="the HTTP method, e.g. POST")],
        url: Annotated[str, Field(description="the full URL you will send it to")],
        headers: Annotated[dict[str, str] | None, Field(description="its headers, credentials included: they say "
                                                                   "whose request it is")] = None,
        body: Annotated[Any, Field(description="its body: a string as sent, or any JSON value")] = None,
    ) -> dict[str, Any]:
        """Ask what the proxy would do now with a write you are about to send (or send again), without sending it:
        `decision` is forward (it is sent, once), replay (the answer of an earlier success is returned, nothing
        sent), refuse (nothing sent: `problem` and the receipt in the way say why), approval_required (a person must
        approve it first) or not_journaled (it passes through unrecorded). Nothing is recorded or sent.

        Call it before retrying any write, and before a write that may repeat one you made before."""
        request = CheckRequest(method=method, url=url, headers=headers or {}, body=body)
        return await _asked(receipts.check(scope_of(ctx), request))


async def _asked[T](work: Any) -> T:
    """The tool's answer; a failure the agent can act on as the tool's error result, in one line."""
    try:
        result: T = await work
    except ReceiptsError as e:
        raise ToolError(str(e)) from None
    return result


def _gone(ctx: Context) -> Callable[[], bool]:
    request = getattr(ctx.request_context, "request", None)
    gone = getattr(request, "scope", {}).get("receipts.client_gone") if request is not None else None
    return gone if callable(gone) else (lambda: False)


def http_endpoint(server: MCPServer, host: str) -> StreamableHTTPASGIApp:
    """The server's streamable HTTP endpoint for the reserved host: stateless (no session to keep between the
    proxy's flows) and answering in JSON (the proxy's bridge holds an answer whole). Its session manager must be
    running (`server.session_manager.run()`) while it serves."""
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,  # a page in a browser behind the proxy is not an agent
        allowed_hosts=[host, f"{host}:*"],
        allowed_origins=[f"http://{host}", f"https://{host}", f"http://{host}:*", f"https://{host}:*"],
    )
    server.streamable_http_app(stateless_http=True, json_response=True, transport_security=security)
    return StreamableHTTPASGIApp(server.session_manager)
