"""What the admin server's views share: problem answers, JSON, list filters, and the page's formatting filters."""

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Response, request

from proxy_addon.exceptions import (
    BadRequest,
    InvalidResolutionError,
    NotResolvableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
)
from proxy_addon.request.answers import PROBLEM_BASE, PROBLEM_CONTENT_TYPE
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.units import parse_duration
from proxy_addon.views import documents, journaled

LIST_LIMIT = 200
MAX_LIST_LIMIT = 1000


def is_page(path: str) -> bool:
    return path == "/" or path.startswith(("/ui/", "/login", "/logout"))


def status_of(e: ReceiptsError) -> tuple[int, str]:
    if isinstance(e, ReceiptNotFoundError):
        return 404, "not-found"
    if isinstance(e, NotResolvableError | StaleStateError):
        return 409, "not-resolvable"
    if isinstance(e, InvalidResolutionError):
        return 422, "invalid-resolution"
    if isinstance(e, BadRequest):
        return 400, "bad-request"
    return 503, "journal-unavailable"


def problem(status: int, kind: str, title: str, detail: str) -> Response:
    body = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    return Response(documents.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)


def json_response(document: Any) -> Response:
    return Response(documents.dumps(document), content_type="application/json")


def list_filters(default_state: str | None) -> tuple[list[str] | None, documents.HostFilter | None, timedelta | None, int]:
    """`state` (a state, `open` or `unknown`; repeated or comma-separated), `host` (`host` or `host:port`),
    `older_than`, `limit`."""
    raw = [p.strip() for v in request.args.getlist("state") for p in v.split(",") if p.strip()]
    if not raw and default_state:
        raw = [default_state]
    try:
        states = documents.expand_states(raw)
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
    host = None
    if request.args.get("host", "").strip():
        try:
            host = documents.parse_host_filter(request.args["host"])
        except ValueError as e:
            raise BadRequest(f"host: {e}") from None
    return states or None, host, older_than, limit


def age_filter(since: datetime | None, now: datetime | None = None) -> str:
    if since is None:
        return "-"
    return duration_filter(((now or datetime.now(UTC)) - since).total_seconds())


def duration_filter(seconds: float | None) -> str:
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


def pretty_filter(value: Any) -> str:
    return value if isinstance(value, str) else documents.dumps(value, indent=None)


def netloc_filter(r: ReceiptRecord) -> str:
    """A receipt's host, with its port when not the scheme's default."""
    return journaled.netloc(r.scheme, r.host, r.port)


def shown_filter(body: journaled.BodyView) -> dict[str, Any]:
    """What the page shows of a body: a summary line and the body's text, folded after its first lines."""
    folded = journaled.fold(journaled.body_lines(body))
    return {"summary": journaled.body_summary(body), "head": folded.head, "rest": folded.rest, "more": folded.more}


def ts_filter(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
