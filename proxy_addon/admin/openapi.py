"""The OpenAPI 3.1 document of the admin server's JSON API (served at /openapi.json); the receipt's schema is
generated from documents.ReceiptView, the journaled request's and the stored answer's from journaled.RequestView
and journaled.ResponseView, the rest written here."""

from typing import Any

from pydantic.json_schema import models_json_schema

from proxy_addon.rules.states import RESOLUTION_STATES, State
from proxy_addon.views.documents import ReceiptView
from proxy_addon.views.journaled import RequestView, ResponseView

_STATES = [s.value for s in State]
_TIME = {"type": "string", "format": "date-time"}
_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_TEXT_OR_NULL = {"type": ["string", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}



def _receipt_properties() -> dict[str, Any]:
    """The `Receipt` schema's properties, generated from the one definition of the public shape."""
    schema = ReceiptView.model_json_schema(ref_template="#/components/schemas/{model}")
    return {name: {k: v for k, v in prop.items() if k != "title"} for name, prop in schema["properties"].items()}


_RECEIPT_PROPERTIES = _receipt_properties()


def _untitled(schema: Any) -> Any:
    """A generated schema without pydantic's `title`s (the names are the components' own)."""
    if isinstance(schema, dict):
        return {k: _untitled(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_untitled(v) for v in schema]
    return schema


def _view_schemas() -> dict[str, Any]:
    """`RequestView`, `ResponseView` and the `BodyView` they hold, generated from their one definition."""
    _, top = models_json_schema(
        [(RequestView, "serialization"), (ResponseView, "serialization")], ref_template="#/components/schemas/{model}"
    )
    return {name: _untitled(schema) for name, schema in top["$defs"].items()}


_VIEW_SCHEMAS = _view_schemas()


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


_ID_PARAM = {
    "name": "operation_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the receipt's id (X-Receipt-Id on the proxy's answer)",
}
_UNAUTHORIZED = _problem("a token is configured and none (or a wrong one) was sent")
_NOT_FOUND = _problem("no receipt has this id")


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "receipts admin API",
            "version": "1",
            "summary": "Receipts of the writes AI agents made through the receipts proxy, and a person's verdicts.",
            "description": (
                "Served by the admin server (`admin.enabled: true`, or `receipts admin`). When a token is "
                "configured (the environment variable named by `admin.token_env`), every request needs "
                "`Authorization: Bearer <token>`. Times are UTC, RFC 3339."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{}, {"bearerToken": []}],
        "paths": {
            "/receipts": {
                "get": {
                    "operationId": "listReceipts",
                    "summary": "Receipts, newest first (the shape of `receipts ls --json`)",
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "description": "a state, or `open` (every open state) or `unknown` (outcome_unknown, "
                            "reconciling, manual_review); repeat it or separate with commas",
                            "schema": {"type": "array", "items": {"type": "string"}},
                            "style": "form",
                            "explode": True,
                        },
                        {
                            "name": "host",
                            "in": "query",
                            "description": "a host, or `host:port` (`[::1]:8080` for IPv6); without a port, every port",
                            "schema": {"type": "string", "examples": ["api.example.com", "127.0.0.1:18112"]},
                        },
                        {
                            "name": "older_than",
                            "in": "query",
                            "description": "only receipts created longer ago than this duration, e.g. `10m`, `2h`",
                            "schema": {"type": "string", "examples": ["10m"]},
                        },
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 200}},
                    ],
                    "responses": {
                        "200": _json({"type": "array", "items": _ref("Receipt")}, "the receipts"),
                        "400": _problem("a parameter cannot be used (unknown state, bad duration)"),
                        "401": _UNAUTHORIZED,
                    },
                }
            },
            "/receipts/{operation_id}": {
                "get": {
                    "operationId": "getReceipt",
                    "summary": "One receipt with its whole history (the shape of `receipts show --json`)",
                    "parameters": [_ID_PARAM],
                    "responses": {
                        "200": _json(_ref("ReceiptWithHistory"), "the receipt"),
                        "401": _UNAUTHORIZED,
                        "404": _NOT_FOUND,
                    },
                }
            },
            "/receipts/{operation_id}/proof": {
                "get": {
                    "operationId": "getProof",
                    "summary": "What can the system prove happened before I act again?",
                    "description": "The receipt's state and evidence, and what the proxy would do now with the same "
                    "request again: forward it (a new receipt), refuse it (409) or replay the stored answer.",
                    "parameters": [_ID_PARAM],
                    "responses": {
                        "200": _json(_ref("Proof"), "what is proven, and what a retry would get"),
                        "401": _UNAUTHORIZED,
                        "404": _NOT_FOUND,
                    },
                }
            },
            "/receipts/{operation_id}/resolve": {
                "post": {
                    "operationId": "resolveReceipt",
                    "summary": "A person's verdict on a manual_review or outcome_unknown receipt (as `receipts resolve`)",
                    "parameters": [_ID_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("Resolution")}},
                    },
                    "responses": {
                        "200": _json(_ref("ReceiptWithHistory"), "resolved; the note is in the history"),
                        "400": _problem("the body is not a JSON object"),
                        "401": _UNAUTHORIZED,
                        "404": _NOT_FOUND,
                        "409": _problem("the receipt is not in manual_review or outcome_unknown (or changed meanwhile)"),
                        "415": _problem("the body is not application/json"),
                        "422": _problem("the state is not succeeded or safe_to_retry, or the note is missing"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics (text exposition format)",
                    "responses": {
                        "200": {"description": "the metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                        "401": _UNAUTHORIZED,
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {"200": _json({"type": "object"}, "the OpenAPI document"), "401": _UNAUTHORIZED},
                }
            },
        },
        "components": {
            "securitySchemes": {"bearerToken": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "State": {"type": "string", "enum": _STATES},
                **_VIEW_SCHEMAS,
                "Receipt": {
                    "type": "object",
                    "properties": _RECEIPT_PROPERTIES,
                    "required": list(_RECEIPT_PROPERTIES),
                    "additionalProperties": False,
                },
                "Transition": {
                    "type": "object",
                    "properties": {
                        "from_state": {"oneOf": [_ref("State"), {"type": "null"}]},
                        "to_state": _ref("State"),
                        "recorded_at": _TIME,
                        "detail": {
                            "type": "object",
                            "description": "who made the change, and its error, evidence or note",
                        },
                    },
                    "required": ["from_state", "to_state", "recorded_at", "detail"],
                    "additionalProperties": False,
                },
                "ReceiptWithHistory": {
                    "type": "object",
                    "description": "a Receipt with the request as journaled (secrets redacted), the upstream's stored "
                    "answer (null when none was kept), and its whole history, oldest first",
                    "properties": {
                        **_RECEIPT_PROPERTIES,
                        "request": _ref("RequestView"),
                        "response": {"oneOf": [_ref("ResponseView"), {"type": "null"}]},
                        "transitions": {"type": "array", "items": _ref("Transition")},
                    },
                    "required": [*_RECEIPT_PROPERTIES, "request", "response", "transitions"],
                    "additionalProperties": False,
                },
                "RetryDecision": {
                    "type": "object",
                    "properties": {
                        "decision": {"type": "string", "enum": ["forwarded", "refused", "replayed"]},
                        "status": {
                            **_INT_OR_NULL,
                            "description": "409 when refused, the stored status when replayed, null when forwarded",
                        },
                        "problem": {"type": ["string", "null"], "enum": ["duplicate-open", "duplicate-succeeded", None]},
                        "blocking_operation_id": _TEXT_OR_NULL,
                        "until": {**_TIME_OR_NULL, "description": "when a refusal or replay after success ends"},
                        "reason": {"type": "string"},
                    },
                    "required": ["decision", "status", "problem", "blocking_operation_id", "until", "reason"],
                    "additionalProperties": False,
                },
                "Proof": {
                    "type": "object",
                    "properties": {
                        "operation_id": {"type": "string"},
                        "operation": {"type": "string"},
                        "method": {"type": "string"},
                        "host": {"type": "string"},
                        "path": {"type": "string"},
                        "state": _ref("State"),
                        "open": {"type": "boolean", "description": "the outcome is not settled yet"},
                        "proven": {"type": "boolean", "description": "a terminal state: the outcome is settled"},
                        "what_happened": {"type": "string"},
                        "external_id": _TEXT_OR_NULL,
                        "status_code": _INT_OR_NULL,
                        "error_code": _TEXT_OR_NULL,
                        "submitted_at": _TIME_OR_NULL,
                        "completed_at": _TIME_OR_NULL,
                        "retry": _ref("RetryDecision"),
                        "duplicates_refused": {"type": "integer", "description": "requests this receipt blocked"},
                        "evidence": {
                            "type": "array",
                            "description": "the transitions that say something about the outcome",
                            "items": _ref("Transition"),
                        },
                    },
                    "required": [
                        "operation_id", "state", "open", "proven", "what_happened", "external_id",
                        "retry", "duplicates_refused", "evidence",
                    ],
                    "additionalProperties": False,
                },
                "Resolution": {
                    "type": "object",
                    "properties": {
                        "state": {"type": "string", "enum": sorted(s.value for s in RESOLUTION_STATES)},
                        "note": {"type": "string", "minLength": 1, "description": "what you checked; kept in the history"},
                        "external_id": {"type": ["string", "null"]},
                        "who": {"type": "string", "description": "who decides (default admin-api)"},
                    },
                    "required": ["state", "note"],
                    "additionalProperties": False,
                },
                "Problem": {
                    "type": "object",
                    "description": "RFC 9457 problem details",
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                    },
                    "required": ["type", "title", "status", "detail"],
                },
            },
        },
    }
