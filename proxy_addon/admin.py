"""The admin HTTP server: a JSON API for agents and tools, a review page for people, and /metrics.

Off by default (`admin.enabled`); the proxy starts it in its `running` hook, `receipts admin` serves it alone.
It listens on 127.0.0.1 unless told otherwise, and the config refuses another address without a token.

- With a token (from the environment variable `admin.token_env`): every request needs `Authorization: Bearer
  TOKEN`, or the login cookie that /login sets after the token is typed in.
- Without one (loopback only): requests must name a loopback Host, so that a web page cannot reach the server
  through a DNS name of its own that resolves to 127.0.0.1.
- A form POST needs the per-session CSRF token of the page it came from, and an Origin (or Referer), when
  the browser sends one, of this server; the JSON API's POST needs `Content-Type: application/json`, which a
  cross-site form cannot send.
Pages are Jinja2 templates with autoescape: everything shown is escaped.
"""

import asyncio
import hashlib
import hmac
import secrets
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, g, redirect, render_template, request, url_for
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from proxy_addon import metrics, review
from proxy_addon.config import AdminSettings, ReceiptsConfig, parse_duration
from proxy_addon.exceptions import (
    InvalidResolutionError,
    NotResolvableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
)
from proxy_addon.log import get_logger
from proxy_addon.openapi import openapi_document
from proxy_addon.problems import PROBLEM_BASE, PROBLEM_CONTENT_TYPE
from proxy_addon.states import RESOLUTION_STATES, RESOLVABLE_STATES, State
from proxy_addon.store import ReceiptStore, utcnow

log = get_logger("receipts.admin")

TEMPLATES = Path(__file__).resolve().parent / "templates"
LOGIN_COOKIE = "receipts_admin"
SESSION_COOKIE = "receipts_session"
LIST_LIMIT = 200
MAX_LIST_LIMIT = 1000
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class BadRequest(ReceiptsError):
    """A query parameter or a body the API cannot use (400)."""


# -- the app --------------------------------------------------------------------------------------------------


def create_app(config: ReceiptsConfig, store: ReceiptStore, settings: AdminSettings | None = None) -> Flask:
    settings = settings or config.admin
    token = settings.token
    app = Flask("proxy_addon.admin", template_folder=str(TEMPLATES))
    app.json.sort_keys = False  # type: ignore[attr-defined]
    csrf_key = secrets.token_bytes(32)
    registry = metrics.registry_for(store)
    allowed_hosts = LOOPBACK_NAMES | {settings.listen_host.lower().strip("[]")}

    app.jinja_env.filters.update(age=_age, ts=_ts, duration=_duration, pretty=_pretty)
    app.jinja_env.globals.update(STATES=[s.value for s in State], token_required=token is not None)

    # -- guards -----------------------------------------------------------------------------------------------

    def logged_in() -> bool:
        if token is None:
            return True
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return True
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie, _login_value(token))

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
                return _problem(421, "misdirected", "Misdirected request", f"this server does not answer for host {host!r}")
        is_page = _is_page(request.path)
        if request.method == "POST":
            if not same_origin():
                return _problem(403, "cross-origin", "Cross-origin request refused", "the Origin is not this server")
            if is_page and not csrf_ok():
                return _problem(403, "csrf", "Form expired", "reload the page and submit the form again")
        if request.endpoint in ("login", "static") or logged_in():
            return None
        if is_page:
            return redirect(url_for("login", next=request.full_path if request.query_string else request.path))
        response = _problem(401, "unauthorized", "Token required", "send Authorization: Bearer <token>")
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

    @app.errorhandler(404)
    def _not_found(_e: Any) -> Any:
        if _is_page(request.path):
            return render_template("message.html", title="Not found", message=f"Nothing at {request.path}."), 404
        return _problem(404, "not-found", "Not found", f"nothing at {request.path}")

    @app.errorhandler(405)
    def _not_allowed(_e: Any) -> Any:
        return _problem(405, "method-not-allowed", "Method not allowed", f"{request.method} is not allowed here")

    @app.errorhandler(ReceiptsError)
    def _receipts_error(e: ReceiptsError) -> Any:
        status, kind = _status_of(e)
        if _is_page(request.path):
            return render_template("message.html", title="Error", message=str(e)), status
        return _problem(status, kind, kind.replace("-", " ").capitalize(), str(e))

    # -- JSON API ---------------------------------------------------------------------------------------------

    @app.get("/receipts")
    def list_receipts() -> Response:
        states, host, older_than, limit = _filters(default_state=None)
        rows = store.list_receipts(states=states, host=host, older_than=older_than, limit=limit)
        return _json([review.receipt_document(r) for r in rows])

    @app.get("/receipts/<operation_id>")
    def show_receipt(operation_id: str) -> Response:
        return _json(review.show_document(store.get(operation_id), store.history(operation_id)))

    @app.get("/receipts/<operation_id>/proof")
    def proof(operation_id: str) -> Response:
        return _json(review.proof(store, config, operation_id))

    @app.post("/receipts/<operation_id>/resolve")
    def resolve(operation_id: str) -> Response:
        if not request.is_json:
            return _problem(415, "unsupported-media-type", "JSON required", "send Content-Type: application/json")
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
        return _json(review.show_document(store.get(operation_id), store.history(operation_id)))

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        body, content_type = metrics.exposition(registry)
        return Response(body, content_type=content_type)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return _json(openapi_document())

    # -- pages ------------------------------------------------------------------------------------------------

    @app.get("/")
    def index() -> str:
        states, host, older_than, limit = _filters(default_state="open")
        rows = store.list_receipts(states=states, host=host, older_than=older_than, limit=limit)
        return render_template(
            "index.html",
            rows=rows,
            now=utcnow(),
            stats=store.stats(),
            limit=limit,
            open_states=[s.value for s in review.STATE_GROUPS["open"]],
            selected=request.args.get("state", "open"),
            host=request.args.get("host", ""),
            older_than=request.args.get("older_than", ""),
        )

    @app.get("/ui/receipts/<operation_id>")
    def receipt_page(operation_id: str, error: str | None = None, form: dict[str, str] | None = None) -> str:
        receipt = store.get(operation_id)
        history = store.history(operation_id)
        return render_template(
            "receipt.html",
            r=receipt,
            history=history,
            now=utcnow(),
            proof=review.proof(store, config, operation_id),
            refusals=store.list_refusals(blocking_operation_id=operation_id, limit=20),
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
            status, _ = _status_of(e)
            return receipt_page(operation_id, error=str(e), form=form), status
        return redirect(url_for("receipt_page", operation_id=operation_id, resolved="1"), code=303)

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
                response.set_cookie(LOGIN_COOKIE, _login_value(token), httponly=True, samesite="Strict")
                return response
            error = "That is not the admin token."
        return render_template("login.html", next=target, error=error), 401 if error else 200

    @app.post("/logout")
    def logout() -> Any:
        response = redirect(url_for("login"), code=303)
        response.delete_cookie(LOGIN_COOKIE)
        return response

    return app


def _is_page(path: str) -> bool:
    return path == "/" or path.startswith(("/ui/", "/login", "/logout"))


def _login_value(token: str) -> str:
    """The login cookie: derived from the token, never the token itself."""
    return hmac.new(token.encode(), b"receipts-admin-login", hashlib.sha256).hexdigest()


def _status_of(e: ReceiptsError) -> tuple[int, str]:
    if isinstance(e, ReceiptNotFoundError):
        return 404, "not-found"
    if isinstance(e, NotResolvableError | StaleStateError):
        return 409, "not-resolvable"
    if isinstance(e, InvalidResolutionError):
        return 422, "invalid-resolution"
    if isinstance(e, BadRequest):
        return 400, "bad-request"
    return 503, "journal-unavailable"


def _problem(status: int, kind: str, title: str, detail: str) -> Response:
    body = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    return Response(review.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)


def _json(document: Any) -> Response:
    return Response(review.dumps(document), content_type="application/json")


def _filters(default_state: str | None) -> tuple[list[str] | None, str | None, timedelta | None, int]:
    """`state` (a state, `open` or `unknown`; repeated or comma-separated), `host`, `older_than`, `limit`."""
    raw = [p.strip() for v in request.args.getlist("state") for p in v.split(",") if p.strip()]
    if not raw and default_state:
        raw = [default_state]
    try:
        states = review.expand_states(raw)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    older_than = None
    if request.args.get("older_than"):
        try:
            older_than = timedelta(seconds=parse_duration(request.args["older_than"]))
        except ValueError as e:
            raise BadRequest(f"older_than: {e}") from None
    try:
        limit = int(request.args.get("limit", LIST_LIMIT))
    except ValueError:
        raise BadRequest("limit must be a whole number") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIST_LIMIT}")
    return states or None, request.args.get("host") or None, older_than, limit


def _age(since: datetime | None, now: datetime | None = None) -> str:
    if since is None:
        return "-"
    return _duration(((now or datetime.now(UTC)) - since).total_seconds())


def _duration(seconds: float | None) -> str:
    """`3d 4h`, `12m 5s`, `40s`: the two largest units."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        if len(parts) == 2:
            break
    if len(parts) < 2:
        parts.append(f"{seconds}s")
    return " ".join(parts[:2])


def _pretty(value: Any) -> str:
    return value if isinstance(value, str) else review.dumps(value, indent=None)


def _ts(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- serving --------------------------------------------------------------------------------------------------


class _RequestHandler(WSGIRequestHandler):
    """Werkzeug's handler, logging through structlog instead of printing every request."""

    def log(self, type: str, message: str, *args: Any) -> None:
        if type == "error":
            log.warning("admin_http_error", message=message % args if args else message)


class AdminServer:
    """The admin app on a werkzeug server in a background thread."""

    def __init__(self, config: ReceiptsConfig, store: ReceiptStore, settings: AdminSettings | None = None):
        self.settings = settings or config.admin
        self.app = create_app(config, store, self.settings)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "AdminServer":
        self._server = make_server(
            self.settings.listen_host, self.settings.listen_port, self.app, threaded=True, request_handler=_RequestHandler
        )
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.1), name="receipts-admin", daemon=True
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_port

    @property
    def url(self) -> str:
        host = self.settings.listen_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


async def serve_in_proxy(config: ReceiptsConfig, store: ReceiptStore) -> None:
    """For the addon's `running` hook, as a task: serves until cancelled (the addon cancels its tasks in `done`).
    A port that cannot be had is logged and the proxy goes on without its admin server."""
    server = AdminServer(config, store)
    try:
        server.start()
    except OSError as e:
        log.error("admin_not_started", listen=f"{server.settings.listen_host}:{server.settings.listen_port}", error=str(e))
        return
    log.info("admin_started", url=server.url, token_required=server.settings.token is not None)
    try:
        await asyncio.Event().wait()
    finally:
        server.stop()
