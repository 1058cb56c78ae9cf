"""The admin server's login and start (issue 10): a session cookie that expires and that logout ends, `next`
only to a path on this server, a token too short refused at start, and a busy port that is one clear line."""

import asyncio
import os
import re
import socket
import subprocess
import sys

import pytest
from support.proxy import REPO

from proxy_addon.addons.admin import InProxyAdmin
from proxy_addon.admin.app import create_app
from proxy_addon.admin.guards import LOGIN_COOKIE, LoginSessions, safe_next
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import ConfigError
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate

TOKEN = "s3cret-admin-token-for-tests"


@pytest.fixture
def store(sqlite_url):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield ReceiptStore(engine)
    engine.dispose()


def csrf(client, url: str = "/login") -> str:
    html = client.get(url).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', html).group(1)


def logged_in(client, next_: str = "/"):
    return client.post("/login", data={"token": TOKEN, "csrf_token": csrf(client), "next": next_})


@pytest.fixture
def client(store, tmp_path, monkeypatch):
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", TOKEN)
    return create_app(parse_config(f"secret_file: {tmp_path / 's'}"), store).test_client()


def test_the_login_cookie_is_a_session_not_a_function_of_the_token(client, store, tmp_path):
    r = logged_in(client)
    cookie = client.get_cookie(LOGIN_COOKIE).value
    assert r.status_code == 303 and TOKEN not in cookie
    assert "Max-Age=43200" in r.headers["Set-Cookie"] and "HttpOnly" in r.headers["Set-Cookie"]
    # another server (a restart) with the same token does not take this server's cookie
    other = create_app(parse_config(f"secret_file: {tmp_path / 's'}"), store).test_client()
    other.set_cookie(LOGIN_COOKIE, cookie)
    assert other.get("/receipts").status_code == 401
    # two logins are two sessions
    second = create_app(parse_config(f"secret_file: {tmp_path / 's'}"), store).test_client()
    logged_in(second)
    assert second.get_cookie(LOGIN_COOKIE).value != cookie


def test_logout_ends_the_session_even_for_a_copy_of_its_cookie(client):
    logged_in(client)
    cookie = client.get_cookie(LOGIN_COOKIE).value
    assert client.get("/receipts").status_code == 200
    client.post("/logout", data={"csrf_token": csrf(client, "/")})
    assert client.get("/receipts").status_code == 401
    client.set_cookie(LOGIN_COOKIE, cookie)  # kept by someone before logout: refused all the same
    assert client.get("/receipts").status_code == 401


def test_a_session_expires():
    clock = [1_000_000.0]
    sessions = LoginSessions(TOKEN, lifetime=3600, now=lambda: clock[0])
    cookie = sessions.issue()
    assert sessions.valid(cookie)
    clock[0] += 3599
    assert sessions.valid(cookie)
    clock[0] += 2
    assert not sessions.valid(cookie)
    assert not sessions.valid(cookie.replace(".", "x", 1)) and not sessions.valid("") and not sessions.valid("1.2.3")
    issued, sid, mac = sessions.issue().split(".")
    assert not sessions.valid(f"{int(issued) + 10_000}.{sid}.{mac}")  # the issue time is signed


@pytest.mark.parametrize("target, where", [
    ("/ui/receipts/op_1", "/ui/receipts/op_1"),
    ("/?state=unknown&older_than=10m", "/?state=unknown&older_than=10m"),
    ("/%09/evil.example", "/%09/evil.example"),  # as sent percent-encoded it stays a path here
    ("/\t/evil.example", "/"),  # decoded: browsers drop the tab and go to //evil.example
    ("/\n/evil.example", "/"),
    ("//evil.example", "/"),
    ("/\\evil.example", "/"),
    ("\\\\evil.example", "/"),
    ("https://evil.example/", "/"),
    ("javascript:alert(1)", "/"),
    ("evil.example", "/"),
    ("/ /evil", "/"),
    ("", "/"),
    (None, "/"),
])
def test_next_is_only_a_path_on_this_server(target, where):
    assert safe_next(target) == where


@pytest.mark.parametrize("query", ["next=/%09/evil.example", "next=//evil.example", "next=/%5Cevil.example",
                                   "next=https://evil.example", "next=/%0A/evil.example"])
def test_login_never_redirects_off_site(client, query):
    token = csrf(client)
    r = client.post(f"/login?{query}", data={"token": TOKEN, "csrf_token": token})
    assert r.status_code == 303 and r.headers["Location"] == "/"


@pytest.mark.parametrize("token", ["   ", "tiny-tok", "fifteen-chars-x", " " * 20 + "abc"])
def test_a_short_or_blank_token_is_refused_at_start(tmp_path, monkeypatch, token):
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", token)
    with pytest.raises(ConfigError) as err:
        parse_config(f"secret_file: {tmp_path / 's'}\nadmin: {{enabled: true}}")
    assert "\n" not in str(err.value) and "too short" in str(err.value)
    assert not token.strip() or token.strip() not in str(err.value)  # the message never shows the token
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", "sixteen-chars-ok")
    assert parse_config(f"secret_file: {tmp_path / 's'}\nadmin: {{enabled: true}}").admin.token == "sixteen-chars-ok"


def run_cli(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "proxy_addon.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_receipts_admin_refuses_a_short_token_in_one_line(sqlite_url, tmp_path):
    migrate(sqlite_url)
    (tmp_path / "config.yaml").write_text(f"secret_file: {tmp_path / 's'}\n")
    r = run_cli("admin", "--config", str(tmp_path / "config.yaml"), "--listen-port", "0",
                env={"RECEIPTS_DATABASE_URL": sqlite_url, "RECEIPTS_ADMIN_TOKEN": "tiny"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "too short" in r.stderr, r.stderr


def test_receipts_admin_on_a_busy_port_is_one_line_and_exit_1(sqlite_url, tmp_path):
    migrate(sqlite_url)
    (tmp_path / "config.yaml").write_text(f"secret_file: {tmp_path / 's'}\n")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = run_cli("admin", "--config", str(tmp_path / "config.yaml"), "--listen-port", str(port),
                    env={"RECEIPTS_DATABASE_URL": sqlite_url})
    assert r.returncode == 1, r
    assert r.stderr.count("\n") == 1 and "cannot listen on 127.0.0.1:" in r.stderr and "in use" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_the_proxy_goes_on_when_its_admin_port_is_busy(store, tmp_path, monkeypatch):
    """docs/operations.md: a port that cannot be had is logged and the proxy goes on (werkzeug alone would exit)."""
    logged: list[dict] = []

    class Recorder:  # the module's own logger: structlog may have cached loggers that capture_logs cannot see
        def error(self, event: str, **kw: object) -> None:
            logged.append({"event": event, **kw})

        info = warning = error

    monkeypatch.setattr("proxy_addon.addons.admin.log", Recorder())
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        config = parse_config(f"secret_file: {tmp_path / 's'}\nadmin: {{enabled: true, listen_port: {port}}}")

        class Journal:
            pass

        journal = Journal()
        journal.config, journal.store = config, store
        addon = InProxyAdmin(journal)
        asyncio.run(addon.running())  # raised SystemExit before
    assert addon.server is None
    [line] = [e for e in logged if e["event"] == "admin_not_started"]
    assert "in use" in line["error"] and line["listen"] == f"127.0.0.1:{port}"
