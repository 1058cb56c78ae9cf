"""GraphQL through the proxy: a server executed by graphql-core, the `gql` client (and plain httpx for a
document laid out by hand), on SQLite and PostgreSQL.

Queries pass through (a second one is executed again and sees fresh data); a mutation is journaled once as
`graphql <name>`; the same mutation laid out differently (whitespace, comments, variables in another order)
is the same intent and is answered from its receipt; the proxy's own problems are GraphQL errors carrying
the receipt; a mutation the server refuses (errors, no data) is rejected and may be sent again; a secret
written into the document is not stored; the reconciler settles an unknown mutation with a GraphQL query.
"""

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from gql import Client, GraphQLRequest, gql
from gql.transport.exceptions import TransportQueryError
from gql.transport.httpx import HTTPXAsyncTransport
from support.asgi import AsgiServer, serve_asgi
from support.e2e import once_moved_on, open_store, proxy_client, settled, tag
from support.graphql_server import IssueTracker
from support.proxy import RunningProxy, start_inprocess_proxy
from support.shown import ls_table, review_page

from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.store import ReceiptStore

CREATE = "mutation CreateIssue($title: String!, $delay: Float) { createIssue(title: $title, delay: $delay) { id title } }"
LAID_OUT_ANEW = """
# the same mutation, written by hand
mutation CreateIssue(
  $delay: Float,   $title: String!
) {
  createIssue(delay: $delay, title: $title) {   # arguments are unordered in GraphQL
    id
    title
  }
}
"""
ISSUES = "query { issues { id title } }"
SEARCH_BODY = {"query": ISSUES}


@dataclass
class Env:
    proxy: RunningProxy
    store: ReceiptStore
    tracker: IssueTracker
    server: AsgiServer
    config: Path
    client: httpx.Client
    database_url: str

    @property
    def url(self) -> str:
        return f"{self.server.base}/graphql"


@pytest.fixture(scope="module")
def env(module_db_url, tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("graphql")
    tracker = IssueTracker()
    server = serve_asgi(tracker.app())
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning}\n"
        "hosts:\n"
        f'  "127.0.0.1:{server.port}":\n'
        "    upstream_timeout: 2s\n"
        "    operations:\n"
        "      - name: issues.create\n"
        "        method: POST\n"
        "        path: /graphql\n"
        "        call: CreateIssue\n"
        "        external_id: $.data.createIssue.id\n"
        "        retry_safe: true\n"
        "        reconcile:\n"
        "          strategy: search\n"
        "          method: POST\n"
        '          url: "{scheme}://{netloc}/graphql"\n'
        f"          body: {json.dumps(SEARCH_BODY)}\n"
        "          items: $.data.issues\n"
        "          match: {$.title: $.variables.title}\n"
        "          id: $.id\n"
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield Env(proxy, store, tracker, server, config, client, module_db_url)
    finally:
        proxy.stop()
        server.stop()


def execute(env: Env, document: str, **variables: Any) -> dict[str, Any]:
    """With the gql client, through the proxy."""

    async def run() -> dict[str, Any]:
        transport = HTTPXAsyncTransport(url=env.url, proxy=env.proxy.url, timeout=30)
        async with Client(transport=transport) as session:
            return await session.execute(GraphQLRequest(gql(document), variable_values=variables or None))

    return asyncio.run(run())


def receipts_of(env: Env, title: str) -> list[ReceiptRecord]:
    found = once_moved_on(
        lambda: [r for r in env.store.receipts.list(port=env.server.port, limit=None) if title in (r.request_body or b"").decode()]
    )
    return sorted(found, key=lambda r: r.created_at)


def test_queries_pass_through_and_read_fresh(env: Env):
    before = env.tracker.ran("issues")
    first = execute(env, ISSUES)
    title = f"fresh-{tag()}"
    execute(env, CREATE, title=title)
    second = execute(env, ISSUES)  # not a replay of the first: it sees the new issue
    assert title not in json.dumps(first) and title in json.dumps(second)
    assert env.tracker.ran("issues") == before + 2
    ops = {r.operation for r in env.store.receipts.list(port=env.server.port, limit=None)}
    assert "graphql issues" not in ops and "graphql CreateIssue" in ops  # the mutation journaled, no query


def test_a_mutation_is_journaled_once_whatever_its_layout(env: Env):
    title = f"issue-{tag()}"
    before = env.tracker.ran("createIssue")
    created = execute(env, CREATE, title=title)
    # the same request laid out by hand, its operation named: the same intent, answered from its receipt
    body = {"variables": {"title": title}, "operationName": "CreateIssue", "query": LAID_OUT_ANEW}
    again = env.client.post(env.url, json=body)
    assert again.status_code == 200 and again.headers["x-receipt-replayed"] == "true"
    assert again.json()["data"] == created
    assert env.tracker.ran("createIssue") == before + 1
    [receipt] = receipts_of(env, title)
    assert (receipt.operation, receipt.state, receipt.external_id) == ("graphql CreateIssue", "succeeded", created["createIssue"]["id"])
    # another document (the title inline, not a variable) is another intent
    other = env.client.post(env.url, json={"query": f'mutation {{ createIssue(title: "{title}") {{ id }} }}'})
    assert "x-receipt-replayed" not in other.headers and env.tracker.ran("createIssue") == before + 2
    assert settled(env.store, other.headers["x-receipt-id"]).operation == "graphql createIssue"


def test_an_unknown_outcome_is_a_graphql_error_naming_the_receipt_and_is_reconciled(env: Env):
    title = f"slow-{tag()}"
    before = env.tracker.ran("createIssue")
    errors = []
    for _ in range(2):
        with pytest.raises(TransportQueryError) as caught:
            execute(env, CREATE, title=title, delay=4)
        errors.append(caught.value.errors[0])
    [receipt] = receipts_of(env, title)
    assert receipt.state == "outcome_unknown"
    unknown, refused = (e["extensions"] for e in errors)
    url = f"http://receipts.internal/receipts/{receipt.operation_id}"  # where the agent asks later (the agent API)
    assert unknown == {"code": "outcome-unknown", "operation_id": receipt.operation_id, "state": "outcome_unknown", "receipt_url": url}
    assert refused == {"code": "duplicate-open", "operation_id": receipt.operation_id, "state": "outcome_unknown", "receipt_url": url}
    assert receipt.operation_id in errors[1]["message"]
    assert env.tracker.ran("createIssue") == before + 1  # the retry was not sent

    report = asyncio.run(Reconciler(load_config(env.config), env.store).run_once())
    assert report.claimed >= 1
    after = settled(env.store, receipt.operation_id)
    issue = next(i for i in env.tracker.issues if i["title"] == title)
    assert (after.state, after.external_id) == ("succeeded", issue["id"])


def test_a_refused_mutation_is_rejected_and_may_be_sent_again(env: Env):
    title = f"invalid-{tag()}"
    document = "mutation Bad($title: String!) { createIssue(title: $title) { id nosuchfield } }"
    for _ in range(2):
        r = env.client.post(env.url, json={"query": document, "variables": {"title": title}})
        assert r.json()["errors"] and "x-receipt-replayed" not in r.headers
    receipts = receipts_of(env, title)
    assert [(r.state, r.error_code) for r in receipts] == [("rejected", "graphql_errors")] * 2


def test_a_secret_written_into_the_document_is_not_stored(env: Env):
    user = f"user-{tag()}"
    r = env.client.post(env.url, json={"query": f'mutation {{ login(user: "{user}", password: "hunter2") }}'})
    assert r.json() == {"data": {"login": True}}
    [receipt] = receipts_of(env, user)
    assert receipt.operation == "graphql login" and b"hunter2" not in receipt.request_body


def test_the_cli_and_the_page_show_the_mutations_operation_name(env: Env):
    execute(env, CREATE, title=f"shown-{tag()}")
    host = env.server.netloc
    assert "graphql CreateIssue" in ls_table(env.config, env.database_url, host)
    assert "graphql CreateIssue" in review_page(env.config, env.store, host)
