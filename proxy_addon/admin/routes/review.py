"""The review pages for people: the list of receipts, one receipt with its request, answer and timeline, and the
form that settles it."""

from typing import Any

from flask import redirect, render_template, request, url_for

from proxy_addon.admin.routing import Routes, admin
from proxy_addon.admin.views import host_arg, list_page, status_of
from proxy_addon.exceptions import InvalidResolutionError, NotResolvableError, StaleStateError
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import RESOLUTION_STATES, RESOLVABLE_STATES, State
from proxy_addon.views import glance, journaled, review, rule_health

routes = Routes()
FORM_FIELDS = ("state", "note", "external_id", "who")


@routes.page("/")
def index() -> str:
    store = admin().store
    rows, after = list_page(store, default_state="open")
    return render_template(
        "index.html",
        rows=rows,
        next_page=_page_after(after),
        now=utcnow(),
        head=glance.header(store.retention.stats()),
        chart=glance.chart(store.overview.recent_writes()),
        selected=request.args.get("state", "open"),
        host=request.args.get("host", ""),
        host_filter=host_arg(request.args),
        agent=request.args.get("agent", ""),
        older_than=request.args.get("older_than", ""),
        rule_health=rule_health.stored_health(store, admin().config),
    )


def _page_after(after: str | None) -> str | None:
    """The URL of the next page of the list: the same filters, after the last receipt shown."""
    if after is None:
        return None
    query: dict[str, Any] = {**request.args.to_dict(), "after": after}
    return url_for("index", **query)


@routes.page("/ui/receipts/<operation_id>")
def receipt_page(operation_id: str, error: str | None = None, form: dict[str, str] | None = None) -> str:
    context = admin()
    receipt = context.store.receipts.get(operation_id)
    history = context.store.receipts.history(operation_id)
    return render_template(
        "receipt.html",
        r=receipt,
        request_shown=journaled.request_view(receipt),
        response_shown=journaled.response_view(receipt),
        reads=journaled.reconcile_reads(history),
        history=history,
        now=utcnow(),
        proof=review.proof(context.store, context.config, operation_id),
        refusals=context.store.refusals.list(blocking_operation_id=operation_id, limit=20),
        resolvable=State(receipt.state) in RESOLVABLE_STATES,
        resolutions=sorted(s.value for s in RESOLUTION_STATES),
        resolved=request.args.get("resolved"),
        error=error,
        form=form or {},
    )


@routes.page("/ui/receipts/<operation_id>/resolve", "POST")
def resolve_form(operation_id: str) -> Any:
    form = {k: request.form.get(k, "") for k in FORM_FIELDS}
    try:
        review.resolve(
            admin().store, operation_id, form["state"], form["note"], form["external_id"], who=form["who"].strip() or "operator"
        )
    except (InvalidResolutionError, NotResolvableError, StaleStateError) as e:
        status, _ = status_of(e)
        return receipt_page(operation_id, error=str(e), form=form), status
    return redirect(url_for("receipt_page", operation_id=operation_id, resolved="1"), code=303)
