"""The agent API: the asking agent's own receipts, in JSON, with its OpenAPI document, and the MCP server at /mcp.

Served by the proxy itself for the reserved host (addons/agent_api.py; `agent_api.host`, `receipts.internal` by
default), read only. The proxy puts the asker in the ASGI scope (`SCOPE_AGENT`: an AgentScope, and
`SCOPE_GONE`: whether the agent has left); every view reads only that agent's receipts (receipts.py).
Each route is declared once, with what the OpenAPI document says of it (openapi.py builds the document from
this table), so that the document cannot drift from what is served.
"""

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from proxy_addon.agent_api import openapi
from proxy_addon.agent_api.check import CheckRequest
from proxy_addon.agent_api.documents import AgentReceiptView, CheckView
from proxy_addon.agent_api.openapi import Endpoint, Param, Reply
from proxy_addon.agent_api.receipts import LIST_LIMIT, MAX_LIST_LIMIT, MAX_WAIT, OwnReceipts
from proxy_addon.agent_api.scope import ANONYMOUS, AgentScope
from proxy_addon.exceptions import BadRequestError, ReceiptNotFoundError, ReceiptsError
from proxy_addon.rules.answers import PROBLEM_BASE, PROBLEM_CONTENT_TYPE
from proxy_addon.views.documents import ReceiptView, dumps

SCOPE_AGENT = "receipts.agent"
SCOPE_GONE = "receipts.client_gone"
MAX_CHECK_BODY = 1024 * 1024  # a check's body (the request it describes) past this: 413


def asker(request: Request) -> AgentScope:
    scope = request.scope.get(SCOPE_AGENT)
    return scope if isinstance(scope, AgentScope) else ANONYMOUS


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(document), status, headers, media_type="application/json")


def problem(status: int, kind: str, title: str, detail: str) -> Response:
    document = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    return Response(dumps(document), status, {"Cache-Control": "no-store"}, media_type=PROBLEM_CONTENT_TYPE)


def own(request: Request) -> OwnReceipts:
    receipts: OwnReceipts = request.app.state.receipts
    return receipts


# -- the views --------------------------------------------------------------------------------------------------


async def list_receipts(request: Request) -> Response:
    q = request.query_params
    page, after = await own(request).list(
        asker(request), q.getlist("state"), q.get("operation"), q.get("since"), q.get("limit"), q.get("after")
    )
    headers = {}
    if after is not None:
        query = [(k, v) for k, v in q.multi_items() if k != "after"] + [("after", after)]
        headers["Link"] = f'</receipts?{urlencode(query)}>; rel="next"'
    return json_response(page, headers=headers)


async def get_receipt(request: Request) -> Response:
    operation_id = request.path_params["operation_id"]
    wait = request.query_params.get("wait")
    if wait is None:
        return json_response(await own(request).get(asker(request), operation_id))
    gone = request.scope.get(SCOPE_GONE) or (lambda: False)
    return json_response(await own(request).wait(asker(request), operation_id, wait, gone))


async def check(request: Request) -> Response:
    body = await request.body()
    if len(body) > MAX_CHECK_BODY:
        return problem(413, "body-too-large", "Check too large", f"a check's body is at most {MAX_CHECK_BODY} bytes")
    try:
        described = CheckRequest.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        return problem(422, "invalid-check", "Invalid check", f"{where}: {err['msg']}")
    return json_response(await own(request).check(asker(request), described))


async def index(request: Request) -> Response:
    return json_response({
        "receipts": "/receipts",
        "check": "/check",
        "openapi": "/openapi.json",
        "mcp": "/mcp",
        "agent": asker(request).agent,
    })


async def openapi_document(request: Request) -> Response:
    return json_response(openapi.document(ENDPOINTS))


OPERATION_ID = Param("operation_id", "path", {"type": "string"}, "the receipt's id (X-Receipt-Id, `operation_id`)")
NOT_FOUND = Reply("no receipt of yours has this id (another agent's is not found either)", problem=True)
BAD = Reply("a parameter cannot be used; the detail names it", problem=True)
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/receipts", list_receipts, "listReceipts", "Your receipts, newest first",
        "After a restart, or to find a write whose answer you lost: list what you journaled. A full page has a "
        "`Link: <...>; rel=\"next\"` header.",
        params=(
            Param("state", "query", {"type": "array", "items": {"type": "string"}},
                  "a state, or `open` (not settled), or `unknown` (outcome_unknown, reconciling, manual_review); "
                  "repeat it or separate with commas", style="form", explode=True),
            Param("operation", "query", {"type": "string"}, "the operation name, e.g. `POST api.example.com /v1/payments`"),
            Param("since", "query", {"type": "string", "examples": ["10m", "2026-05-01T12:00:00Z"]},
                  "journaled since: a duration back from now, or an RFC 3339 time"),
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": LIST_LIMIT}),
            Param("after", "query", {"type": "string"}, "the next page: the receipts journaled before this one"),
        ),
        replies={200: Reply("your receipts", list[ReceiptView]), 400: BAD}),
    Endpoint("GET", "/receipts/{operation_id}", get_receipt, "getReceipt", "One of your receipts",
        "What the system can prove happened, and what a retry of the same request would get now. With `wait`, "
        f"the answer comes once the receipt has left every open state, or when `wait` has passed (at most {MAX_WAIT:g}s).",
        params=(OPERATION_ID, Param("wait", "query", {"type": "string", "examples": ["30s"]},
                                    f"wait up to this long (at most {MAX_WAIT:g}s) for the outcome to be settled")),
        replies={200: Reply("the receipt", AgentReceiptView), 400: BAD, 404: NOT_FOUND}),
    Endpoint("POST", "/check", check, "checkWrite", "What would the proxy do with this request now?",
        "Before you send a write, or send one again after an error or a timeout: the decision the proxy would make "
        "now, by the code a real write runs. Nothing is journaled, forwarded or stored.",
        body=CheckRequest,
        replies={200: Reply("the decision", CheckView), 400: BAD, 413: Reply("the check's body is too large", problem=True),
                 422: Reply("the body is not a request to check", problem=True)}),
    Endpoint("GET", "/openapi.json", openapi_document, "getOpenAPI", "This document",
             replies={200: Reply("the OpenAPI 3.1 document", {"type": "object"})}),
)


# -- the application ------------------------------------------------------------------------------------------------


def _on_receipts_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, ReceiptNotFoundError):
        return problem(404, "not-found", "No such receipt", str(exc))
    if isinstance(exc, BadRequestError):
        return problem(400, "bad-request", "Bad request", str(exc))
    return problem(503, "journal-unavailable", "Receipt journal unavailable", str(exc))


def _on_http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = "the agent API is read only: GET /receipts, GET /receipts/{id}, POST /check, GET /openapi.json, /mcp"
    return problem(status, "not-found" if status == 404 else "method-not-allowed", str(getattr(exc, "detail", "")), detail)


def agent_app(receipts: OwnReceipts, mcp: Callable[..., Awaitable[None]] | None = None) -> Starlette:
    """The app; `mcp`: the MCP server's streamable HTTP endpoint (mcp.py), served at /mcp."""
    routes: list[BaseRoute] = [Route(e.path, e.view, methods=[e.method]) for e in ENDPOINTS]
    routes.append(Route("/", index, methods=["GET"]))
    if mcp is not None:
        routes.append(Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]))
    app = Starlette(
        routes=routes,
        exception_handlers={ReceiptsError: _on_receipts_error, HTTPException: _on_http_error},
    )
    app.state.receipts = receipts
    return app
