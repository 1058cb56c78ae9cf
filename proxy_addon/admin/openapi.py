"""The OpenAPI 3.1 document of the admin server's JSON API (served at /openapi.json), built from the app itself:
its URL map gives the paths and methods, each route's declaration (admin/routing.py, beside its view) the
summary, parameters and answers, and the view models (views/documents.py, views/review.py, views/journaled.py,
the request body's model) every schema, through pydantic. Nothing is described twice, so the document cannot
drift from what the server serves.
"""

import re
from collections.abc import Iterator
from typing import Any

from flask import Flask
from werkzeug.routing import Rule

from proxy_addon.admin.guards import ANSWERS
from proxy_addon.admin.routing import Operation, Param, Reply, declared_routes
from proxy_addon.views import schemas

# the schemas' names in the document, where the model's own name is not the one clients know
SCHEMA_NAMES = {
    "ReceiptView": "Receipt",
    "ShowView": "ReceiptWithHistory",
    "TransitionView": "Transition",
    "ProofView": "Proof",
    "RetryView": "RetryDecision",
    "ProblemView": "Problem",
    "ApprovalView": "Approval",
}
INFO = {
    "title": "receipts admin API",
    "version": "1",
    "summary": "Receipts of the writes AI agents made through the receipts proxy, and a person's verdicts.",
    "description": (
        "Served by the admin server (`admin.enabled: true`, or `receipts admin`). When a token is "
        "configured (the environment variable named by `admin.token_env`), every request needs "
        "`Authorization: Bearer <token>`. Times are UTC, RFC 3339."
    ),
}


class Components(schemas.Components):
    """The admin API's schemas, under the names its clients know."""

    def __init__(self) -> None:
        super().__init__(SCHEMA_NAMES)


def openapi_path(rule: Rule) -> str:
    """`/receipts/<operation_id>` -> `/receipts/{operation_id}`."""
    return re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)


def api_operations(app: Flask) -> Iterator[tuple[str, str, Operation]]:
    """(path, method, operation) of every API route the app serves, in the URL map's order."""
    routes = declared_routes(app)
    for rule in app.url_map.iter_rules():
        route = routes.get(rule.endpoint)
        if route is None or route.operation is None:
            continue
        declared = {p.name for p in route.operation.parameters if p.where == "path"}
        if declared != set(rule.arguments):
            raise ValueError(f"{rule.rule}: path parameters {sorted(rule.arguments)}, declared {sorted(declared)}")
        for method in route.methods:
            yield openapi_path(rule), method.lower(), route.operation


def parameter_document(p: Param) -> dict[str, Any]:
    document: dict[str, Any] = {"name": p.name, "in": p.where}
    if p.description is not None:
        document["description"] = p.description
    if p.where == "path":
        document["required"] = True
    document["schema"] = dict(p.schema)
    if p.style is not None:
        document["style"] = p.style
    if p.explode is not None:
        document["explode"] = p.explode
    return document


def reply_document(reply: Reply, components: Components) -> dict[str, Any]:
    if reply.body is None:
        return {"description": reply.description}
    schema = components.schema_of(reply.body, "serialization")
    return {"description": reply.description, "content": {reply.media_type: {"schema": schema}}}


def operation_document(op: Operation, components: Components) -> dict[str, Any]:
    document: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.description is not None:
        document["description"] = op.description
    if op.parameters:
        document["parameters"] = [parameter_document(p) for p in op.parameters]
    if op.body is not None:
        schema = components.schema_of(op.body, "validation")
        document["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    replies = {**ANSWERS, **op.responses}
    document["responses"] = {str(status): reply_document(replies[status], components) for status in sorted(replies)}
    return document


def openapi_document(app: Flask) -> dict[str, Any]:
    components = Components()
    paths: dict[str, dict[str, Any]] = {}
    for path, method, op in api_operations(app):
        paths.setdefault(path, {})[method] = operation_document(op, components)
    return {
        "openapi": "3.1.0",
        "info": INFO,
        "servers": [{"url": "/"}],
        "security": [{}, {"bearerToken": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerToken": {"type": "http", "scheme": "bearer"}},
            "schemas": dict(sorted(components.schemas.items())),
        },
    }
