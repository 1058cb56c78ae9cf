"""Approval in the request's own protocol, with the official clients: the MCP SDK's `Client` (the model sees the
approval in a tool result with isError, and the call made after the approval executes once) and gql for a
GraphQL mutation (its errors shape, `extensions.code` `approval-required`, then the mutation runs once)."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from gql import Client, GraphQLRequest, gql
from gql.transport.exceptions import TransportQueryError
from gql.transport.httpx import HTTPXAsyncTransport
from support.asgi import serve_asgi
from support.e2e import open_store, tag
from support.graphql_server import IssueTracker
from support.mcp_server import TicketDesk, mcp_client
from support.proxy import start_inprocess_proxy

from tests.conftest import migrate

CREATE = "mutation CreateIssue($title: String!) { createIssue(title: $title) { id title } }"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("approval_protocols")
    module_db_url = f"sqlite:///{tmp / 'receipts.db'}"  # what either side sees does not depend on the database
    migrate(module_db_url)
    desk, tracker = TicketDesk(), IssueTracker()
    mcp, graphql = serve_asgi(desk.app()), serve_asgi(tracker.app())
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning}\n"
        "hosts:\n"
        f'  "127.0.0.1:{mcp.port}":\n'
        "    operations: [{name: tickets.create, method: POST, path: /mcp, call: create_ticket, approval: required}]\n"
        f'  "127.0.0.1:{graphql.port}":\n'
        "    operations: [{name: issues.create, method: POST, path: /graphql, call: CreateIssue, approval: required}]\n"
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store:
            yield {"proxy": proxy, "store": store, "desk": desk, "tracker": tracker, "mcp": mcp, "graphql": graphql}
    finally:
        proxy.stop()
        mcp.stop()
        graphql.stop()


def text_of(result) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def pending_id(store, operation: str) -> str:
    [pending] = [a for a in store.approvals.list(state="pending") if a.operation == operation]
    return pending.approval_id


def test_mcp_the_model_reads_the_approval_and_the_call_after_it_executes_once(env):
    title = f"ticket-{tag()}"
    url = f"{env['mcp'].base}/mcp"

    async def call() -> Any:
        async with mcp_client(env["proxy"].url, url, "auto") as client:
            return await client.call_tool("create_ticket", {"title": title})

    asked = asyncio.run(call())
    approval_id = pending_id(env["store"], "mcp tools/call create_ticket")
    assert asked.is_error and approval_id in text_of(asked)
    assert "Approval required" in text_of(asked) and "send this same request again" in text_of(asked)
    assert env["desk"].ran("create_ticket", title) == 0
    assert asyncio.run(call()).is_error  # still pending: the same approval
    assert pending_id(env["store"], "mcp tools/call create_ticket") == approval_id

    env["store"].approvals.decide(approval_id, "approve", "ticket wanted", "alice")
    done = asyncio.run(call())
    assert not done.is_error and title in text_of(done)
    again = asyncio.run(call())  # a repeat: answered from the receipt (the replay), not executed
    assert not again.is_error and text_of(again) == text_of(done)
    assert env["desk"].ran("create_ticket", title) == 1
    assert env["store"].approvals.get(approval_id).state == "used"


def test_graphql_the_mutation_waits_for_approval_in_the_errors_shape(env):
    title = f"issue-{tag()}"
    url = f"{env['graphql'].base}/graphql"

    async def run() -> dict[str, Any]:
        transport = HTTPXAsyncTransport(url=url, proxy=env["proxy"].url, timeout=30)
        async with Client(transport=transport) as session:
            return await session.execute(GraphQLRequest(gql(CREATE), variable_values={"title": title}))

    before = env["tracker"].ran("createIssue")
    with pytest.raises(TransportQueryError) as caught:
        asyncio.run(run())
    [error] = caught.value.errors
    approval_id = pending_id(env["store"], "graphql CreateIssue")
    assert error["extensions"] == {"code": "approval-required", "state": "pending", "approval_id": approval_id}
    assert "a person must approve it" in error["message"]
    assert env["tracker"].ran("createIssue") == before

    env["store"].approvals.decide(approval_id, "approve", "ok", "alice")
    assert asyncio.run(run())["createIssue"]["title"] == title
    assert env["tracker"].ran("createIssue") == before + 1
