"""Verifier controls for reads that are not a plain GET: a POST-body read (a GraphQL query, graphql-core) and a
read answered with server-sent events (an MCP tool reporting progress, the official MCP SDK's server). The
correct rules keep their verdicts; broken ones (the wrong items path, a match on a field the read does not
return) never give `safe_to_retry` or a false `succeeded`. json-server's plain reads: test_verifier_controls.py.
"""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi import serve_asgi
from support.graphql_server import IssueTracker
from support.mcp_server import TicketDesk
from support.protocol_reads import GRAPHQL_SEARCH, LIST_REPORTING, MCP_SEARCH, Kind, config_for, succeeded, unknown
from support.store import migrated_sqlite, store_copied_from

from proxy_addon.protocols.routing import read_headers
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.store import ReceiptStore

SSE, POST_BODY = "SSE answer (MCP)", "POST-body read (GraphQL)"
CORRECT = {SSE: MCP_SEARCH, POST_BODY: GRAPHQL_SEARCH}
# kind, break, the broken rule, the control that fails it (None: the read itself fails, so nothing is decided)
BROKEN: list[tuple[str, str, dict[str, Any], str | None]] = [
    (SSE, "wrong items path", {**MCP_SEARCH, "items": "$.result.content"}, "positive"),
    (SSE, "match on a field not returned", {**MCP_SEARCH, "match": {"$.name": "$.params.arguments.title"}}, "positive"),
    (POST_BODY, "match on a field the query does not select", {**GRAPHQL_SEARCH, "body": {"query": "query { issues { id } }"}},
     "positive"),
    (POST_BODY, "wrong items path", {**GRAPHQL_SEARCH, "items": "$.data.issue"}, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def kinds() -> Iterator[dict[str, Kind]]:
    desk, tracker = TicketDesk(), IssueTracker()
    mcp, graphql = serve_asgi(desk.app()), serve_asgi(tracker.app())
    try:
        answer = httpx.post(f"{mcp.base}/mcp", json=LIST_REPORTING, headers=read_headers(LIST_REPORTING), trust_env=False)
        assert answer.headers["content-type"].startswith("text/event-stream"), answer.headers  # the rule reads SSE
        yield {SSE: Kind(SSE, mcp, desk), POST_BODY: Kind(POST_BODY, graphql, tracker)}
    finally:
        mcp.stop()
        graphql.stop()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return migrated_sqlite(tmp_path_factory.mktemp("controls-protocols-db"))


@pytest.fixture
def settle(kinds, template: Path, tmp_path: Path) -> Iterator[Callable[..., tuple[ReceiptStore, str]]]:
    """`settle(kind, rule, committed)`: a known success, an unknown call the server did or never saw, one pass."""
    with ExitStack() as stack:

        def run(kind: str, rule: dict[str, Any], committed: bool) -> tuple[ReceiptStore, str]:
            store = stack.enter_context(store_copied_from(template, tmp_path / "receipts.db"))
            succeeded(store, kinds[kind])
            op = unknown(store, kinds[kind], committed)
            asyncio.run(Reconciler(config_for(kinds[kind], tmp_path, rule), store).run_once())
            return store, op

        yield run


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-seen"])
@pytest.mark.parametrize("kind", list(CORRECT))
def test_a_correct_rule_keeps_its_verdict(settle, kind, committed):
    store, op = settle(kind, CORRECT[kind], committed)

    receipt, detail = store.receipts.get(op), store.receipts.history(op)[-1].detail
    assert receipt.state == ("succeeded" if committed else "safe_to_retry"), detail
    assert {c["control"]: c["result"] for c in detail["controls"]} == (
        {"negative": "passed"} if committed else {"negative": "passed", "positive": "passed"}
    )


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-seen"])
@pytest.mark.parametrize("kind, broken, rule, fails", BROKEN, ids=[f"{k}: {b}" for k, b, _, _ in BROKEN])
def test_a_broken_rule_never_gives_a_false_verdict(settle, kind, broken, rule, fails, committed):
    store, op = settle(kind, rule, committed)

    receipt, detail = store.receipts.get(op), store.receipts.history(op)[-1].detail
    assert receipt.state == "manual_review", detail
    if fails is None:
        assert (detail["result"], receipt.error_code) == ("failed", "upstream_timeout")
        assert "no list of items" in detail["reason"]
        return
    assert (receipt.error_code, detail["unproven"]) == ("verifier_unproven", fails), detail
