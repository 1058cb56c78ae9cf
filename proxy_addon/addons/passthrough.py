"""Addons: traffic the journal does not guard passes through untouched, streamed both ways.

`Passthrough`: a flow decided from its head (routing.route: a method not journaled, a host with `journal: false`, a model
API, a rule with `journal: false`) has its request body streamed upstream as it comes; every flow that passes
(those a protocol finds to be reads too, once their body is in) has its answer streamed to the client as the
upstream sends it, so that an SSE stream or a slow download is never buffered whole. A request that may be
journaled is not streamed here: its body is read whole, and the handler sends it itself, once (mitmproxy's
own `stream_large_bodies` option is another matter: it streams a body past its limit whatever a hook says).
Nothing here costs more than the decision.

`StreamLargeBodies`: mitmproxy's `stream_large_bodies`, for pass-through traffic only.
mitmproxy streams a request body that passes the limit as it reads it, whatever a `requestheaders` hook set
`flow.request.stream` to: it checks the size again for each piece of a body it buffers and opens the upstream
request right there. A journaled write would then reach the upstream without a receipt, and again from the
handler. So this addon takes the option over: it keeps the limit, sets mitmproxy's own option back to none
(mitmproxy then streams nothing by itself), and streams pass-through bodies from the `requestheaders` and
`responseheaders` hooks: those longer than the limit, and those of unknown length (chunked, or read until
the connection closes), which mitmproxy would stream once past it. A journaled request is never streamed:
its body is read whole, journaled, and sent upstream once, by the handler.
"""

import asyncio
from dataclasses import replace
from typing import Any

from mitmproxy import ctx, exceptions, http
from mitmproxy.net.http.http1 import expected_http_body_size
from mitmproxy.utils import human

from proxy_addon.addons.agent_api import answered_here
from proxy_addon.addons.state import ReceiptsState
from proxy_addon.config import ReceiptsConfig
from proxy_addon.log import get_logger
from proxy_addon.protocols import routing
from proxy_addon.protocols.base import Route
from proxy_addon.protocols.facts import RequestFacts

log = get_logger("receipts.proxy")

PASSES_KEY = "receipts_passes"  # flow.metadata: why this flow passes through (a string)
RECOGNISE_INLINE = 256 * 1024  # larger bodies are read by their protocol off the event loop
_SWITCHING_PROTOCOLS = 101


def route_of(config: ReceiptsConfig, flow: http.HTTPFlow) -> Route:
    req = flow.request
    return routing.route(config, req.method, req.host, req.port, req.path)


def mark_passing(flow: http.HTTPFlow, why: str) -> None:
    flow.metadata[PASSES_KEY] = why


async def recognised(facts: RequestFacts, config: ReceiptsConfig) -> RequestFacts:
    """The facts with their protocol's reading of them (`facts.call`)."""
    if len(facts.body) <= RECOGNISE_INLINE:
        call = routing.recognise(facts, config)
    else:
        call = await asyncio.to_thread(routing.recognise, facts, config)
    return replace(facts, call=call)


class Passthrough:
    def __init__(self, journal: ReceiptsState):
        self.journal = journal

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        config = self.journal.config
        if flow.response or flow.error or not flow.live or config is None or self.journal.handler is None:
            return
        if answered_here(flow):
            return  # the agent API's: read whole, answered by the proxy itself
        where = route_of(config, flow)
        if where.journal:
            return  # read whole: the handler journals it, then sends it itself, once
        mark_passing(flow, where.passes or "route")
        flow.request.stream = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is None or PASSES_KEY not in flow.metadata:
            return
        if flow.response.status_code != _SWITCHING_PROTOCOLS:  # an upgrade (WebSocket) is mitmproxy's to handle
            flow.response.stream = True

OPTION = "stream_large_bodies"


class StreamLargeBodies:
    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.limit: int | None = None
        self._taking_over = False

    def configure(self, updated: set[str]) -> None:
        if OPTION not in updated or self._taking_over:
            return
        value = ctx.options.stream_large_bodies
        try:
            self.limit = human.parse_size(value)
        except ValueError as e:
            raise exceptions.OptionsError(f"Invalid {OPTION} specification: {value}") from e
        if value is not None:
            self._taking_over = True
            try:
                ctx.options.update(**{OPTION: None})
            finally:
                self._taking_over = False

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self.limit is None or flow.response or flow.error or self.journal.journals(flow) or answered_here(flow):
            return
        if _past(self.limit, flow.request):
            flow.request.stream = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.limit is None or flow.response is None or self.journal.journals(flow):
            return
        if _past(self.limit, flow.request, flow.response):
            flow.response.stream = True


def _past(limit: int, *message: Any) -> bool:
    try:
        size = expected_http_body_size(*message)
    except ValueError:  # a malformed length: mitmproxy does not stream those either
        return False
    return size is None or size == -1 or size > limit
