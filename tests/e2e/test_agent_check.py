"""`POST /check` agrees with what the real write then gets, for every row of CONTRACT.md's "What an agent sees"
that a check can foresee (docs/agents.md's table), through a real proxy, on SQLite and PostgreSQL.

Each row sets up the world (an earlier write, an approval, a held original), asks the agent API what the proxy
would do with a request, then sends that very request through the proxy and reads what it got: the decision
(forward: a new receipt; replay: `X-Receipt-Replayed`; refuse: the proxy's own answer naming a receipt, or a
problem of its own; approval_required; not_journaled: no receipt), the status of the proxy's own answer, and
the problem. Nothing the check did may show: no receipt, no refusal, no approval, no upstream request.

Rows a check cannot foresee, and why (check.py says so too): what the upstream will answer (every `forward` row
below then gets the upstream's verdict: shown in the last column), a journal that fails at the moment of the
write (503), a proxy that stalls before sending, an agent that leaves.
"""

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from support.asgi import AsgiServer, serve_asgi
from support.e2e import open_store, proxy_client, received, tag, wait_for
from support.mcp_server import TicketDesk
from support.proxy import RunningProxy, start_inprocess_proxy
from support.server import free_port
from support.upstream import Upstream, start_upstream

from proxy_addon.store import ReceiptStore

MAX_BODY = 64 * 1024
CHECK = "http://receipts.internal/check"
MCP_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28"}


@dataclass
class World:
    proxy: RunningProxy
    store: ReceiptStore
    client: httpx.Client
    ups: dict[str, Upstream]  # by after_success / in_flight policy: replay (default), refuse, allow, wait
    mcp: AsgiServer
    admin_port: int
    held: list[threading.Thread] = field(default_factory=list)

    def url(self, path: str, policy: str = "replay") -> str:
        return f"http://127.0.0.1:{self.ups[policy].port}{path}"

    def send(self, request: dict[str, Any]) -> httpx.Response:
        body = request.get("body")
        content = body.encode() if isinstance(body, str) else (json.dumps(body).encode() if body is not None else None)
        headers = dict(request.get("headers") or {})
        if body is not None and not isinstance(body, str):
            headers.setdefault("content-type", "application/json")
        return self.client.request(request["method"], request["url"], headers=headers, content=content)


@pytest.fixture(scope="module")
def world(module_db_url, tmp_path_factory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("agent_check")
    ups = {name: start_upstream() for name in ("replay", "refuse", "allow", "wait")}
    desk = TicketDesk()
    mcp = serve_asgi(desk.app())
    admin_port = free_port()
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "logging: {level: warning}\n"
        f"admin: {{enabled: true, listen_port: {admin_port}}}\n"
        f"proxy: {{max_body: {MAX_BODY}}}\n"
        "defaults: {upstream_timeout: 5s}\n"
        "hosts:\n"
        f'  "127.0.0.1:{ups["replay"].port}":\n'
        "    operations:\n"
        "      - {name: searches, method: POST, path: \"/search/{q}\", journal: false}\n"
        "      - {name: payouts, method: POST, path: \"/approve/{x}\", approval: required}\n"
        f'  "127.0.0.1:{ups["refuse"].port}": {{after_success: {{policy: refuse}}}}\n'
        f'  "127.0.0.1:{ups["allow"].port}": {{after_success: {{policy: allow}}}}\n'
        f'  "127.0.0.1:{ups["wait"].port}": {{in_flight: {{policy: wait, max_wait: 1s}}}}\n'
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield World(proxy, store, client, ups, mcp, admin_port)
    finally:
        proxy.stop()
        mcp.stop()
        for up in ups.values():
            up.stop()


# -- the world before each row: an earlier write, an approval, a held original -------------------------------


def post(w: World, path: str, body: Any = None, policy: str = "replay", **headers: str) -> dict[str, Any]:
    return {"method": "POST", "url": w.url(path, policy), "headers": headers, "body": body if body is not None else {"n": 1}}


def done_first(w: World, request: dict[str, Any]) -> dict[str, Any]:
    """The request sent once, its verdict in: the row's request is its repeat."""
    first = w.send(request)
    assert "x-receipt-id" in first.headers, first.text
    wait_for(lambda: w.store.receipts.get(first.headers["x-receipt-id"]).state != "submitted", 15)
    return request


def held_first(w: World, path: str, policy: str = "replay") -> dict[str, Any]:
    """The request sent once to a path the upstream holds until the row is over: its receipt stays submitted."""
    request = post(w, path, policy=policy)
    thread = threading.Thread(target=w.send, args=(request,), daemon=True)
    thread.start()
    w.held.append(thread)
    wait_for(lambda: received(w.ups[policy], path), 15)  # at the upstream: its receipt is submitted
    return request


def mcp_call(w: World, tool: str, arguments: dict[str, Any], id: int = 1) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": MCP_META}}
    headers = {**MCP_HEADERS, "mcp-method": "tools/call", "mcp-name": tool}
    return {"method": "POST", "url": f"{w.mcp.base}/mcp", "headers": headers, "body": json.dumps(body)}


def mcp_list(w: World) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MCP_META}}
    headers = {**MCP_HEADERS, "mcp-method": "tools/list"}
    return {"method": "POST", "url": f"{w.mcp.base}/mcp", "headers": headers, "body": json.dumps(body)}


def approved(w: World, path: str) -> dict[str, Any]:
    request = post(w, path)
    first = w.send(request).json()
    w.store.approvals.decide(first["approval_id"], "approve", "checked by the test", "test")
    return request


def denied(w: World, path: str) -> dict[str, Any]:
    request = post(w, path)
    first = w.send(request).json()
    w.store.approvals.decide(first["approval_id"], "deny", "not this one", "test")
    return request


def keyed_twice(w: World, t: str) -> dict[str, Any]:
    done_first(w, post(w, f"/k/{t}", {"a": 1}, **{"Idempotency-Key": f"key-{t}"}))
    return post(w, f"/k/{t}", {"a": 2}, **{"Idempotency-Key": f"key-{t}"})


def put_after_put(w: World, t: str) -> dict[str, Any]:
    a = {"method": "PUT", "url": w.url(f"/things/{t}"), "headers": {}, "body": {"v": "a"}}
    done_first(w, a)
    done_first(w, {**a, "body": {"v": "b"}})
    return a


@dataclass(frozen=True)
class Row:
    situation: str  # the row of docs/agents.md's table
    prepare: Callable[[World, str], dict[str, Any]]  # (world, a fresh tag) -> the request to check, then send
    decision: str
    status: int | None  # the proxy's own answer's status; None: the upstream answers
    problem: str | None = None
    then: int | None = None  # a forwarded write: the status it then gets (the upstream's verdict)
    raw: bool = False  # sent as raw bytes (httpx will not send what HTTP/1.1 forbids)


ROWS = [
    Row("upstream 2xx", lambda w, t: post(w, f"/new/{t}"), "forward", None, then=201),
    Row("upstream 2xx, a body read off the event loop", lambda w, t: post(w, f"/large/{t}", {"text": "x" * 20000}),
        "forward", None, then=201),
    Row("upstream 4xx", lambda w, t: post(w, f"/status/422/{t}"), "forward", None, then=422),
    Row("a status in unknown_statuses", lambda w, t: post(w, f"/status/503/{t}"), "forward", None, then=504),
    Row("connection never made", lambda w, t: {**post(w, f"/x/{t}"), "url": f"http://127.0.0.1:{free_port()}/x/{t}"},
        "forward", None, then=502),
    Row("same intent in flight (refuse)", lambda w, t: held_first(w, f"/held/{t}"), "refuse", 409, "duplicate-open"),
    Row("same intent in flight (wait), past max_wait", lambda w, t: held_first(w, f"/held/{t}", "wait"), "refuse", 409,
        "duplicate-open"),
    Row("same intent while its outcome is unknown", lambda w, t: done_first(w, post(w, f"/status/504/{t}")), "refuse", 409,
        "duplicate-open"),
    Row("same intent after a success: replay", lambda w, t: done_first(w, post(w, f"/location/{t}")), "replay", 201),
    Row("same intent after a success: refuse", lambda w, t: done_first(w, post(w, f"/location/{t}", policy="refuse")),
        "refuse", 409, "duplicate-succeeded"),
    Row("same intent after a success: allow", lambda w, t: done_first(w, post(w, f"/location/{t}", policy="allow")),
        "forward", None, then=201),
    Row("a success whose answer cannot be replayed (a secret field)", lambda w, t: done_first(w, post(w, f"/plain/{t}")),
        "refuse", 409, "duplicate-succeeded"),
    Row("a later PUT to the same target ended the window", lambda w, t: put_after_put(w, t), "forward", None, then=200),
    Row("same Idempotency-Key, another request", keyed_twice, "refuse", 422, "idempotency-key-mismatch"),
    Row("approval required, none asked yet", lambda w, t: post(w, f"/approve/{t}"), "approval_required", 403,
        "approval-required"),
    Row("approval pending", lambda w, t: done_pending(w, post(w, f"/approve/{t}")), "approval_required", 403,
        "approval-required"),
    Row("approved", lambda w, t: approved(w, f"/approve/{t}"), "forward", None, then=201),
    Row("denied", lambda w, t: denied(w, f"/approve/{t}"), "refuse", 403, "approval-denied"),
    Row("a body over proxy.max_body", lambda w, t: post(w, f"/big/{t}", "x" * (MAX_BODY + 1)), "refuse", 413,
        "body-too-large"),
    Row("a header HTTP/1.1 forbids", lambda w, t: post(w, f"/nul/{t}", **{"X-Api-Key": "k\x00tail"}), "refuse", 400,
        "bad-request", raw=True),
    Row("the proxy's own admin server", lambda w, t: {**post(w, "/"), "url": f"http://127.0.0.1:{w.admin_port}/receipts"},
        "refuse", 403, "forbidden-destination"),
    Row("a method not journaled", lambda w, t: {"method": "GET", "url": w.url(f"/read/{t}"), "headers": {}},
        "not_journaled", None),
    Row("a rule with journal: false", lambda w, t: post(w, f"/search/{t}"), "not_journaled", None),
    Row("a GraphQL query", lambda w, t: post(w, f"/{t}/graphql", {"query": "{ things { id } }"}), "not_journaled", None),
    Row("a GraphQL mutation repeated (its answer holds a secret field)",
        lambda w, t: done_first(w, post(w, f"/{t}/graphql", {"query": 'mutation { make(t: "' + t + '") { id } }'})),
        "refuse", 409, "duplicate-succeeded"),
    Row("MCP tools/list", lambda w, t: mcp_list(w), "not_journaled", None, then=200),
    Row("MCP tools/call repeated", lambda w, t: done_first(w, mcp_call(w, "create_ticket", {"title": t})), "replay", 200),
]


def done_pending(w: World, request: dict[str, Any]) -> dict[str, Any]:
    assert w.send(request).json()["type"].endswith("approval-required")
    return request


# -- what the real write got ----------------------------------------------------------------------------------


def outcome(w: World, response: httpx.Response | tuple[int, dict[str, str], bytes], known: set[str]) -> tuple[str, int, str | None]:
    """(decision, status, problem) of what the write got: forward is a receipt that was not there before."""
    status, headers, body = (response.status_code, response.headers, response.content) if isinstance(response, httpx.Response) else response
    receipt = headers.get("x-receipt-id")
    problem = None
    if "problem+json" in headers.get("content-type", ""):
        problem = json.loads(body)["type"].rsplit(":", 1)[1]
    elif b'"extensions"' in body and b'"code"' in body:
        problem = json.loads(body)["errors"][0]["extensions"]["code"]  # GraphQL's errors shape
    if headers.get("x-receipt-replayed") == "true":
        return "replay", status, problem
    if problem in ("approval-required",):
        return "approval_required", status, problem
    if receipt is not None and receipt not in known:
        return "forward", status, problem
    if receipt is not None or problem is not None:
        return "refuse", status, problem
    return "not_journaled", status, problem


def raw_send(w: World, request: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    from tests.e2e.test_admission import raw

    body = json.dumps(request["body"]).encode()
    host = request["url"].split("/")[2]
    head = f"POST {request['url']} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in request["headers"].items()) + f"Content-Length: {len(body)}\r\n\r\n"
    answer = raw(w.proxy.port, head.encode() + body)
    top, _, content = answer.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, content


def traces(w: World) -> tuple[int, int, int, int]:
    """What a check must not leave: receipts, refusals, approvals, upstream requests."""
    with w.store.db.engine.connect() as conn:
        refusals = conn.exec_driver_sql("SELECT count(*) FROM duplicate_refusals").scalar_one()
        approvals = conn.exec_driver_sql("SELECT count(*) FROM approvals").scalar_one()
    upstream = sum(len(up.received) for up in w.ups.values())
    return len(w.store.receipts.list(limit=None)), refusals, approvals, upstream


@pytest.mark.parametrize("row", ROWS, ids=[r.situation for r in ROWS])
def test_check_agrees_with_the_real_write(world: World, row: Row):
    t = tag()
    request = row.prepare(world, t)
    before = traces(world)
    known = {r.operation_id for r in world.store.receipts.list(limit=None)}

    checked = world.client.post(CHECK, json=request)
    assert checked.status_code == 200, checked.text
    said = checked.json()
    assert traces(world) == before, "the check left a trace"
    assert "x-receipt-id" not in checked.headers

    response = raw_send(world, request) if row.raw else world.send(request)
    got = outcome(world, response, known)
    release_held(world)
    refused_by = (response[1] if isinstance(response, tuple) else response.headers).get("x-receipt-id")
    if got[0] in ("refuse", "replay") and refused_by is not None:  # its refusal is noted off the answer's path
        wait_for(lambda: world.store.refusals.list(blocking_operation_id=refused_by, limit=None), 15)
    assert (said["decision"], said["status"], said["problem"]) == (row.decision, row.status, row.problem), said
    assert got[0] == said["decision"], (said, got)
    if said["status"] is not None or row.then is not None:  # else the upstream answers as it will: a read
        assert got[1] == (said["status"] if said["status"] is not None else row.then), (said, got)
    if said["problem"] is not None and row.status != 200:
        assert got[2] == said["problem"], (said, got)
    if said["operation_id"] is not None and said["decision"] in ("refuse", "replay"):
        assert said["receipt_url"] == f"http://receipts.internal/receipts/{said['operation_id']}"


def release_held(w: World) -> None:
    for up in w.ups.values():
        for path in list(up.gates):
            up.release(path)
    for thread in w.held:
        thread.join(15)
    w.held.clear()


def test_every_upstream_request_of_the_rows_was_the_real_writes_own(world: World):
    """A check forwards nothing: the upstream saw no request to the agent API's host, nor any check's body."""
    for up in world.ups.values():
        assert not [r for r in up.received if b'"method"' in r.body and b'"url"' in r.body]
    assert received(world.ups["replay"], "/check") == []
