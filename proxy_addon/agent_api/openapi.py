"""The agent API's OpenAPI 3.1 document (`GET /openapi.json`), generated from its route table (api.py, ENDPOINTS)
and the models it answers with (pydantic, through views/schemas.py as the admin API's), never written by hand:
what it describes is what is served."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from proxy_addon.views.schemas import REF, Components, Param

NAMES = {"ReceiptView": "Receipt", "AgentReceiptView": "AgentReceipt", "TransitionView": "Transition",
         "RetryView": "RetryDecision", "CheckRequest": "Check", "CheckView": "CheckDecision", "ApprovalView": "Approval"}
PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                   "detail": {"type": "string"}},
    "required": ["type", "title", "status", "detail"],
}
INFO = {
    "title": "receipts agent API",
    "version": "1",
    "summary": "Your own receipts, asked through the receipts proxy: what can be proven happened before you act again.",
    "description": (
        "Answered by the proxy itself at its reserved host (`agent_api.host`, `receipts.internal` by default), over "
        "plain HTTP or HTTPS through the proxy; never forwarded, never journaled, read only. You see your own "
        "receipts: a configured agent's (proxy authentication), or, without one, every anonymous agent's. An MCP "
        "server with the same tools is at /mcp. Times are UTC, RFC 3339."
    ),
}


@dataclass(frozen=True)
class Reply:
    """One answer: what it means, and its JSON body's type (a pydantic model, a type, or a JSON schema)."""

    description: str
    body: Any = None
    problem: bool = False  # an RFC 9457 problem+json


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    view: Callable[..., Any]
    operation_id: str
    summary: str
    description: str | None = None
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    replies: Mapping[int, Reply] = ()  # type: ignore[assignment]


def _parameter(p: Param) -> dict[str, Any]:
    document: dict[str, Any] = {"name": p.name, "in": p.where, "required": p.where == "path", "schema": dict(p.schema)}
    extra = {"description": p.description, "style": p.style, "explode": p.explode}
    document.update({k: v for k, v in extra.items() if v is not None})
    return document


def _reply(reply: Reply, schemas: Components) -> dict[str, Any]:
    if reply.problem:
        return {"description": reply.description,
                "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}}}}
    if reply.body is None:
        return {"description": reply.description}
    return {"description": reply.description, "content": {"application/json": {"schema": schemas.schema_of(reply.body, "serialization")}}}


def _operation(e: Endpoint, schemas: Components) -> dict[str, Any]:
    document: dict[str, Any] = {"operationId": e.operation_id, "summary": e.summary}
    if e.description:
        document["description"] = e.description
    if e.params:
        document["parameters"] = [_parameter(p) for p in e.params]
    if e.body is not None:
        document["requestBody"] = {"required": True, "content": {"application/json": {"schema": schemas.schema_of(e.body, "validation")}}}
    replies = {**e.replies, 503: Reply("the journal cannot be read now; ask again later", problem=True)}
    document["responses"] = {str(status): _reply(replies[status], schemas) for status in sorted(replies)}
    return document


def document(endpoints: tuple[Endpoint, ...]) -> dict[str, Any]:
    schemas = Components(NAMES)
    schemas.schemas["Problem"] = PROBLEM
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, schemas)
    return {
        "openapi": "3.1.0",
        "info": INFO,
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.schemas.items()))},
    }
