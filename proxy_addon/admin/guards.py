"""Who may use the admin server: the token (header or login cookie), loopback Host names, same-origin POSTs
and the forms' CSRF token, plus the security headers of every answer. See the package docstring."""

import hashlib
import hmac
import secrets
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, g, redirect, render_template, request, url_for

from proxy_addon.admin.views import is_page, problem
from proxy_addon.config import AdminSettings

LOGIN_COOKIE = "receipts_admin"
SESSION_COOKIE = "receipts_session"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def install_guards(app: Flask, settings: AdminSettings) -> None:
    """Check every request before its view runs, and add the security headers to every answer."""
    token = settings.token
    csrf_key = secrets.token_bytes(32)
    allowed_hosts = LOOPBACK_NAMES | {settings.listen_host.lower().strip("[]")}
    app.jinja_env.globals["token_required"] = token is not None

    def logged_in() -> bool:
        if token is None:
            return True
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return True
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie, login_value(token))

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
        target = request.values.get("next", "/")
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        if token is None:
            return redirect(target)
        error = None
        if request.method == "POST":
            if hmac.compare_digest(request.form.get("token", "").strip().encode(), token.encode()):
                response = redirect(target, code=303)
                response.set_cookie(LOGIN_COOKIE, login_value(token), httponly=True, samesite="Strict")
                return response
            error = "That is not the admin token."
        return render_template("login.html", next=target, error=error), 401 if error else 200

    @app.post("/logout")
    def logout() -> Any:
        response = redirect(url_for("login"), code=303)
        response.delete_cookie(LOGIN_COOKIE)
        return response


def login_value(token: str) -> str:
    """The login cookie: derived from the token, never the token itself."""
    return hmac.new(token.encode(), b"receipts-admin-login", hashlib.sha256).hexdigest()
