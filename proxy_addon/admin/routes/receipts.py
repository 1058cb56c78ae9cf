"""The JSON API of receipts: list, show, proof, and a person's verdict (`Resolution`, the body it takes)."""

from typing import Any, Literal, get_args

from flask import Response, request, url_for
from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.admin.routing import Operation, Param, Routes, admin, json_reply, problem_reply
from proxy_addon.admin.views import LIST_LIMIT, MAX_LIST_LIMIT, json_response, list_page, problem, string_fields
from proxy_addon.exceptions import InvalidResolutionError
from proxy_addon.rules.states import RESOLUTION_STATES
from proxy_addon.views import documents, review
from proxy_addon.views.documents import ReceiptView, ShowView
from proxy_addon.views.review import ProofView

routes = Routes()
ResolutionState = Literal["safe_to_retry", "succeeded"]
assert set(get_args(ResolutionState)) == {s.value for s in RESOLUTION_STATES}, "the resolutions, as rules/states.py says"


class Resolution(BaseModel):
    """The body of `POST /receipts/{operation_id}/resolve`."""

    model_config = ConfigDict(extra="forbid")

    state: ResolutionState
    note: str = Field(min_length=1, description="what you checked; kept in the history")
    external_id: str | None = None
    who: str = Field("admin-api", description="who decides (default admin-api)")


OPERATION_ID = Param(
    "operation_id", "path", {"type": "string"}, "the receipt's id (X-Receipt-Id on the proxy's answer)"
)
NOT_FOUND = problem_reply("no receipt has this id")
LIST_PARAMETERS = (
    Param(
        "state",
        "query",
        {"type": "array", "items": {"type": "string"}},
        "a state, or `open` (every open state) or `unknown` (outcome_unknown, reconciling, manual_review); "
        "repeat it or separate with commas",
        style="form",
        explode=True,
    ),
    Param(
        "host",
        "query",
        {"type": "string", "examples": ["api.example.com", "127.0.0.1:18112"]},
        "a host, or `host:port` (`[::1]:8080` for IPv6); without a port, every port",
    ),
    Param(
        "agent",
        "query",
        {"type": "string", "examples": ["billing-agent", "anonymous"]},
        "one agent's receipts (the name it gives with proxy authentication, config `agents:`), or `anonymous` "
        "(those of agents that gave none)",
    ),
    Param(
        "older_than",
        "query",
        {"type": "string", "examples": ["10m"]},
        "only receipts created longer ago than this duration, e.g. `10m`, `2h`",
    ),
    Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": LIST_LIMIT}),
    Param(
        "after",
        "query",
        {"type": "string"},
        "the next page: the receipts journaled before this one (the last of the page before; a full page's "
        "`Link: <...>; rel=\"next\"` header gives the URL)",
    ),
)


def show(operation_id: str) -> Response:
    store = admin().store
    return json_response(documents.show_document(store.receipts.get(operation_id), store.receipts.history(operation_id)))


@routes.api("GET", "/receipts", Operation(
    "listReceipts",
    "Receipts, newest first (the shape of `receipts ls --json`)",
    parameters=LIST_PARAMETERS,
    responses={
        200: json_reply(list[ReceiptView], "the receipts"),
        400: problem_reply("a parameter cannot be used (unknown state, bad duration)"),
    },
))
def list_receipts() -> Response:
    rows, after = list_page(admin().store, default_state=None)
    answer = json_response([documents.receipt_document(r) for r in rows])
    if after is not None:
        answer.headers["Link"] = f'<{url_for("list_receipts", **_query_with(after=after))}>; rel="next"'
    return answer


def _query_with(**changed: str) -> dict[str, Any]:
    query: dict[str, Any] = request.args.to_dict(flat=False)
    query.update(changed)
    return query


@routes.api("GET", "/receipts/<operation_id>", Operation(
    "getReceipt",
    "One receipt with its whole history (the shape of `receipts show --json`)",
    parameters=(OPERATION_ID,),
    responses={200: json_reply(ShowView, "the receipt"), 404: NOT_FOUND},
))
def show_receipt(operation_id: str) -> Response:
    return show(operation_id)


@routes.api("GET", "/receipts/<operation_id>/proof", Operation(
    "getProof",
    "What can the system prove happened before I act again?",
    description="The receipt's state and evidence, and what the proxy would do now with the same request again: "
    "forward it (a new receipt), refuse it (409) or replay the stored answer.",
    parameters=(OPERATION_ID,),
    responses={200: json_reply(ProofView, "what is proven, and what a retry would get"), 404: NOT_FOUND},
))
def proof(operation_id: str) -> Response:
    context = admin()
    return json_response(review.proof(context.store, context.config, operation_id))


def resolution_fields(body: Any) -> dict[str, str | None]:
    """The body's fields, each a string or None; BadRequestError or InvalidResolutionError say what is wrong."""
    return string_fields(body, Resolution, InvalidResolutionError)


@routes.api("POST", "/receipts/<operation_id>/resolve", Operation(
    "resolveReceipt",
    "A person's verdict on a manual_review or outcome_unknown receipt (as `receipts resolve`)",
    parameters=(OPERATION_ID,),
    body=Resolution,
    responses={
        200: json_reply(ShowView, "resolved; the note is in the history"),
        400: problem_reply("the body is not a JSON object"),
        404: NOT_FOUND,
        409: problem_reply("the receipt is not in manual_review or outcome_unknown (or changed meanwhile)"),
        415: problem_reply("the body is not application/json"),
        422: problem_reply("the state is not succeeded or safe_to_retry, or the note is missing"),
    },
))
def resolve(operation_id: str) -> Response:
    if not request.is_json:
        return problem(415, "unsupported-media-type", "JSON required", "send Content-Type: application/json")
    fields = resolution_fields(request.get_json(silent=True))
    review.resolve(
        admin().store,
        operation_id,
        fields["state"] or "",
        fields["note"] or "",
        fields["external_id"],
        who=fields["who"] or "admin-api",
    )
    return show(operation_id)
