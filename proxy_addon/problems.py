"""The answers the proxy gives on its own, as RFC 9457 problem+json documents."""

import json
from typing import Any

from mitmproxy import http

PROBLEM_BASE = "urn:agent-receipts:problem:"
PROBLEM_CONTENT_TYPE = "application/problem+json"


def problem_response(status: int, kind: str, title: str, detail: str, **extra: Any) -> http.Response:
    body = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    body.update({k: v for k, v in extra.items() if v is not None})
    return http.Response.make(
        status, json.dumps(body).encode(), {"Content-Type": PROBLEM_CONTENT_TYPE, "Cache-Control": "no-store"}
    )


def outcome_unknown(operation_id: str, reason: str, upstream_status: int | None = None) -> http.Response:
    return problem_response(
        504,
        "outcome-unknown",
        "Outcome unknown",
        f"{reason}. The upstream may have acted on this request; retrying it is blocked until the receipt "
        "is reconciled (receipts reconcile) or resolved by a person.",
        operation_id=operation_id,
        state="outcome_unknown",
        upstream_status=upstream_status,
    )


def not_sent(operation_id: str, reason: str) -> http.Response:
    return problem_response(
        502,
        "not-sent",
        "Upstream not reached",
        f"{reason}. Nothing reached the upstream, so retrying is allowed.",
        operation_id=operation_id,
        state="rejected",
    )


def duplicate_open(operation_id: str, state: str) -> http.Response:
    return problem_response(
        409,
        "duplicate-open",
        "Duplicate of an open receipt",
        f"The same request is already recorded as {operation_id}, which is {state}; it was not forwarded again. "
        "Wait for the receipt to be reconciled before acting again.",
        operation_id=operation_id,
        state=state,
    )


def duplicate_succeeded(operation_id: str) -> http.Response:
    return problem_response(
        409,
        "duplicate-succeeded",
        "Duplicate of a recent success",
        f"The same request already succeeded as {operation_id}; it was not forwarded again.",
        operation_id=operation_id,
        state="succeeded",
    )


def idempotency_key_mismatch(operation_id: str, state: str, key: str) -> http.Response:
    return problem_response(
        422,
        "idempotency-key-mismatch",
        "Idempotency-Key reused for a different request",
        f"Idempotency-Key {key!r} belongs to {operation_id}, whose request differs from this one; nothing was forwarded.",
        operation_id=operation_id,
        state=state,
    )


def journal_unavailable(reason: str) -> http.Response:
    return problem_response(
        503,
        "journal-unavailable",
        "Receipt journal unavailable",
        f"The receipt could not be written ({reason}); the request was not forwarded. Retrying later is safe.",
    )
