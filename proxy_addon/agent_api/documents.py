"""What an agent is shown of its own receipts: the operator's documents (views/), redacted exactly as they are, with
what an agent acts on added (is it still open, what happened, what a retry would get, where to ask again), and the
answer of `POST /check`. The agent API's OpenAPI document is generated from these models (agent_api/openapi.py).
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.agent_api.check import Checked, Decision
from proxy_addon.config import ReceiptsConfig
from proxy_addon.protocols.base import problem_of
from proxy_addon.rules.records import ReceiptRecord, TransitionRecord
from proxy_addon.rules.states import TERMINAL_STATES, State
from proxy_addon.store import ReceiptStore
from proxy_addon.views import documents, review
from proxy_addon.views.approvals import ApprovalView, approval_view
from proxy_addon.views.documents import ReceiptView, ShowView
from proxy_addon.views.review import RetryView


class AgentReceiptView(ShowView):
    """One of the agent's receipts: the operator's `receipts show --json` document, with what the agent acts on."""

    open: bool = Field(description="its outcome is not settled yet: a retry of the same request is refused meanwhile")
    what_happened: str = Field(description="what the system can prove happened, in one sentence")
    retry: RetryView = Field(description="what the proxy would do now with the same request again")
    receipt_url: str = Field(description="this document's URL")


class CheckView(BaseModel):
    """What the proxy would do now with the request, computed by the code a real write runs; nothing was
    journaled, forwarded or stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Decision = Field(
        description="forward: a new receipt, sent upstream once; replay: the stored answer of an earlier success, "
        "nothing sent; refuse: the proxy answers itself, nothing sent; approval_required: a person must approve it "
        "first; not_journaled: it passes through untouched (a read, or a host or method that is not journaled)"
    )
    reason: str
    status: int | None = Field(description="the status of the answer the proxy would give itself; null when the upstream answers")
    problem: str | None = Field(description="the problem type's last segment: duplicate-open, duplicate-succeeded, ...")
    operation: str | None = Field(description="the operation it would be journaled as")
    operation_id: str | None = Field(description="the receipt concerned: the one in the way, or the one replayed")
    state: State | None = Field(description="that receipt's state")
    receipt_url: str | None = Field(description="where to ask for that receipt")
    receipt: ReceiptView | None = Field(description="that receipt, when it is one of the asking agent's own")
    approval: ApprovalView | None = Field(description="the approval concerned: pending, denied, or used up by the write")
    waits: float | None = Field(
        description="in_flight.policy wait: the write would first wait up to this many seconds for the open "
        "receipt's verdict, then get what a repeat after that verdict gets"
    )


def receipt_document(store: ReceiptStore, config: ReceiptsConfig, r: ReceiptRecord, history: list[TransitionRecord]) -> dict[str, Any]:
    """The agent's view of one of its receipts (AgentReceiptView's fields)."""
    return {
        **documents.show_document(r, history),
        "open": State(r.state) not in TERMINAL_STATES,
        "what_happened": review.what_happened(r, history),
        "retry": review.retry_decision(store, config, r).document(),
        "receipt_url": config.agent_api.receipt_url(r.operation_id) or "",
    }


def check_document(checked: Checked, config: ReceiptsConfig, visible: bool) -> dict[str, Any]:
    """CheckView's fields; `visible`: the receipt concerned is the asking agent's own (else only its id and state,
    as the write's own answer would name them)."""
    r, answer = checked.receipt, checked.answer
    found = problem_of(answer) if answer is not None else None
    operation_id = r.operation_id if r is not None else (found.operation_id if found is not None else None)
    return {
        "decision": checked.decision,
        "reason": checked.reason,
        "status": answer.status if answer is not None else None,
        "problem": checked.problem,
        "operation": checked.operation,
        "operation_id": operation_id,
        "state": r.state if r is not None else None,
        "receipt_url": config.agent_api.receipt_url(operation_id) if operation_id else None,
        "receipt": documents.receipt_document(r) if r is not None and visible else None,
        "approval": approval_view(checked.approval).model_dump() if checked.approval is not None else None,
        "waits": checked.waits,
    }

