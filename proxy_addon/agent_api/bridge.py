"""An ASGI application answering a mitmproxy flow from inside the proxy: the agent API (agent_api/api.py).

mitmproxy's own `mitmproxy.addons.asgiapp.serve` does this too; this one differs where the agent API needs it:
- the query string is passed as the client sent it (mitmproxy's decodes it first, so an `operation=` holding a
  `%26` would be split at the `&`), and the scheme in lower case, as ASGI says;
- the scope carries what the proxy knows of the asker (`extra`: the agent, whether the client has left);
- after the body, `receive` answers `http.disconnect` as soon as the client's connection is gone, so a long
  `wait` ends when its agent leaves, and at once when asked without waiting (Starlette's `is_disconnected`).
Like mitmproxy's, it holds the whole answer before the flow gets it: the MCP app answers in JSON, not in a stream.
"""

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from mitmproxy import http
from mitmproxy.connection import ConnectionState

from proxy_addon.log import get_logger
from proxy_addon.rules import answers

log = get_logger("receipts.agent_api")

GONE_CHECK = 0.25  # how often a waiting `receive` looks at the client's connection
_VERSIONS = {"HTTP/1.0": "1.0", "HTTP/1.1": "1.1", "HTTP/2.0": "2"}


def client_gone(flow: http.HTTPFlow) -> Callable[[], bool]:
    return lambda: not flow.client_conn.state & ConnectionState.CAN_READ


def scope_of(flow: http.HTTPFlow, extra: dict[str, Any]) -> dict[str, Any]:
    req = flow.request
    raw_path, _, query = req.data.path.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": _VERSIONS.get(req.http_version, "1.1"),
        "method": req.method.upper(),
        "scheme": req.scheme.lower(),
        "path": unquote_to_bytes(raw_path).decode("utf-8", "replace") or "/",
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in req.headers.fields],
        "client": flow.client_conn.peername[:2] if flow.client_conn.peername else None,
        "server": (req.host, req.port),
        **extra,
    }


async def serve(app: Any, flow: http.HTTPFlow, extra: dict[str, Any]) -> None:
    """Run `app` for this flow's request and set its answer as the flow's response (500 if the app fails)."""
    gone = client_gone(flow)
    finished = asyncio.Event()
    body_given = False
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": flow.request.raw_content or b"", "more_body": False}
        while not gone() and not finished.is_set():  # checked before any await: is_disconnected asks without waiting
            try:
                await asyncio.wait_for(finished.wait(), GONE_CHECK)
            except TimeoutError:
                continue
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status, headers[:] = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope_of(flow, extra), receive, send)
        if status is None or not finished.is_set():
            raise RuntimeError("the application sent no complete response")
        flow.response = http.Response.make(status, b"".join(chunks), headers)
    except Exception as e:  # the agent gets a 500 of ours, never a forwarded request
        log.exception("agent_api_failed", path=flow.request.path.split("?", 1)[0], error=type(e).__name__)
        flow.response = problem_response(500, "internal-error", f"the agent API failed ({type(e).__name__})")
    finally:
        finished.set()


def problem_response(status: int, kind: str, detail: str) -> http.Response:
    """A problem+json of the agent API's, for what is answered before its app (request/answers.py's shape)."""
    a = answers.problem(status, kind, http.status_codes.RESPONSES.get(status, "Error"), detail)
    return http.Response.make(a.status, a.body, list(a.headers))
