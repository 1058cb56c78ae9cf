"""The admin app's routes: the JSON API, /metrics, /openapi.json, and the review pages (Jinja2, autoescaped)."""

from pathlib import Path
from typing import Any

from flask import Flask, Response, redirect, render_template, request, url_for

from proxy_addon import metrics
from proxy_addon.admin.guards import install_guards
from proxy_addon.admin.openapi import openapi_document
from proxy_addon.admin.views import (
    age_filter,
    duration_filter,
    is_page,
    json_response,
    list_filters,
    netloc_filter,
    pretty_filter,
    problem,
    shown_filter,
    status_of,
    ts_filter,
)
from proxy_addon.config import AdminSettings, ReceiptsConfig
from proxy_addon.exceptions import BadRequest, InvalidResolutionError, NotResolvableError, ReceiptsError, StaleStateError
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import RESOLUTION_STATES, RESOLVABLE_STATES, State
from proxy_addon.store import ReceiptStore
from proxy_addon.views import documents, journaled, review

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def create_app(config: ReceiptsConfig, store: ReceiptStore, settings: AdminSettings | None = None) -> Flask:
    settings = settings or config.admin
    app = Flask("proxy_addon.admin", template_folder=str(TEMPLATES))
    app.json.sort_keys = False  # type: ignore[attr-defined]
    registry = metrics.registry_for(store.retention.stats)
    app.jinja_env.filters.update(
        age=age_filter, ts=ts_filter, duration=duration_filter, pretty=pretty_filter, netloc=netloc_filter, shown=shown_filter
    )
    app.jinja_env.globals["STATES"] = [s.value for s in State]
    install_guards(app, settings)

    @app.errorhandler(404)
    def _not_found(_e: Any) -> Any:
        if is_page(request.path):
            return render_template("message.html", title="Not found", message=f"Nothing at {request.path}."), 404
        return problem(404, "not-found", "Not found", f"nothing at {request.path}")

    @app.errorhandler(405)
    def _not_allowed(_e: Any) -> Any:
        return problem(405, "method-not-allowed", "Method not allowed", f"{request.method} is not allowed here")

    @app.errorhandler(ReceiptsError)
    def _receipts_error(e: ReceiptsError) -> Any:
        status, kind = status_of(e)
        if is_page(request.path):
            return render_template("message.html", title="Error", message=str(e)), status
        return problem(status, kind, kind.replace("-", " ").capitalize(), str(e))

    # -- JSON API ---------------------------------------------------------------------------------------------

    @app.get("/receipts")
    def list_receipts() -> Response:
        states, host, older_than, limit = list_filters(default_state=None)
        rows = store.receipts.list(states=states, older_than=older_than, limit=limit, **documents.host_query(host))
        return json_response([documents.receipt_document(r) for r in rows])

    @app.get("/receipts/<operation_id>")
    def show_receipt(operation_id: str) -> Response:
        return json_response(documents.show_document(store.receipts.get(operation_id), store.receipts.history(operation_id)))

    @app.get("/receipts/<operation_id>/proof")
    def proof(operation_id: str) -> Response:
        return json_response(review.proof(store, config, operation_id))

    @app.post("/receipts/<operation_id>/resolve")
    def resolve(operation_id: str) -> Response:
        if not request.is_json:
            return problem(415, "unsupported-media-type", "JSON required", "send Content-Type: application/json")
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object: {state, note, external_id}")
        unknown = set(body) - {"state", "note", "external_id", "who"}
        if unknown:
            raise InvalidResolutionError(f"unknown field(s): {', '.join(sorted(unknown))}")
        fields = {k: body.get(k) for k in ("state", "note", "external_id", "who")}
        for name, value in fields.items():
            if value is not None and not isinstance(value, str):
                raise InvalidResolutionError(f"{name} must be a string")
        review.resolve(
            store,
            operation_id,
            fields["state"] or "",
            fields["note"] or "",
            fields["external_id"],
            who=fields["who"] or "admin-api",
        )
        return json_response(documents.show_document(store.receipts.get(operation_id), store.receipts.history(operation_id)))

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        body, content_type = metrics.exposition(registry)
        return Response(body, content_type=content_type)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return json_response(openapi_document())

    # -- pages ------------------------------------------------------------------------------------------------

    @app.get("/")
    def index() -> str:
        states, host, older_than, limit = list_filters(default_state="open")
        rows = store.receipts.list(states=states, older_than=older_than, limit=limit, **documents.host_query(host))
        return render_template(
            "index.html",
            rows=rows,
            now=utcnow(),
            stats=store.retention.stats(),
            limit=limit,
            open_states=[s.value for s in documents.STATE_GROUPS["open"]],
            selected=request.args.get("state", "open"),
            host=request.args.get("host", ""),
            host_filter=host,
            older_than=request.args.get("older_than", ""),
        )

    @app.get("/ui/receipts/<operation_id>")
    def receipt_page(operation_id: str, error: str | None = None, form: dict[str, str] | None = None) -> str:
        receipt = store.receipts.get(operation_id)
        history = store.receipts.history(operation_id)
        return render_template(
            "receipt.html",
            r=receipt,
            request_shown=journaled.request_view(receipt),
            response_shown=journaled.response_view(receipt),
            reads=journaled.reconcile_reads(history),
            history=history,
            now=utcnow(),
            proof=review.proof(store, config, operation_id),
            refusals=store.refusals.list(blocking_operation_id=operation_id, limit=20),
            resolvable=State(receipt.state) in RESOLVABLE_STATES,
            resolutions=sorted(s.value for s in RESOLUTION_STATES),
            resolved=request.args.get("resolved"),
            error=error,
            form=form or {},
        )

    @app.post("/ui/receipts/<operation_id>/resolve")
    def resolve_form(operation_id: str) -> Any:
        form = {k: request.form.get(k, "") for k in ("state", "note", "external_id", "who")}
        try:
            review.resolve(
                store, operation_id, form["state"], form["note"], form["external_id"], who=form["who"].strip() or "operator"
            )
        except (InvalidResolutionError, NotResolvableError, StaleStateError) as e:
            status, _ = status_of(e)
            return receipt_page(operation_id, error=str(e), form=form), status
        return redirect(url_for("receipt_page", operation_id=operation_id, resolved="1"), code=303)

    return app
