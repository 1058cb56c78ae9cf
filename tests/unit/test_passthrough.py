"""The addons in-process (`taddons`, `tflow`): pass-through flows are streamed both ways, journaled ones never
upstream by mitmproxy; the request hook asks the protocol seam (a GraphQL query passes, an MCP tools/call is
journaled and answered in MCP's shape), with a fake sender for the upstream."""

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.test import taddons, tflow, tutils
from support.e2e import migrate

from proxy_addon.addons.passthrough import PASSES_KEY, Passthrough
from proxy_addon.addons.receipts import METADATA_KEY, Receipts
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse
from proxy_addon.store import ReceiptStore


class FakeSender:
    def __init__(self, *results: SendResult):
        self.results = list(results)
        self.sent: list[bytes] = []

    async def send_once(self, method: str, url: str, headers: Any, content: bytes, timeouts: Any, may_send: Any = None) -> SendResult:
        self.sent.append(content)
        return self.results.pop(0)

    async def aclose(self) -> None:
        pass


def flow(method: str = "POST", host: str = "api.example.com", path: str = "/things", body: Any = b"", **headers: str) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    fields = [(b"host", host.encode()), (b"content-type", b"application/json")]
    fields += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    req = tutils.treq(method=method.encode(), host=host, port=443, scheme=b"https", path=path.encode(), content=content,
                      headers=tuple(fields))
    return tflow.tflow(req=req, resp=False)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """`proxy(*results)` -> (hooks, sender): `hooks(flow)` runs requestheaders, request and (for a flow that
    went upstream) responseheaders with a 200 answer, as mitmproxy calls them."""
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(url)
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\nlogging: {{level: error}}\nhosts: {{'*.pass.test': {{journal: false}}}}\n")
    made: list[Receipts] = []

    def make(*results: SendResult) -> tuple[Callable[[Any], Any], FakeSender]:
        journal, sender = Receipts(), FakeSender(*results)
        streaming = Passthrough(journal)
        made.append(journal)

        def hooks(f: Any, status: int = 200) -> Any:
            async def go() -> None:
                with taddons.context(journal, streaming) as tctx:
                    tctx.configure(journal, receipts_config=str(config), receipts_database_url=url)
                    assert journal.handler is not None
                    journal.handler.sender = sender
                    streaming.requestheaders(f)
                    await journal.request(f)
                    if f.response is None:  # mitmproxy forwards it and reads the answer's head
                        f.response = tutils.tresp(status_code=status)
                        f.response.stream = False
                    streaming.responseheaders(f)
                    await journal.handler.drain()  # the verdict committed after its answer, as on shutdown

            asyncio.run(go())
            return f

        return hooks, sender

    yield make
    for journal in made:
        store: ReceiptStore | None = journal.store
        if store is not None:
            store.engine.dispose()


@pytest.mark.parametrize(
    "f, why",
    [
        (flow("GET"), "method"),
        (flow("OPTIONS"), "method"),
        (flow("POST", host="shop.pass.test"), "host"),
        (flow("POST", host="api.openai.com", path="/v1/chat/completions", body={"stream": True}), "model_api"),
        (flow("POST", host="api.anthropic.com", path="/v1/messages"), "model_api"),
    ],
)
def test_what_passes_from_its_head_streams_both_ways(proxy, f, why):
    hooks, sender = proxy()
    hooks(f)
    assert f.metadata[PASSES_KEY] == why and f.request.stream is True and f.response.stream is True
    assert sender.sent == [] and METADATA_KEY not in f.metadata


def test_a_read_found_in_the_body_streams_its_answer(proxy):
    hooks, sender = proxy()
    f = hooks(flow("POST", path="/graphql", body={"query": "{ issues { id } }"}))
    assert f.request.stream is False  # its body was needed to know it is a read
    assert f.metadata[PASSES_KEY] == "graphql query" and f.response.stream is True and sender.sent == []
    g = hooks(flow("POST", path="/mcp", body={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
    assert g.metadata[PASSES_KEY] == "mcp tools/list" and g.response.stream is True


def test_an_upgrade_is_left_to_mitmproxy(proxy):
    hooks, _ = proxy()
    f = hooks(flow("GET", path="/ws"), status=101)
    assert f.request.stream is True and f.response.stream is False


def test_a_journaled_request_is_read_whole_and_sent_by_the_handler(proxy):
    answered = SendResult(SendEnd.ANSWERED, UpstreamResponse(201, "Created", [(b"content-type", b"application/json")], b"{}"))
    hooks, sender = proxy(answered)
    f = hooks(flow("POST", body={"title": "a"}))
    assert f.request.stream is False and sender.sent == [b'{"title": "a"}']
    assert f.response.headers["x-receipt-state"] == "succeeded" and f.response.stream is False
    assert PASSES_KEY not in f.metadata


def test_an_mcp_tool_call_that_times_out_is_a_tool_result_naming_its_receipt(proxy):
    hooks, sender = proxy(SendResult(SendEnd.TIMEOUT, error="read timeout (30s)"))
    call = {"jsonrpc": "2.0", "id": "call-1", "method": "tools/call", "params": {"name": "create_ticket", "arguments": {"t": 1}}}
    f = hooks(flow("POST", path="/mcp", body=call, mcp_protocol_version="2026-07-28"))
    again = hooks(flow("POST", path="/mcp", body={**call, "id": "call-2"}, mcp_protocol_version="2026-07-28"))
    op = f.response.headers["x-receipt-id"]
    for g, call_id, words in ((f, "call-1", "Outcome unknown"), (again, "call-2", "Duplicate of an open receipt")):
        assert g.response.status_code == 200 and g.response.headers["content-type"] == "application/json"
        document = json.loads(g.response.content)
        assert document["id"] == call_id and document["result"]["isError"] is True
        assert document["result"]["resultType"] == "complete"
        assert op in document["result"]["content"][0]["text"] and words in document["result"]["content"][0]["text"]
    assert len(sender.sent) == 1


def test_an_internal_error_is_said_in_the_protocols_shape_too(proxy, monkeypatch):
    def broken(*_a: Any, **_kw: Any) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("proxy_addon.request.handler.write_intent", broken)
    hooks, sender = proxy()
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x", "arguments": {}}}
    f = hooks(flow("POST", path="/mcp", body=call))
    document = json.loads(f.response.content)
    assert f.response.status_code == 200 and document["id"] == 3 and document["result"]["isError"] is True
    assert "journal unavailable" in document["result"]["content"][0]["text"].lower() and sender.sent == []


def test_a_bug_in_a_protocol_fails_closed(proxy, monkeypatch):
    def broken(*_a: Any, **_kw: Any) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr("proxy_addon.protocols.routing.recognise", broken)
    hooks, sender = proxy()
    f = hooks(flow("POST", body={"title": "a"}))
    assert f.response.status_code == 503 and sender.sent == [] and PASSES_KEY not in f.metadata
