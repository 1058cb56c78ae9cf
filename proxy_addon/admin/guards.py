"""What every request to the admin server must pass before its view runs, and the security headers of every
answer. See the package docstring for why each guard exists.

Each guard is a function of the request that returns the answer refusing it, or None to let it through; `Guards`
runs them in order (host, origin, CSRF, login) and the first refusal is the answer.
"""

import hashlib
import hmac
import secrets
from collections.abc import Callable
from urllib.parse import urlsplit

from flask import Flask, Request, Response, g, redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from proxy_addon.admin.routing import Reply, problem_reply
from proxy_addon.admin.sessions import Login
from proxy_addon.admin.views import is_page, problem
from proxy_addon.config import AdminSettings

SESSION_COOKIE = "receipts_session"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
OPEN_ENDPOINTS = frozenset({"login", "static"})  # served before login
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"

# what the guards may answer to any operation of the API, for its document (the Host check and the origin and
# CSRF checks concern browsers and misdirected requests, not the API's clients)
ANSWERS: dict[int, Reply] = {401: problem_reply("a token is configured and none (or a wrong one) was sent")}

Refusal = BaseResponse | None
Guard = Callable[[Request], Refusal]


class CsrfTokens:
    """The forms' CSRF token: an HMAC, with a key of this server's own, of the browser's session cookie."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def for_session(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def for_page(self) -> str:
        """For a form on the page being made: bound to this browser's session cookie, set with the page when it
        has none (`security_headers` sets it)."""
        session = request.cookies.get(SESSION_COOKIE) or g.get("new_session")
        if session is None:
            session = g.new_session = secrets.token_hex(16)
        return self.for_session(session)

    def valid(self, req: Request) -> bool:
        session = req.cookies.get(SESSION_COOKIE)
        return bool(session) and hmac.compare_digest(req.form.get("csrf_token", ""), self.for_session(session or ""))


def same_origin(req: Request) -> bool:
    """The Origin the browser sent (else its Referer) is this server; when it sent neither, True."""
    own = req.host_url.rstrip("/")
    origin = req.headers.get("Origin")
    if origin is not None:
        return origin == own  # "null" (an opaque origin) never matches
    referer = req.headers.get("Referer")
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}" == own
    return True


def wrong_host(req: Request, allowed: frozenset[str]) -> Refusal:
    """421 for a Host name not allowed: a web page's own DNS name resolving to 127.0.0.1 (DNS rebinding)."""
    host = urlsplit("//" + req.host).hostname or ""
    if host in allowed:
        return None
    return problem(421, "misdirected", "Misdirected request", f"this server does not answer for host {host!r}")


def cross_origin(req: Request) -> Refusal:
    """403 for a POST another site's page made."""
    if req.method != "POST" or same_origin(req):
        return None
    return problem(403, "cross-origin", "Cross-origin request refused", "the Origin is not this server")


def missing_csrf(req: Request, csrf: CsrfTokens) -> Refusal:
    """403 for a form POST without the CSRF token of the page it came from."""
    if req.method != "POST" or not is_page(req.path) or csrf.valid(req):
        return None
    return problem(403, "csrf", "Form expired", "reload the page and submit the form again")


def not_logged_in(req: Request, login: Login) -> Refusal:
    """A page sends the browser to /login, the API answers 401, unless logged in (or no token is set)."""
    if req.endpoint in OPEN_ENDPOINTS or login.allows(req):
        return None
    if is_page(req.path):
        return redirect(url_for("login", next=req.full_path if req.query_string else req.path))
    response = problem(401, "unauthorized", "Token required", "send Authorization: Bearer <token>")
    response.headers["WWW-Authenticate"] = 'Bearer realm="receipts"'
    return response


def security_headers(response: Response) -> Response:
    """No caching, no sniffing, no framing, no referrer off-site, a strict CSP on pages; and the session
    cookie when a form was made for a browser that had none."""
    new_session = g.get("new_session")
    if new_session is not None:
        response.set_cookie(SESSION_COOKIE, new_session, httponly=True, samesite="Strict")
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    if response.mimetype == "text/html":
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


class Guards:
    """The guards of one server, for its settings: the Host check only without a token (a token is the guard
    then), the others always."""

    def __init__(self, settings: AdminSettings):
        self.login = Login(settings.token)
        self.csrf = CsrfTokens()
        allowed = LOOPBACK_NAMES | {settings.listen_host.lower().strip("[]")}
        host: list[Guard] = [] if settings.token is not None else [lambda req: wrong_host(req, allowed)]
        self.guards: list[Guard] = [
            *host,
            cross_origin,
            lambda req: missing_csrf(req, self.csrf),
            lambda req: not_logged_in(req, self.login),
        ]

    def check(self, req: Request) -> Refusal:
        """The first guard's refusal, or None."""
        for guard in self.guards:
            refusal = guard(req)
            if refusal is not None:
                return refusal
        return None

    def install(self, app: Flask) -> None:
        app.jinja_env.globals["token_required"] = self.login.token is not None
        app.jinja_env.globals["csrf_token"] = self.csrf.for_page
        app.before_request(lambda: self.check(request))
        app.after_request(security_headers)
