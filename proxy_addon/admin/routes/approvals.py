"""Approvals for people: the JSON API (list, show, and a person's decision: `Decision`, the body it takes), and the
review page's queue (each pending request as journaled, with its approve and deny form).

Served by the admin server only, which the proxy refuses as a destination (addons/admission.py): an agent
cannot approve its own request.
"""

from typing import Any

from flask import Response, redirect, render_template, request, url_for
from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.admin.routing import Operation, Param, Routes, admin, json_reply, problem_reply
from proxy_addon.admin.views import json_response, problem, status_of, string_fields
from proxy_addon.exceptions import BadRequestError, NotDecidableError
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import ApprovalState
from proxy_addon.views.approvals import ApprovalView, approval_document, approval_view

routes = Routes()


class Decision(BaseModel):
    """The body of `POST /approvals/{approval_id}/approve` and `/deny`."""

    model_config = ConfigDict(extra="forbid")

    note: str = Field(min_length=1, description="why; kept with the approval (a denial's note is shown to the agent)")
    who: str = Field("admin-api", description="who decides (default admin-api)")


APPROVAL_ID = Param("approval_id", "path", {"type": "string"}, "the approval's id (`approval_id` of the agent's 403)")
NOT_FOUND = problem_reply("no approval has this id")
STATES = [s.value for s in ApprovalState]


@routes.api("GET", "/approvals", Operation(
    "listApprovals",
    "Approvals, newest request first (the shape of `receipts approvals --json`)",
    parameters=(Param("state", "query", {"type": "string", "enum": STATES}, "only approvals in this state"),),
    responses={200: json_reply(list[ApprovalView], "the approvals"), 400: problem_reply("an unknown state")},
))
def list_approvals() -> Response:
    state = request.args.get("state") or None
    if state is not None and state not in STATES:
        raise BadRequestError(f"unknown approval state {state!r} (one of {', '.join(STATES)})")
    return json_response([approval_document(a) for a in admin().store.approvals.list(state=state)])


@routes.api("GET", "/approvals/<approval_id>", Operation(
    "getApproval",
    "One approval, with the request as journaled (secrets redacted)",
    parameters=(APPROVAL_ID,),
    responses={200: json_reply(ApprovalView, "the approval"), 404: NOT_FOUND},
))
def show_approval(approval_id: str) -> Response:
    return json_response(approval_document(admin().store.approvals.get(approval_id)))


def _decision_operation(decision: str, summary: str) -> Operation:
    return Operation(
        f"{decision}Approval",
        summary,
        parameters=(APPROVAL_ID,),
        body=Decision,
        responses={
            200: json_reply(ApprovalView, "decided; who, when and why are kept with it"),
            400: problem_reply("the body is not a JSON object with a note"),
            404: NOT_FOUND,
            409: problem_reply("the approval is not pending (decided, used or expired)"),
            415: problem_reply("the body is not application/json"),
        },
    )


@routes.api("POST", "/approvals/<approval_id>/approve", _decision_operation(
    "approve", "Approve a pending request: the same request, sent again before expiry, is forwarded once"
))
def approve(approval_id: str) -> Response:
    return _decide(approval_id, "approve")


@routes.api("POST", "/approvals/<approval_id>/deny", _decision_operation(
    "deny", "Deny a pending request: the agent is answered 403 approval-denied with the note"
))
def deny(approval_id: str) -> Response:
    return _decide(approval_id, "deny")


def _decide(approval_id: str, decision: str) -> Response:
    if not request.is_json:
        return problem(415, "unsupported-media-type", "JSON required", "send Content-Type: application/json")
    fields = decision_fields(request.get_json(silent=True))
    decided = admin().store.approvals.decide(approval_id, decision, fields["note"], fields["who"] or "admin-api")
    return json_response(approval_document(decided))


def decision_fields(body: Any) -> dict[str, str]:
    """The body's `note` and `who`, strings; BadRequestError says in one line what is wrong."""
    fields = string_fields(body, Decision)
    note = fields["note"]
    if note is None or not note.strip():
        raise BadRequestError("note is required: a non-empty string saying why")
    return {"note": note, "who": fields["who"] or ""}


# -- the review page's queue -------------------------------------------------------------------------------------


@routes.page("/ui/approvals")
def approvals_page(error: str | None = None) -> str:
    store = admin().store
    shown = [approval_view(a) for a in store.approvals.list()]
    decided_id = request.args.get("decided")
    return render_template(
        "approvals.html",
        pending=[a for a in shown if a.state == ApprovalState.PENDING],
        past=[a for a in shown if a.state != ApprovalState.PENDING],
        decided=next((a for a in shown if a.approval_id == decided_id), None),
        error=error,
        now=utcnow(),
    )


@routes.page("/ui/approvals/<approval_id>/decide", "POST")
def decide_form(approval_id: str) -> Any:
    decision = request.form.get("decision", "")
    if decision not in ("approve", "deny"):
        return approvals_page(error="choose Approve or Deny"), 400
    try:
        admin().store.approvals.decide(
            approval_id, decision, request.form.get("note", ""), request.form.get("who", "").strip() or "operator"
        )
    except NotDecidableError as e:
        return approvals_page(error=str(e)), status_of(e)[0]
    return redirect(url_for("approvals_page", decided=approval_id), code=303)
