"""Route declarations (admin/routing.py): a module's `Routes`, installing them under their views' names, the
API's operations beside the pages, and the context the views find the store in."""

import pytest
from flask import Flask

from proxy_addon.admin.app import create_app
from proxy_addon.admin.routes import ALL
from proxy_addon.admin.routing import Operation, Reply, Routes, admin, declared_routes, install, json_reply, problem_reply
from proxy_addon.admin.views import ProblemView
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate

THING = Operation("getThing", "A thing", responses={200: json_reply({"type": "string"}, "the thing")})


def test_routes_are_declared_in_order_and_installed_under_their_views_names():
    routes = Routes()

    @routes.api("GET", "/thing", THING)
    def thing() -> str:
        return "a thing"

    @routes.page("/page")
    def page() -> str:
        return "a page"

    @routes.page("/form", "GET", "POST")
    def form() -> str:
        return "a form"

    assert [(r.rule, r.methods, r.endpoint, r.operation) for r in routes.routes] == [
        ("/thing", ("GET",), "thing", THING), ("/page", ("GET",), "page", None), ("/form", ("GET", "POST"), "form", None)]
    app = Flask("t")
    install(app, routes)
    assert dict(declared_routes(app)) == {r.endpoint: r for r in routes.routes}
    client = app.test_client()
    assert client.get("/thing").text == "a thing" and client.post("/form").text == "a form"
    assert client.post("/page").status_code == 405 and client.post("/thing").status_code == 405
    assert declared_routes(Flask("empty")) == {}


def test_two_views_of_one_name_are_refused():
    first, second = Routes(), Routes()

    @first.page("/a")
    def same() -> str:
        return "a"

    @second.page("/b")
    def same() -> str:  # noqa: F811
        return "b"

    with pytest.raises(ValueError, match="same"):
        install(Flask("t"), first, second)


def test_replies():
    assert problem_reply("gone") == Reply("gone", ProblemView, "application/problem+json")
    assert json_reply(int, "a number") == Reply("a number", int, "application/json")


def test_the_admin_app_is_its_route_modules(sqlite_url, tmp_path):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    store = ReceiptStore(engine)
    config = parse_config(f"secret_file: {tmp_path / 's'}")
    app = create_app(config, store)
    try:
        assert list(declared_routes(app).values()) == [r for m in ALL for r in m.routes]
        with app.app_context():
            context = admin()
            assert context.store is store and context.config is config and context.settings == config.admin
            assert context.login.token is None
    finally:
        engine.dispose()
