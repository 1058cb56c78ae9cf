"""What the admin server's views share: problem answers (and `ProblemView`, their schema), JSON, list filters,
and the page's formatting filters."""

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Response, request
from pydantic import BaseModel, ConfigDict
from werkzeug.datastructures import MultiDict

from proxy_addon.exceptions import (
    ApprovalNotFoundError,
    BadRequestError,
    InvalidResolutionError,
    NotDecidableError,
    NotResolvableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
)
from proxy_addon.rules.answers import PROBLEM_BASE, PROBLEM_CONTENT_TYPE
from proxy_addon.rules.records import ANY_AGENT, AgentFilter, ReceiptRecord
from proxy_addon.store import ReceiptStore
from proxy_addon.units import parse_duration
from proxy_addon.views import documents, journaled

LIST_LIMIT = 200
MAX_LIST_LIMIT = 1000


def is_page(path: str) -> bool:
    return path == "/" or path.startswith(("/ui/", "/login", "/logout"))


def status_of(e: ReceiptsError) -> tuple[int, str]:
    if isinstance(e, ReceiptNotFoundError | ApprovalNotFoundError):
        return 404, "not-found"
    if isinstance(e, NotDecidableError):
        return 409, "not-decidable"
    if isinstance(e, NotResolvableError | StaleStateError):
        return 409, "not-resolvable"
    if isinstance(e, InvalidResolutionError):
        return 422, "invalid-resolution"
    if isinstance(e, BadRequestError):
        return 400, "bad-request"
    return 503, "journal-unavailable"


class ProblemView(BaseModel):
    """RFC 9457 problem details"""

    model_config = ConfigDict(frozen=True)

    type: str
    title: str
    status: int
    detail: str


def problem(status: int, kind: str, title: str, detail: str) -> Response:
    body = ProblemView(type=PROBLEM_BASE + kind, title=title, status=status, detail=detail).model_dump()
    return Response(documents.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)


def json_response(document: Any) -> Response:
    return Response(documents.dumps(document), content_type="application/json")


def string_fields(
    body: Any, model: type[BaseModel], invalid: type[ReceiptsError] = BadRequestError
) -> dict[str, str | None]:
    """A JSON body's fields as `model` names them, each a string or None (absent): BadRequestError when the body
    is not an object, `invalid` naming a field the model does not have or one that is not a string."""
    if not isinstance(body, dict):
        raise BadRequestError(f"the body must be a JSON object: {{{', '.join(model.model_fields)}}}")
    unknown = set(body) - set(model.model_fields)
    if unknown:
        raise invalid(f"unknown field(s): {', '.join(sorted(unknown))}")
    fields = {k: body.get(k) for k in model.model_fields}
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise invalid(f"{name} must be a string")
    return fields


def states_arg(args: MultiDict[str, str], default_state: str | None) -> list[str] | None:
    """`state`: a state, `open` or `unknown`; repeated or comma-separated. None: every state."""
    raw = [p.strip() for v in args.getlist("state") for p in v.split(",") if p.strip()]
    try:
        return documents.expand_states(raw or ([default_state] if default_state else [])) or None
    except ValueError as e:
        raise BadRequestError(str(e)) from None


def older_than_arg(args: MultiDict[str, str]) -> timedelta | None:
    if not args.get("older_than"):
        return None
    try:
        return timedelta(seconds=parse_duration(args["older_than"]))
    except ValueError as e:
        raise BadRequestError(f"older_than: {e}") from None


def limit_arg(args: MultiDict[str, str]) -> int:
    try:
        limit = int(args.get("limit", LIST_LIMIT))
    except ValueError:
        raise BadRequestError("limit must be a whole number") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise BadRequestError(f"limit must be between 1 and {MAX_LIST_LIMIT}")
    return limit


def host_arg(args: MultiDict[str, str]) -> documents.HostFilter | None:
    """`host`: `host` or `host:port`."""
    if not args.get("host", "").strip():
        return None
    try:
        return documents.parse_host_filter(args["host"])
    except ValueError as e:
        raise BadRequestError(f"host: {e}") from None


def list_filters(default_state: str | None) -> tuple[list[str] | None, documents.HostFilter | None, timedelta | None, int]:
    """The list's query (`state`, `host`, `older_than`, `limit`); BadRequestError names the first bad one."""
    args = request.args
    states, older_than, limit = states_arg(args, default_state), older_than_arg(args), limit_arg(args)
    return states, host_arg(args), older_than, limit


def agent_arg(args: MultiDict[str, str]) -> AgentFilter:
    """`agent`: an agent's name, or `anonymous`; absent or empty: every agent's."""
    if not args.get("agent", "").strip():
        return ANY_AGENT
    try:
        return documents.parse_agent_filter(args["agent"])
    except ValueError as e:
        raise BadRequestError(f"agent: {e}") from None


def list_page(store: ReceiptStore, default_state: str | None) -> tuple[list[ReceiptRecord], str | None]:
    """One page of the list the query asks for (its filters and `after`, the last receipt of the page before),
    and the `after` of the next page (None on the last)."""
    states, host, older_than, limit = list_filters(default_state)
    agent = agent_arg(request.args)
    after = request.args.get("after") or None
    try:
        rows = store.receipts.list(
            states=states, older_than=older_than, limit=limit, after=after, agent=agent, **documents.host_query(host)
        )
    except ReceiptNotFoundError:
        raise BadRequestError(f"after: no receipt {after}") from None
    return rows, (rows[-1].operation_id if len(rows) == limit else None)


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
