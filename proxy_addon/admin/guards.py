"""Who may use the admin server: the token (header or login cookie), loopback Host names, same-origin POSTs
and the forms' CSRF token, plus the security headers of every answer. See the package docstring.

The login cookie is a session of this server: `<issued>.<id>.<mac>`, signed with a key made when the server
starts and bound to the token (a restart, or another token, ends every session). It expires
SESSION_LIFETIME after login, and logout ends it for good: its id is kept as revoked until it would have
expired. Never the token, nor anything derived from the token alone. After login the browser goes back to
`next` only when that is a path on this server (`safe_next`).
"""

import hashlib
import hmac
import secrets
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, g, redirect, render_template, request, url_for

from proxy_addon.admin.views import is_page, problem
from proxy_addon.config import AdminSettings

LOGIN_COOKIE = "receipts_admin"
SESSION_COOKIE = "receipts_session"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
SESSION_LIFETIME = 12 * 3600  # seconds a login lasts


class LoginSessions:
    """Login cookies: signed with a key of this server's own (bound to the token), with an issue time, and
    revocable. `now` is injectable for tests."""

    def __init__(self, token: str, lifetime: float = SESSION_LIFETIME, now: Any = time.time):
        self._key = hmac.new(secrets.token_bytes(32), token.encode(), hashlib.sha256).digest()
        self.lifetime, self._now = lifetime, now
        self._revoked: dict[str, float] = {}  # session id -> when it would have expired
        self._lock = threading.Lock()

    def _mac(self, issued: str, sid: str) -> str:
        return hmac.new(self._key, f"{issued}.{sid}".encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        issued, sid = str(int(self._now())), secrets.token_hex(16)
        return f"{issued}.{sid}.{self._mac(issued, sid)}"

    def _parts(self, cookie: str) -> tuple[float, str] | None:
        """(issued, id) of a cookie this server signed, else None."""
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        issued, sid, mac = parts
        if not hmac.compare_digest(mac, self._mac(issued, sid)):
            return None
        return float(issued), sid

    def valid(self, cookie: str) -> bool:
        parts = self._parts(cookie)
        if parts is None:
            return False
        issued, sid = parts
        now = self._now()
        with self._lock:
            revoked = sid in self._revoked
        return not revoked and issued <= now + 60 and now - issued < self.lifetime

    def revoke(self, cookie: str) -> None:
        parts = self._parts(cookie)
        if parts is None:
            return
        issued, sid = parts
        now = self._now()
        with self._lock:
            self._revoked = {k: until for k, until in self._revoked.items() if until > now}  # forget the expired
            self._revoked[sid] = issued + self.lifetime


def safe_next(target: str | None) -> str:
    """`next` when it is a path on this server, else `/`. Browsers drop tabs and line breaks from URLs and
    read `\\` as `/`, so `/%09/evil.example` or `/\\evil` would leave the site: anything but a plain path
    is refused."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    if any(c in target for c in "\\\t\r\n") or not target.isprintable() or any(c.isspace() for c in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or urlsplit("http://x" + target).netloc != "x":
        return "/"
    return target


def install_guards(app: Flask, settings: AdminSettings) -> None:
    """Check every request before its view runs, and add the security headers to every answer."""
    token = settings.token
    csrf_key = secrets.token_bytes(32)
    sessions = LoginSessions(token) if token is not None else None
    allowed_hosts = LOOPBACK_NAMES | {settings.listen_host.lower().strip("[]")}
    app.jinja_env.globals["token_required"] = token is not None

    def logged_in() -> bool:
        if token is None:
            return True
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return True
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        return bool(cookie) and sessions is not None and sessions.valid(cookie)

    def csrf_token() -> str:
        """For a form: bound to this browser's session cookie (set with the page when it has none)."""
        session = request.cookies.get(SESSION_COOKIE) or g.get("new_session")
        if session is None:
            session = g.new_session = secrets.token_hex(16)
        return hmac.new(csrf_key, session.encode(), hashlib.sha256).hexdigest()

    app.jinja_env.globals["csrf_token"] = csrf_token

    def same_origin() -> bool:
        """The Origin the browser sent (else its Referer) is this server; when it sent neither, True."""
        own = request.host_url.rstrip("/")
        origin = request.headers.get("Origin")
        if origin is not None:
            return origin == own  # "null" (an opaque origin) never matches
        referer = request.headers.get("Referer")
        if referer:
            parts = urlsplit(referer)
            return f"{parts.scheme}://{parts.netloc}" == own
        return True

    def csrf_ok() -> bool:
        session = request.cookies.get(SESSION_COOKIE)
        if not session:
            return False
        expected = hmac.new(csrf_key, session.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(request.form.get("csrf_token", ""), expected)

    @app.before_request
    def _guard() -> Any:
        if token is None:
            host = urlsplit("//" + request.host).hostname or ""
            if host not in allowed_hosts:
                return problem(421, "misdirected", "Misdirected request", f"this server does not answer for host {host!r}")
        page = is_page(request.path)
        if request.method == "POST":
            if not same_origin():
                return problem(403, "cross-origin", "Cross-origin request refused", "the Origin is not this server")
            if page and not csrf_ok():
                return problem(403, "csrf", "Form expired", "reload the page and submit the form again")
        if request.endpoint in ("login", "static") or logged_in():
            return None
        if page:
            return redirect(url_for("login", next=request.full_path if request.query_string else request.path))
        response = problem(401, "unauthorized", "Token required", "send Authorization: Bearer <token>")
        response.headers["WWW-Authenticate"] = 'Bearer realm="receipts"'
        return response

    @app.after_request
    def _headers(response: Response) -> Response:
        new_session = g.get("new_session")
        if new_session is not None:
            response.set_cookie(SESSION_COOKIE, new_session, httponly=True, samesite="Strict")
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        if response.mimetype == "text/html":
            response.headers["Content-Security-Policy"] = (
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
            )
        return response

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        target = safe_next(request.values.get("next"))
        if token is None or sessions is None:
            return redirect(target)
        error = None
        if request.method == "POST":
            if hmac.compare_digest(request.form.get("token", "").strip().encode(), token.encode()):
                response = redirect(target, code=303)
                response.set_cookie(
                    LOGIN_COOKIE,
                    sessions.issue(),
                    max_age=int(sessions.lifetime),
                    httponly=True,
                    samesite="Strict",
                    secure=request.is_secure,
                )
                return response
            error = "That is not the admin token."
        return render_template("login.html", next=target, error=error), 401 if error else 200

    @app.post("/logout")
    def logout() -> Any:
        if sessions is not None:
            sessions.revoke(request.cookies.get(LOGIN_COOKIE, ""))
        response = redirect(url_for("login"), code=303)
        response.delete_cookie(LOGIN_COOKIE)
        return response
