"""Each guard of the admin server on its own (the Host name, the Origin, the forms' CSRF token, the login), the
order `Guards` runs them in, and the security headers; each in a request context of the real admin app."""

import pytest
from flask import Response, g, request

from proxy_addon.admin.app import create_app
from proxy_addon.admin.guards import (
    LOOPBACK_NAMES,
    SESSION_COOKIE,
    CsrfTokens,
    Guards,
    cross_origin,
    missing_csrf,
    not_logged_in,
    same_origin,
    security_headers,
    wrong_host,
)
from proxy_addon.admin.sessions import LOGIN_COOKIE, Login
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate

TOKEN = "guards-test-token-0123456789"


@pytest.fixture
def config(tmp_path):
    return parse_config(f"secret_file: {tmp_path / 's'}")


@pytest.fixture
def app(sqlite_url, config):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield create_app(config, ReceiptStore(engine))
    engine.dispose()


def kind(response) -> str:
    return response.get_json()["type"].rsplit(":", 1)[-1]


@pytest.mark.parametrize("host, refused", [
    ("127.0.0.1:8081", False), ("localhost", False), ("[::1]:8081", False), ("LOCALHOST:1", False),
    ("attacker.example:8081", True), ("127.0.0.1.nip.io", True),
])
def test_wrong_host(app, host, refused):
    with app.test_request_context("/receipts", headers={"Host": host}):
        refusal = wrong_host(request, LOOPBACK_NAMES)
        assert (refusal is not None) == refused
        if refused:
            assert refusal.status_code == 421 and kind(refusal) == "misdirected"


@pytest.mark.parametrize("method, headers, refused", [
    ("GET", {"Origin": "http://evil.example"}, False),  # only a POST changes anything
    ("POST", {}, False),  # no Origin nor Referer: not a browser's cross-site request
    ("POST", {"Origin": "http://localhost"}, False),
    ("POST", {"Origin": "http://evil.example"}, True),
    ("POST", {"Origin": "null"}, True),
    ("POST", {"Origin": "http://localhost:8081"}, True),  # another port is another origin
    ("POST", {"Referer": "http://localhost/ui/receipts/op_1"}, False),
    ("POST", {"Referer": "http://evil.example/localhost"}, True),
])
def test_cross_origin(app, method, headers, refused):
    with app.test_request_context("/receipts/op_1/resolve", method=method, headers=headers):
        assert same_origin(request) == (not refused) or method == "GET"
        refusal = cross_origin(request)
        assert (refusal is not None) == refused
        if refused:
            assert refusal.status_code == 403 and kind(refusal) == "cross-origin"


def test_missing_csrf(app):
    csrf = CsrfTokens()
    good = csrf.for_session("abc")
    cases = [
        ("/receipts/op_1/resolve", "POST", None, {}, False),  # the API: JSON, never a form
        ("/ui/receipts/op_1", "GET", None, {}, False),
        ("/ui/receipts/op_1/resolve", "POST", None, {"csrf_token": good}, True),  # no session cookie
        ("/ui/receipts/op_1/resolve", "POST", "abc", {}, True),
        ("/ui/receipts/op_1/resolve", "POST", "abc", {"csrf_token": "0" * 64}, True),
        ("/ui/receipts/op_1/resolve", "POST", "other", {"csrf_token": good}, True),  # another browser's token
        ("/ui/receipts/op_1/resolve", "POST", "abc", {"csrf_token": good}, False),
        ("/logout", "POST", "abc", {"csrf_token": good}, False),
    ]
    for path, method, session, form, refused in cases:
        headers = {"Cookie": f"{SESSION_COOKIE}={session}"} if session else {}
        with app.test_request_context(path, method=method, data=form, headers=headers):
            refusal = missing_csrf(request, csrf)
            assert (refusal is not None) == refused, (path, session, form)
            if refused:
                assert refusal.status_code == 403 and kind(refusal) == "csrf"
    assert CsrfTokens().for_session("abc") != good  # a key of each server's own


def test_a_page_gets_a_session_and_its_token(app):
    csrf = CsrfTokens()
    with app.test_request_context("/"):
        token = csrf.for_page()
        assert csrf.for_page() == token and token == csrf.for_session(g.new_session)
        response = security_headers(Response("<p>hi</p>", mimetype="text/html"))
        assert f"{SESSION_COOKIE}={g.new_session}" in response.headers["Set-Cookie"]
    with app.test_request_context("/", headers={"Cookie": f"{SESSION_COOKIE}=kept"}):
        assert csrf.for_page() == csrf.for_session("kept") and g.get("new_session") is None
        assert "Set-Cookie" not in security_headers(Response("<p>hi</p>", mimetype="text/html")).headers


def test_not_logged_in(app):
    login = Login(TOKEN)
    cookie = login.sessions.issue()
    with app.test_request_context("/receipts"):
        assert not_logged_in(request, Login(None)) is None  # no token: everyone
        refusal = not_logged_in(request, login)
        assert refusal.status_code == 401 and kind(refusal) == "unauthorized"
        assert refusal.headers["WWW-Authenticate"] == 'Bearer realm="receipts"'
    for headers, refused in (({"Authorization": f"Bearer {TOKEN}"}, False), ({"Authorization": f"Bearer  {TOKEN} "}, False),
                             ({"Authorization": "Bearer wrong"}, True), ({"Authorization": f"Basic {TOKEN}"}, True),
                             ({"Cookie": f"{LOGIN_COOKIE}={cookie}"}, False), ({"Cookie": f"{LOGIN_COOKIE}=1.2.3"}, True)):
        with app.test_request_context("/metrics", headers=headers):
            assert (not_logged_in(request, login) is not None) == refused, headers
    with app.test_request_context("/ui/receipts/op_1?x=1"):
        refusal = not_logged_in(request, login)
        assert refusal.status_code == 302 and refusal.headers["Location"] == "/login?next=/ui/receipts/op_1?x%3D1"
    with app.test_request_context("/"):
        assert not_logged_in(request, login).headers["Location"] == "/login?next=/"
    with app.test_request_context("/login", method="POST"):
        assert not_logged_in(request, login) is None  # where the token is typed in


def test_security_headers(app):
    with app.test_request_context("/"):
        page = security_headers(Response("<p>hi</p>", mimetype="text/html"))
        api = security_headers(Response("{}", mimetype="application/json", headers={"Cache-Control": "max-age=5"}))
    assert page.headers["Cache-Control"] == "no-store" and api.headers["Cache-Control"] == "max-age=5"
    for r in (page, api):
        assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Referrer-Policy"] == "same-origin"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "Content-Security-Policy" not in api.headers


def test_guards_run_in_order_and_the_host_check_only_without_a_token(app, config, monkeypatch):
    guards = Guards(config.admin)
    evil = {"Host": "attacker.example", "Origin": "http://evil.example"}
    with app.test_request_context("/ui/receipts/op_1/resolve", method="POST", headers=evil):
        assert guards.check(request).status_code == 421  # the Host first
    with app.test_request_context("/ui/receipts/op_1/resolve", method="POST", headers={"Origin": "http://evil.example"}):
        assert kind(guards.check(request)) == "cross-origin"  # then the Origin
    with app.test_request_context("/ui/receipts/op_1/resolve", method="POST"):
        assert kind(guards.check(request)) == "csrf"  # then the form's token
    with app.test_request_context("/receipts"):
        assert guards.check(request) is None

    monkeypatch.setenv(config.admin.token_env, TOKEN)
    guarded = Guards(config.admin)
    with app.test_request_context("/receipts", headers={"Host": "admin.example", "Authorization": f"Bearer {TOKEN}"}):
        assert guarded.check(request) is None  # behind a token, any name of the server
    with app.test_request_context("/receipts", headers={"Host": "admin.example"}):
        assert guarded.check(request).status_code == 401


def test_a_listen_host_of_its_own_is_allowed(app, tmp_path):
    config = parse_config(f"secret_file: {tmp_path / 's'}\nadmin: {{listen_host: '127.0.0.2'}}")
    guards = Guards(config.admin)
    with app.test_request_context("/receipts", headers={"Host": "127.0.0.2:8081"}):
        assert guards.check(request) is None
