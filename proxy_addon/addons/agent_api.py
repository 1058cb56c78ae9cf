"""Addon: the agent's own receipts, answered by the proxy itself at a reserved host (`agent_api.host`,
`receipts.internal` by default): the agent API of proxy_addon/agent_api/ (REST, its OpenAPI document, MCP at /mcp).

Never forwarded, never journaled: `requestheaders` marks the flow (`answered_here`) before any addon of ours
looks at its head, so that nothing streams it (Passthrough, StreamLargeBodies) nor counts it as a write
(Receipts.journals: the journal addon's `request` hook, which runs first, leaves it alone; Admission's
max_body), and `request` answers it. No connection to the reserved host is ever opened, whatever
`connection_strategy` says:
- plain HTTP (`http://receipts.internal/...` through the proxy): answered from the request alone;
- HTTPS (`CONNECT receipts.internal:443`): `http_connect` answers the CONNECT itself, which keeps mitmproxy's
  `eager` strategy from connecting first; the client's TLS is made with mitmproxy's CA for the name it asked
  for (SNI), as for any host. `receipts proxy` runs `lazy`, which tries nothing more; under `eager` (`receipts
  proxy --set connection_strategy=eager`) `tls_clienthello` keeps mitmproxy from asking the server's certificate
  first. Plain `mitmdump -s` calls a script's `tls_clienthello` before its own TLS addon's, which asks for it
  again: there
- `server_connect` refuses the connection (and mitmproxy logs one line, "Unable to establish TLS connection with
  server (Connection killed: ...)", then makes the client's TLS anyway). Nothing ever connects to the reserved
  host (tests/e2e/test_agent_api.py, under mitmdump).
The asking agent is put in the app's scope (agent_api/scope.py); without configured agents, every agent is the
anonymous one. Turned off (`agent_api.enabled: false`), the host is an ordinary one, forwarded like any other.
"""

import asyncio
import contextlib
import importlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mitmproxy import http, tls
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.agent_api import bridge
from proxy_addon.agent_api.api import MAX_CHECK_BODY, SCOPE_AGENT, SCOPE_GONE, agent_app
from proxy_addon.agent_api.receipts import OwnReceipts
from proxy_addon.agent_api.scope import ANONYMOUS, AgentScope
from proxy_addon.agents.identity import agent_of
from proxy_addon.log import get_logger
from proxy_addon.request import bodylimit

log = get_logger("receipts.agent_api")

ANSWERED_HERE = "receipts_agent_api"  # flow.metadata: the proxy answers this flow itself (the agent API)
READ_THREADS = 2  # the agent API's own database threads: agents asking never take the journal's


def answered_here(flow: http.HTTPFlow) -> bool:
    return ANSWERED_HERE in flow.metadata


def _scope_of(flow: http.HTTPFlow) -> AgentScope:
    """The asking agent, as proxy authentication established it (AgentAuth, before this addon)."""
    return AgentScope(agent_of(flow))


class AgentAPI:
    """`journal`: the Receipts addon (its config, and its handler: the store, account key and instance id);
    `forbidden(host, port)`: the proxy's own addresses (the Admission addon's), for `POST /check`."""

    def __init__(self, journal: ReceiptsState, forbidden: Any):
        self.journal = journal
        self.executor = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="receipts-agent-api")
        self.receipts = OwnReceipts(lambda: self.journal.handler, self.executor, forbidden)
        self._app: asyncio.Task[Any] | None = None  # the app, once set up
        self._built_for: str | None = None  # the host it was set up for
        self._mcp_stop: asyncio.Event | None = None
        self._mcp_task: asyncio.Task[None] | None = None

    def host(self) -> str | None:
        config = self.journal.config
        return config.agent_api.host if config is not None and config.agent_api.enabled else None

    def _ours(self, host: str | None) -> bool:
        reserved = self.host()
        return reserved is not None and host is not None and host.lower().rstrip(".") == reserved

    # -- the app and its MCP server's session manager -----------------------------------------------------------

    def running(self) -> None:
        if self.host() is not None:
            self._building()  # in the background: the proxy serves meanwhile

    def _building(self) -> "asyncio.Task[Any]":
        """The app's set-up, begun once, and again for a new `agent_api.host` (the MCP endpoint checks Host)."""
        if self._app is not None and self._built_for != self.host():
            self._stop_sessions()
            self._app = None
        if self._app is None:
            self._built_for = self.host()
            self._app = asyncio.create_task(self._build(), name="receipts agent API set-up")
        return self._app

    def _stop_sessions(self) -> asyncio.Task[None] | None:
        """Let the MCP session manager's task end (it must be left from its own task); that task."""
        task, self._mcp_task = self._mcp_task, None
        if self._mcp_stop is not None:
            self._mcp_stop.set()
        return task

    async def _build(self) -> Any:
        """The app, with a new MCP server whose session manager runs until `done` (it cannot be run twice). The MCP
        SDK takes a second or two to import: on a thread, so that the proxy's start does not wait for it."""
        mcp = await asyncio.to_thread(importlib.import_module, "proxy_addon.agent_api.mcp")
        host = self.host() or ""
        server = mcp.mcp_server(self.receipts, _request_scope)
        endpoint = mcp.http_endpoint(server, host)
        ready, self._mcp_stop = asyncio.Event(), asyncio.Event()

        async def run_sessions(stop: asyncio.Event) -> None:
            async with server.session_manager.run():
                ready.set()
                await stop.wait()

        self._mcp_task = asyncio.create_task(run_sessions(self._mcp_stop), name="receipts agent API MCP sessions")
        await ready.wait()
        return agent_app(self.receipts, endpoint)

    async def done(self) -> None:
        task = self._stop_sessions()
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        if self._app is not None and not self._app.done():
            self._app.cancel()
        await self.receipts.aclose()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._app = None

    # -- the hooks: the reserved host is never connected to ---------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is None and self._ours(flow.request.host):
            flow.response = http.Response.make(200)  # the tunnel's end is the proxy itself: connect nothing

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        address = data.context.server.address
        if self._ours(data.client_hello.sni) or (address is not None and self._ours(str(address[0]))):
            data.establish_server_tls_first = False

    def server_connect(self, data: ServerConnectionHookData) -> None:
        address = data.server.address
        if address is not None and self._ours(str(address[0])):
            data.server.error = "the agent API's host is answered by the proxy itself, never connected to"

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or not self._ours(flow.request.host):
            return
        flow.metadata[ANSWERED_HERE] = True
        flow.request.stream = False
        bodylimit.bound(flow, MAX_CHECK_BODY)  # a larger body is not kept; `check` answers 413 for it

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or not answered_here(flow):
            return
        if bodylimit.over_limit(flow, MAX_CHECK_BODY) is not None:
            flow.response = bridge.problem_response(413, "body-too-large", f"a check's body is at most {MAX_CHECK_BODY} bytes")
            return
        app = await self._building()  # at once, unless it is still being set up
        extra = {SCOPE_AGENT: _scope_of(flow), SCOPE_GONE: bridge.client_gone(flow)}
        await bridge.serve(app, flow, extra)


def _request_scope(ctx: Any) -> AgentScope:
    """The asking agent, as the bridge put it in the MCP request's scope."""
    request = getattr(ctx.request_context, "request", None)
    scope = getattr(request, "scope", {}).get(SCOPE_AGENT) if request is not None else None
    return scope if isinstance(scope, AgentScope) else ANONYMOUS
