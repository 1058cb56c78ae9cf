"""Addon: mitmproxy's `stream_large_bodies`, for pass-through traffic only.

mitmproxy streams a request body that passes the limit as it reads it, whatever a `requestheaders` hook set
`flow.request.stream` to: it checks the size again for each piece of a body it buffers and opens the upstream
request right there. A journaled write would then reach the upstream without a receipt, and again from the
handler. So this addon takes the option over: it keeps the limit, sets mitmproxy's own option back to none
(mitmproxy then streams nothing by itself), and streams pass-through bodies from the `requestheaders` and
`responseheaders` hooks: those longer than the limit, and those of unknown length (chunked, or read until
the connection closes), which mitmproxy would stream once past it. A journaled request is never streamed:
its body is read whole, journaled, and sent upstream once, by the handler.
"""

from typing import Any, Protocol

from mitmproxy import ctx, exceptions, http
from mitmproxy.net.http.http1 import expected_http_body_size
from mitmproxy.utils import human

OPTION = "stream_large_bodies"


class Journals(Protocol):
    def journals(self, flow: http.HTTPFlow) -> bool: ...


class StreamLargeBodies:
    def __init__(self, journal: Journals):
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
        if self.limit is None or flow.response or flow.error or self.journal.journals(flow):
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
