"""What the admin views share (admin/views.py): the list's query parameters, each parsed on its own, problem
answers and their status per error, and the page's formatting filters."""

from datetime import UTC, datetime, timedelta

import pytest
from werkzeug.datastructures import MultiDict

from proxy_addon.admin.views import (
    LIST_LIMIT,
    MAX_LIST_LIMIT,
    ProblemView,
    duration_filter,
    host_arg,
    is_page,
    limit_arg,
    older_than_arg,
    problem,
    states_arg,
    status_of,
    ts_filter,
)
from proxy_addon.exceptions import (
    BadRequestError,
    InvalidResolutionError,
    NotResolvableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
)
from proxy_addon.views.documents import STATE_GROUPS, HostFilter


def args(*pairs: tuple[str, str]) -> MultiDict:
    return MultiDict(list(pairs))


def test_states():
    assert states_arg(args(), None) is None  # every state
    assert states_arg(args(), "open") == [s.value for s in STATE_GROUPS["open"]]
    assert states_arg(args(("state", "succeeded, rejected"), ("state", "planned")), "open") == [
        "succeeded", "rejected", "planned"]
    assert states_arg(args(("state", " , ")), None) is None
    with pytest.raises(BadRequestError, match="finished"):
        states_arg(args(("state", "finished")), None)


def test_older_than_limit_and_host():
    assert older_than_arg(args()) is None and older_than_arg(args(("older_than", ""))) is None
    assert older_than_arg(args(("older_than", "10m"))) == timedelta(minutes=10)
    with pytest.raises(BadRequestError, match="older_than: .*soon"):
        older_than_arg(args(("older_than", "soon")))
    assert limit_arg(args()) == LIST_LIMIT and limit_arg(args(("limit", str(MAX_LIST_LIMIT)))) == MAX_LIST_LIMIT
    for bad, word in (("0", "between"), (str(MAX_LIST_LIMIT + 1), "between"), ("ten", "whole number")):
        with pytest.raises(BadRequestError, match=word):
            limit_arg(args(("limit", bad)))
    assert host_arg(args()) is None and host_arg(args(("host", "  "))) is None
    assert host_arg(args(("host", "[::1]:8080"))) == HostFilter("::1", 8080)
    with pytest.raises(BadRequestError, match="host: invalid port"):
        host_arg(args(("host", "a:99999")))


def test_problems():
    r = problem(409, "not-resolvable", "Not resolvable", "it is settled")
    assert r.status_code == 409 and r.mimetype == "application/problem+json"
    assert ProblemView.model_validate_json(r.get_data()) == ProblemView(
        type="urn:agent-receipts:problem:not-resolvable", title="Not resolvable", status=409, detail="it is settled")
    errors = [ReceiptNotFoundError("x"), NotResolvableError("x"), StaleStateError("op_1", "manual_review", "succeeded"),
              InvalidResolutionError("x"), BadRequestError("x"), ReceiptsError("x")]
    assert [status_of(e) for e in errors] == [
        (404, "not-found"), (409, "not-resolvable"), (409, "not-resolvable"), (422, "invalid-resolution"),
        (400, "bad-request"), (503, "journal-unavailable")]


def test_pages_and_formatting():
    assert all(is_page(p) for p in ("/", "/ui/receipts/op_1", "/login", "/logout"))
    assert not any(is_page(p) for p in ("/receipts", "/metrics", "/openapi.json", "/uix"))
    assert [duration_filter(s) for s in (None, -3, 40, 725, 3 * 86400 + 4 * 3600 + 5)] == ["-", "0s", "40s", "12m 5s", "3d 4h"]
    assert ts_filter(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02 03:04:05 UTC" and ts_filter(None) == "-"
