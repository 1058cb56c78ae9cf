"""`proxy.max_body`: a journaled body over it is refused (413) without being held in memory, and one under it is
held about once.

mitmproxy reads a request's whole body before the `request` hook, into a buffer of its HTTP stream; an answer
set in `requestheaders` is only sent once the body has been read, and its `body_size_limit` option applies to
every request, pass-through included (which must stay untouched), and answers with its own HTML page. So for a
journaled request the `requestheaders` hook (Admission, addons/admission.py) swaps that buffer for a `BoundedBody`:
- a declared length (Content-Length) over the limit is answered 413 at once, and the body that follows is
  drained into a buffer that keeps nothing;
- a body of unknown length (chunked, HTTP/2 without Content-Length) keeps at most the limit; past it, it drops
  what it holds, keeps nothing more, and the request hook answers 413.
The buffer belongs to mitmproxy's internals (`HttpStream.request_body_buf`, found from the flow through the
proxy server's connection handler): mitmproxy 12 is pinned. Should it not be found, nothing is swapped, the
body is read as mitmproxy reads it, and the request hook still answers 413 (correct, with more memory).

Request bodies sent with a Content-Encoding are decoded for their identity only up to the limit
(`decoded_body`): a small gzip body that inflates to gigabytes is identified by its bytes instead.
"""

import zlib
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.net.http.http1 import expected_http_body_size

from proxy_addon.log import get_logger

log = get_logger("receipts.proxy")

NO_LIMIT = 1 << 62
METADATA_KEY = "receipts_body"  # flow.metadata: {"limit": n, "seen": bytes received, "over": bool}


class BoundedBody:
    """mitmproxy's ReceiveBuffer interface (`+=`, len, bytes, bool, clear), keeping at most `limit` bytes.
    Past the limit it keeps nothing, and says so in the flow's metadata."""

    __slots__ = ("_chunks", "_len", "limit", "state")

    def __init__(self, limit: int, state: dict[str, Any]):
        self._chunks: list[bytes] = []
        self._len = 0
        self.limit = limit
        self.state = state

    def __iadd__(self, data: bytes) -> "BoundedBody":
        self.state["seen"] = self.state.get("seen", 0) + len(data)
        if self.state["seen"] > self.limit:
            if not self.state.get("over"):
                self.state["over"] = True
                self._chunks.clear()
                self._len = 0
            return self
        self._chunks.append(data)
        self._len += len(data)
        return self

    def __len__(self) -> int:
        return self._len

    def __bytes__(self) -> bytes:
        chunks, self._chunks, self._len = self._chunks, [], 0
        return b"".join(chunks)  # one chunk is returned as it is, not copied

    def __bool__(self) -> bool:
        return self._len > 0

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0


def declared_length(request: http.Request) -> int | None:
    """The body's length as the headers declare it; None when it is not known before reading it."""
    try:
        size = expected_http_body_size(request)
    except ValueError:
        return None
    return size if size is not None and size >= 0 else None


def bound(flow: http.HTTPFlow, limit: int) -> bool:
    """Swap the buffer mitmproxy reads this flow's request body into for a BoundedBody (limit 0: keep nothing).
    Returns whether it could."""
    stream = _http_stream(flow)
    if stream is None or not hasattr(stream, "request_body_buf"):
        log.debug("body_buffer_not_found", note="the body is read whole; max_body is checked after")
        return False
    state = flow.metadata.setdefault(METADATA_KEY, {})
    state["limit"] = limit
    stream.request_body_buf = BoundedBody(limit, state)
    return True


def over_limit(flow: http.HTTPFlow, limit: int) -> int | None:
    """At the request hook: the body's size when it is over `limit` (what was received, or declared), else None."""
    state = flow.metadata.get(METADATA_KEY) or {}
    if state.get("over"):
        return int(state.get("seen", 0))
    size = len(flow.request.raw_content or b"")
    return size if size > limit else None


def _http_stream(flow: http.HTTPFlow) -> Any:
    """The mitmproxy HttpStream that reads this flow (internals: the layers under the client's connection)."""
    try:
        handler = ctx.master.addons.get("proxyserver").connections.get(flow.client_conn.id)
    except AttributeError:
        return None
    if handler is None:
        return None
    seen: set[int] = set()
    todo: list[Any] = [getattr(handler, "layer", None)]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if getattr(obj, "flow", None) is flow:
            return obj
        for name in ("layer", "child_layer"):
            todo.append(getattr(obj, name, None))
        streams = getattr(obj, "streams", None)
        if isinstance(streams, dict):
            todo.extend(streams.values())
        context = getattr(obj, "context", None)
        todo.extend(getattr(context, "layers", None) or ())
        handle = getattr(obj, "_handle_event", None)  # a mode layer keeps its child only as a bound method
        todo.append(getattr(handle, "__self__", None))
    return None


def decoded_body(request: http.Request, limit: int) -> tuple[bytes, bool]:
    """The body with its Content-Encoding undone, for its identity, and whether it could be: gzip and deflate are
    inflated to at most `limit` bytes; other encodings only when the body is small enough that decoding it whole
    is bounded anyway. Otherwise the raw body, and False."""
    raw = request.raw_content or b""
    encoding = (request.headers.get("content-encoding") or "").strip().lower()
    if not raw or encoding in ("", "identity"):
        return raw, True
    if encoding in ("gzip", "x-gzip", "deflate"):
        try:
            inflater = zlib.decompressobj(47 if encoding != "deflate" else 15)  # 47: gzip or zlib header
            out = inflater.decompress(raw, limit + 1)
        except zlib.error:
            if encoding != "deflate":
                return raw, False
            try:
                inflater = zlib.decompressobj(-15)  # raw deflate, as some clients send it
                out = inflater.decompress(raw, limit + 1)
            except zlib.error:
                return raw, False
        if len(out) > limit or inflater.unconsumed_tail:
            return raw, False
        return out, True
    if len(raw) * 1032 > limit:  # brotli and zstd may inflate past 1000x: only small bodies are decoded
        return raw, False
    content = request.get_content(strict=False)
    return (content, True) if content is not None and content is not raw else (raw, False)
