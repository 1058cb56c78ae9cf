"""An MCP server made with the official SDK (`MCPServer`, streamable HTTP), counting each tool execution, and
the SDK's own client pointed at it through a proxy.

Tools: `create_ticket` (a write), `slow_ticket` (a write that acts, then takes `seconds` to answer),
`progress_ticket` (reports progress, so the server answers with server-sent events), `guarded_ticket` (asks
the user to confirm first: at 2026-07-28 an `input_required` result, MCP's multi-round-trip), and
`list_tickets` and `list_tickets_reporting` (reads, with structured content, for the reconciler; the second
reports progress, so its answer comes as server-sent events).
"""

import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel


class Ticket(BaseModel):
    id: int
    title: str


class Tickets(BaseModel):
    items: list[Ticket]


class Confirm(BaseModel):
    ok: bool


class TicketDesk:
    """The server's side of the world: every execution of a tool, and the tickets made."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: Counter[tuple[str, str]] = Counter()
        self.tickets: list[Ticket] = []

    def act(self, tool: str, title: str) -> Ticket:
        with self.lock:
            self.executions[(tool, title)] += 1
            ticket = Ticket(id=1000 + len(self.tickets), title=title)
            self.tickets.append(ticket)
            return ticket

    def ran(self, tool: str, title: str) -> int:
        with self.lock:
            return self.executions[(tool, title)]

    def app(self) -> Any:
        server = MCPServer("tickets")

        @server.tool()
        def create_ticket(title: str) -> Ticket:
            """Create a ticket."""
            return self.act("create_ticket", title)

        @server.tool()
        async def slow_ticket(title: str, seconds: float) -> Ticket:
            """Create a ticket, then take a while to say so."""
            ticket = self.act("slow_ticket", title)
            await anyio.sleep(seconds)
            return ticket

        @server.tool()
        async def progress_ticket(title: str, ctx: Context) -> Ticket:
            """Create a ticket, reporting progress on the way."""
            await ctx.report_progress(0.5, 1.0, "half way")
            return self.act("progress_ticket", title)

        def confirm(title: str) -> Elicit[Confirm]:
            return Elicit(f"Create the ticket {title!r}?", Confirm)

        @server.tool()
        def guarded_ticket(title: str, answer: Annotated[Confirm, Resolve(confirm)]) -> Ticket:
            """Create a ticket once the user confirms."""
            if not answer.ok:
                raise ValueError("not confirmed")
            return self.act("guarded_ticket", title)

        @server.tool()
        def list_tickets() -> Tickets:
            """The tickets, newest last."""
            with self.lock:
                return Tickets(items=list(self.tickets))

        @server.tool()
        async def list_tickets_reporting(ctx: Context) -> Tickets:
            """The tickets, reporting progress on the way (so the answer comes as server-sent events)."""
            await ctx.report_progress(0.5, 1.0, "reading")
            with self.lock:
                return Tickets(items=list(self.tickets))

        # requests arrive through the proxy, Host 127.0.0.1:<port>: no DNS-rebinding guard needed on loopback
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        return server.streamable_http_app(transport_security=security)


@asynccontextmanager
async def mcp_client(
    proxy_url: str, url: str, mode: str = "auto", headers: dict[str, str] | None = None, **kw: Any
) -> AsyncIterator[Client]:
    """The SDK's client for `url`, through the proxy (its own HTTP client, told where the proxy is, sending
    `headers` with every request)."""
    http = httpx2.AsyncClient(proxy=proxy_url, timeout=httpx2.Timeout(30.0, read=60.0), headers=headers)
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode, **kw) as client:
        yield client


def wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
