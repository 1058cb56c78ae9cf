"""Addon: traffic the journal does not guard passes through untouched, streamed both ways.

A flow decided from its head (routing.route: a method not journaled, a host with `journal: false`, a model
API, a rule with `journal: false`) has its request body streamed upstream as it comes; every flow that passes
(those a protocol finds to be reads too, once their body is in) has its answer streamed to the client as the
upstream sends it, so that an SSE stream or a slow download is never buffered whole. A request that may be
journaled is not streamed here: its body is read whole, and the handler sends it itself, once (mitmproxy's
own `stream_large_bodies` option is another matter: it streams a body past its limit whatever a hook says).
Nothing here costs more than the decision.
"""

import asyncio
from dataclasses import replace

from mitmproxy import http

from proxy_addon.config import ReceiptsConfig
from proxy_addon.facts import RequestFacts
from proxy_addon.handler import JournalState
from proxy_addon.log import get_logger
from proxy_addon.protocols import routing
from proxy_addon.protocols.base import Route

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
    def __init__(self, journal: JournalState):
        self.journal = journal

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        config = self.journal.config
        if flow.response or flow.error or not flow.live or config is None or self.journal.handler is None:
            return
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
