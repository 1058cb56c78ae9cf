"""An approval as people and tools see it: `ApprovalView` is the one definition of its public shape (the objects
of `receipts approvals --json`, `GET /approvals`, `GET /approvals/{id}`, and their OpenAPI schema).

The request is shown as it was journaled (request/journaled.py's RequestView): secrets were redacted before it
was stored, so the person judges what the agent sent without seeing a credential.
"""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.rules.records import ApprovalRecord
from proxy_addon.rules.states import ApprovalState
from proxy_addon.views.journaled import RequestView, request_url, request_view

_TIME = "UTC, RFC 3339"
LIST_COLUMNS = ("approval_id", "state", "operation", "method", "url", "asked", "requested_at", "expires_at", "decided_by")


class ApprovalView(BaseModel):
    """A person's approval of one intent (account + fingerprint), and the request that asked for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    approval_id: str = Field(description="`ap_` and 32 hex digits: the `approval_id` of the agent's 403")
    state: ApprovalState
    operation: str = Field(description="the rule's name, the protocol's, or `METHOD host path-template`")
    method: str
    host: str
    port: int
    path: str
    url: str = Field(description="as journaled: the query's secret parameters redacted")
    account: str = Field(description="the agent's account: a keyed hash of its credentials, never the credentials")
    intent_fingerprint: str
    asked: int = Field(description="how many times the agent sent this request while it waited")
    requested_at: datetime = Field(description=_TIME)
    last_asked_at: datetime = Field(description=_TIME)
    expires_at: datetime = Field(
        description=_TIME + "; pending: decide before it; approved: used before it; denied: the denial stands till then"
    )
    decided_at: datetime | None = Field(description=_TIME)
    decided_by: str | None = Field(description="who approved or denied it")
    note: str | None = Field(description="why, in the decider's words")
    operation_id: str | None = Field(description="the receipt that used it up (state `used`)")
    request: RequestView = Field(description="the request as journaled, secrets redacted")


def approval_view(a: ApprovalRecord) -> ApprovalView:
    fields = {name: getattr(a, name) for name in ApprovalView.model_fields if name not in ("url", "request")}
    return ApprovalView(**fields, url=request_url(a), request=request_view(a))


def approval_document(a: ApprovalRecord) -> dict[str, Any]:
    return approval_view(a).model_dump()
