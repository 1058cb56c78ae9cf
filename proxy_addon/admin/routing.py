"""How a route of the admin app is declared: its rule, methods and view, and, for the JSON API, what the OpenAPI
document says of it (summary, parameters, request body, answers), written once beside the view.

A route module makes a `Routes` and decorates its views with `api(...)` (part of the API document) or `page(...)`
(for people: not in it). `create_app` installs every module's routes; admin/openapi.py reads the app's URL map
back, so what the document describes is what the app serves (and the tests refuse a route declared neither way).
Views find the store, the config and the login state in `admin()`, the app's `AdminContext`.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app
from prometheus_client import CollectorRegistry

from proxy_addon.admin.sessions import Login
from proxy_addon.admin.views import ProblemView
from proxy_addon.config import AdminSettings, ReceiptsConfig
from proxy_addon.rules.answers import PROBLEM_CONTENT_TYPE
from proxy_addon.store import ReceiptStore
from proxy_addon.views.schemas import Param

View = Callable[..., Any]
_CONTEXT = "receipts.admin"
_ROUTES = "receipts.routes"


@dataclass(frozen=True)
class Reply:
    """One answer of an operation: what it means, and its body's type (a pydantic model, a type pydantic can
    describe, or a JSON schema) in `media_type`; no body when `body` is None."""

    description: str
    body: Any = None
    media_type: str = "application/json"


def json_reply(body: Any, description: str) -> Reply:
    return Reply(description, body)


def problem_reply(description: str) -> Reply:
    return Reply(description, ProblemView, PROBLEM_CONTENT_TYPE)


@dataclass(frozen=True)
class Operation:
    """What the OpenAPI document says of one method of one API route."""

    operation_id: str
    summary: str
    responses: Mapping[int, Reply]
    description: str | None = None
    parameters: tuple[Param, ...] = ()
    body: Any = None  # the JSON request body's model; required when given


@dataclass(frozen=True)
class Route:
    rule: str
    methods: tuple[str, ...]
    view: View
    operation: Operation | None  # None: a page for people, not part of the API document

    @property
    def endpoint(self) -> str:
        return self.view.__name__


@dataclass
class Routes:
    """The routes of one module, in the order they were declared."""

    routes: list[Route] = field(default_factory=list)

    def api(self, method: str, rule: str, operation: Operation) -> Callable[[View], View]:
        return self._add(rule, (method,), operation)

    def page(self, rule: str, *methods: str) -> Callable[[View], View]:
        return self._add(rule, methods or ("GET",), None)

    def _add(self, rule: str, methods: tuple[str, ...], operation: Operation | None) -> Callable[[View], View]:
        def declare(view: View) -> View:
            self.routes.append(Route(rule, methods, view, operation))
            return view

        return declare


def install(app: Flask, *modules: Routes) -> None:
    """Add every route to the app, under its view's name (the templates' `url_for` names)."""
    declared: dict[str, Route] = app.extensions.setdefault(_ROUTES, {})
    for route in (r for m in modules for r in m.routes):
        if route.endpoint in declared:
            raise ValueError(f"two admin routes named {route.endpoint}")
        declared[route.endpoint] = route
        app.add_url_rule(route.rule, endpoint=route.endpoint, view_func=route.view, methods=list(route.methods))


def declared_routes(app: Flask) -> Mapping[str, Route]:
    """endpoint -> the route declared for it (Flask's own `static` is not one)."""
    return app.extensions.get(_ROUTES, {})


@dataclass(frozen=True)
class AdminContext:
    """What the views work with."""

    config: ReceiptsConfig
    store: ReceiptStore
    settings: AdminSettings
    registry: CollectorRegistry
    login: Login


def set_context(app: Flask, context: AdminContext) -> None:
    app.extensions[_CONTEXT] = context


def admin() -> AdminContext:
    """The context of the app handling the current request."""
    context: AdminContext = current_app.extensions[_CONTEXT]
    return context
