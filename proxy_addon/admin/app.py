"""The admin app, assembled: the guards, the error answers, and the routes of admin/routes/ (the JSON API,
/metrics, /openapi.json, and the review pages, Jinja2 templates with autoescape)."""

from pathlib import Path

from flask import Flask

from proxy_addon import metrics
from proxy_addon.admin import errors, routing
from proxy_addon.admin.guards import Guards
from proxy_addon.admin.routes import ALL
from proxy_addon.admin.views import age_filter, duration_filter, netloc_filter, pretty_filter, shown_filter, ts_filter
from proxy_addon.config import AdminSettings, ReceiptsConfig
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.views import rule_health

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def create_app(config: ReceiptsConfig, store: ReceiptStore, settings: AdminSettings | None = None) -> Flask:
    settings = settings or config.admin
    app = Flask("proxy_addon.admin", template_folder=str(TEMPLATES))
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.jinja_env.filters.update(
        age=age_filter, ts=ts_filter, duration=duration_filter, pretty=pretty_filter, netloc=netloc_filter, shown=shown_filter
    )
    app.jinja_env.globals["STATES"] = [s.value for s in State]
    guards = Guards(settings)
    guards.install(app)
    registry = metrics.registry_for(metrics.StoreReads(
        stats=store.retention.stats,
        unproven_rules=lambda: rule_health.unproven_rules(store),
        approvals_pending=store.approvals.pending_count,
        approval_wait_ratio=store.overview.approval_wait_ratio,
        instances=lambda: store.overview.instances(config.proxy.instance_dead_after),
    ))
    routing.set_context(app, routing.AdminContext(config, store, settings, registry, guards.login))
    errors.install(app)
    routing.install(app, *ALL)
    return app
