"""The protocol seam, pure: what passes through from the head alone (routing.route), host keys and model APIs,
the config keys of docs/journaled.md, and what each protocol module reads off a body: GraphQL (graphql-core),
JSON-RPC and MCP (identity, operation names, verdicts, answers in their own shape), and a
reconcile read's body template. Server-sent events: test_sse.py; host keys alone: test_hosts.py."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError, UnreadableRuleError
from proxy_addon.protocols import graphql, jsonrpc, routing, sse
from proxy_addon.protocols.base import Call
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.reconcile.rules import fill_body
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse
from proxy_addon.rules import answers
from proxy_addon.rules.fingerprint import analyse_body, intent_fingerprint
from proxy_addon.rules.hosts import find_host_entry, is_model_api
from proxy_addon.rules.records import ReceiptRecord, Verdict
from proxy_addon.rules.states import State

CONFIG = """
proxy: {methods: [POST, PUT, PATCH, DELETE, PURGE]}
hosts:
  "*.example.com": {journal: false}
  "*.api.example.com": {upstream_timeout: 5s}
  "pay.api.example.com": {upstream_timeout: 7s}
  "pay.api.example.com:8443": {upstream_timeout: 9s}
  "api.anthropic.com": {journal: true}
  "rpc.test":
    operations:
      - {name: search, method: POST, path: /search, journal: false}
      - {name: rpc, method: POST, path: /rpc, protocol: jsonrpc, read_methods: [eth_call, "eth_get*"]}
      - {name: read_tool, method: POST, path: /mcp, call: "search_*", journal: false}
      - {name: gql, method: POST, path: /api, protocol: graphql}
      - {name: plain, method: POST, path: /plain, protocol: rest}
"""


@pytest.fixture(scope="module")
def config():
    return parse_config(CONFIG)


def facts(body: Any, path: str = "/mcp", method: str = "POST", host: str = "rpc.test", headers: dict | None = None) -> RequestFacts:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [("content-type", "application/json"), *(headers or {}).items()]
    return RequestFacts(method, "https", host, 443, path, [], head, "application/json", raw)


# -- from the head alone ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, host, port, path, journal, passes",
    [
        ("GET", "rpc.test", 443, "/x", False, "method"),
        ("OPTIONS", "rpc.test", 443, "/x", False, "method"),
        ("PURGE", "rpc.test", 443, "/x", True, None),
        ("POST", "shop.example.com", 443, "/x", False, "host"),  # *.example.com
        ("POST", "example.com", 443, "/x", True, None),  # a wildcard is for subdomains only
        ("POST", "api.openai.com", 443, "/v1/chat/completions", False, "model_api"),
        ("POST", "my-res.openai.azure.com", 443, "/openai/deployments/x", False, "model_api"),
        ("POST", "bedrock-runtime.eu-west-1.amazonaws.com", 443, "/model/x/invoke", False, "model_api"),
        ("POST", "api.anthropic.com", 443, "/v1/messages", True, None),  # its own entry says journal: true
        ("POST", "rpc.test", 443, "/search", False, "rule"),
        ("POST", "rpc.test", 443, "/search?q=1", False, "rule"),
        ("POST", "rpc.test", 443, "/mcp", True, None),  # a rule naming a call needs the body
    ],
)
def test_what_passes_from_the_head_alone(config, method, host, port, path, journal, passes):
    route = routing.route(config, method, host, port, path)
    assert (route.journal, route.passes) == (journal, passes)


def test_model_apis_are_journaled_when_pass_model_apis_is_off():
    off = parse_config("proxy: {pass_model_apis: false}\n")
    assert routing.route(off, "POST", "api.openai.com", 443, "/v1/responses").journal
    assert is_model_api("API.OpenAI.com.") and is_model_api("generativelanguage.googleapis.com")
    assert not is_model_api("openai.com.evil.test") and not is_model_api("api.example.com")


@pytest.mark.parametrize(
    "host, port, timeout",
    [
        ("pay.api.example.com", 8443, 9.0),  # host:port
        ("pay.api.example.com", 443, 7.0),  # host
        ("x.api.example.com", 443, 5.0),  # the longest suffix
        ("a.b.api.example.com", 443, 5.0),
        ("api.example.com", 443, 30.0),  # *.example.com: no timeout of its own, the default's
    ],
)
def test_host_port_beats_host_beats_the_longest_suffix(config, host, port, timeout):
    assert config.policy_for(host, port).upstream_timeout == timeout
    assert find_host_entry({"*.com": 1, "*.b.com": 2}, "a.b.com", 1) == 2


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("proxy: {methods: [POST, 'BAD METHOD']}\n", "proxy.methods", "not an HTTP method token"),
        ("proxy: {methods: [POST, 'X-VERY-LONG-METHOD-NAME']}\n", "proxy.methods", "longer than 16"),
        ("proxy: {methods: [CONNECT]}\n", "proxy.methods", "opens a tunnel"),
        ("hosts: {'a.*.com': {journal: false}}\n", "hosts", "a wildcard is written *.suffix"),
        ("hosts: {'*.a.com:443': {journal: false}}\n", "hosts", "a wildcard is written *.suffix"),
        ("defaults: {protocol: soap}\n", "defaults.protocol", "auto"),
        ("hosts: {a.com: {operations: [{name: x, method: 'GE T', path: /x}]}}\n", "hosts.a.com.operations.0.method", "token"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(text, key, message):
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="config.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith(f"config.yaml: {key}") and message in str(err.value)


def test_the_docs_example_of_what_is_journaled_is_a_valid_config():
    page = (Path(__file__).resolve().parents[2] / "docs" / "journaled.md").read_text()
    section = page.split("## The keys that decide it", 1)[1].split("\n## ", 1)[0]
    [example] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    config = parse_config(example)
    assert routing.route(config, "POST", "db.internal.example.com", 443, "/q").passes == "host"
    assert routing.route(config, "POST", "api.openai.com", 443, "/v1/responses").journal


def test_any_method_token_is_journaled_and_may_name_a_rule():
    config = parse_config("proxy: {methods: [post, PURGE, MKCOL, x-sync]}\nhosts: {a.com: {operations: [{name: p, method: purge, path: /c}]}}\n")
    assert config.proxy.methods == ["POST", "PURGE", "MKCOL", "X-SYNC"]
    assert config.hosts["a.com"].operations[0].method == "PURGE"


# -- GraphQL ----------------------------------------------------------------------------------------------------

MUTATION = "mutation CreateIssue($title: String!) { createIssue(title: $title) { id } }"


def graphql_call(config, body: Any, path: str = "/graphql", host: str = "gql.test") -> Call:
    return routing.recognise(facts(body, path=path, host=host), config)


@pytest.mark.parametrize(
    "body, journal, operation",
    [
        ({"query": "{ issues { id } }"}, False, None),
        ({"query": "query Q { issues { id } }", "operationName": "Q"}, False, None),
        ({"query": "subscription { issueAdded { id } }"}, False, None),
        ({"query": MUTATION, "variables": {"title": "a"}}, True, "graphql CreateIssue"),
        ({"query": "mutation { createIssue(title: \"a\") { id } }"}, True, "graphql createIssue"),
        ({"query": "query A { a } mutation B { b }", "operationName": "B"}, True, "graphql B"),
        ({"query": "query A { a } mutation B { b }", "operationName": "A"}, False, None),
        ({"query": "mutation {"}, True, None),  # does not parse: a plain body (REST)
        ({"query": "query A { a } mutation B { b }"}, True, None),  # no operation selected: a plain body
        ([{"query": "{ a }"}, {"query": "{ b }"}], False, None),  # a batch of reads
        ([{"query": "{ a }"}, {"query": MUTATION}], True, None),  # a batch with a write: a plain body
    ],
)
def test_graphql_queries_pass_and_mutations_are_journaled(config, body, journal, operation):
    call = graphql_call(config, body)
    assert (call.journal, call.operation) == (journal, operation)


def test_graphql_is_recognised_by_path_or_by_a_rule(config):
    assert graphql_call(config, {"query": "{ a }"}, path="/v1/graphql/").passes == "graphql query"
    assert graphql_call(config, {"query": "{ a }"}, path="/api", host="rpc.test").passes == "graphql query"  # protocol: graphql
    assert graphql_call(config, {"query": "{ a }"}, path="/elsewhere").journal  # not GraphQL's path: REST


def graphql_fingerprint(config, body: dict) -> str:
    f = facts(body, path="/graphql", host="gql.test")
    call = routing.recognise(f, config)
    identity = call.identity(analyse_body("application/json", f.body, frozenset({"password", "token"})), None)
    return intent_fingerprint("POST", "gql.test", 443, "/graphql", [], identity)


def test_a_mutation_laid_out_differently_is_the_same_intent(config):
    base = graphql_fingerprint(config, {"query": MUTATION, "variables": {"title": "a"}})
    relaid = """# a comment
    mutation CreateIssue(  $title : String! ) {
        createIssue ( title : $title ) { id }   # another
    }"""
    assert graphql_fingerprint(config, {"variables": {"title": "a"}, "query": relaid, "operationName": "CreateIssue"}) == base
    assert graphql_fingerprint(config, {"query": MUTATION, "variables": {"title": "b"}}) != base
    assert graphql_fingerprint(config, {"query": MUTATION.replace("{ id }", "{ id title }"), "variables": {"title": "a"}}) != base
    # arguments and input fields are unordered in GraphQL; selections are not
    two = "mutation { m(a: 1, b: {x: 1, y: 2}) { p q } }"
    assert graphql_fingerprint(config, {"query": "mutation { m(b: {y: 2, x: 1}, a: 1) { p q } }"}) == graphql_fingerprint(
        config, {"query": two}
    )
    assert graphql_fingerprint(config, {"query": "mutation { m(a: 1, b: {x: 1, y: 2}) { q p } }"}) != graphql_fingerprint(
        config, {"query": two}
    )


def test_graphql_secrets_in_variables_and_literals_are_redacted(config):
    f = facts({"query": 'mutation { login(user: "u", password: "hunter2") }', "variables": {"token": "t0k"}}, path="/graphql")
    call = routing.recognise(f, config)
    stored = call.identity(analyse_body("application/json", f.body, frozenset({"password", "token"})), None).stored
    assert b"hunter2" not in stored and b"t0k" not in stored and b"[REDACTED]" in stored


def test_graphql_problems_are_errors_with_the_receipt(config):
    call = graphql_call(config, {"query": MUTATION, "variables": {"title": "a"}})
    problem = answers.with_receipt(answers.duplicate_open("op_1", "outcome_unknown"), "op_1", "outcome_unknown")
    shaped = call.answer(problem)
    assert shaped.status == 409 and shaped.header("content-type") == "application/json"
    assert shaped.header("x-receipt-id") == "op_1" and shaped.header("x-receipt-state") == "outcome_unknown"
    [error] = json.loads(shaped.body)["errors"]
    assert error["extensions"] == {"code": "duplicate-open", "operation_id": "op_1", "state": "outcome_unknown"}
    assert "op_1" in error["message"]
    upstream = answers.answer(200, b'{"data": {}}', {"content-type": "application/json"})
    assert call.answer(upstream) is upstream


@pytest.mark.parametrize(
    "body, state, code",
    [
        ({"data": {"createIssue": {"id": "1"}}}, State.SUCCEEDED, None),
        ({"data": {"createIssue": {"id": "1"}}, "errors": [{"message": "partial"}]}, State.SUCCEEDED, None),
        ({"errors": [{"message": "Cannot query field"}]}, State.REJECTED, "graphql_errors"),
        ({"data": None, "errors": [{"message": "boom"}]}, State.REJECTED, "graphql_errors"),
        ({"data": {"createIssue": None}, "errors": [{"message": "boom"}]}, State.REJECTED, "graphql_errors"),
    ],
)
def test_graphql_verdicts(config, body, state, code):
    call = graphql_call(config, {"query": MUTATION, "variables": {"title": "a"}})
    result = SendResult(SendEnd.ANSWERED, UpstreamResponse(200, "OK", [(b"content-type", b"application/json")], json.dumps(body).encode()))
    verdict = call.verdict(Verdict(State.SUCCEEDED, {"status_code": 200}), result)
    assert (verdict.state, verdict.error_code, verdict.status_code) == (state, code, 200)


# -- JSON-RPC and MCP -------------------------------------------------------------------------------------------

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def rpc(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if id is not None:
        message["id"] = id
    return message


def tool_call(name: str = "create_ticket", arguments: Any = None, id: Any = 1, **extra: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments or {"title": "a"}, **extra}, id)


@pytest.mark.parametrize(
    "body, path, journal, operation",
    [
        (tool_call(), "/mcp", True, "mcp tools/call create_ticket"),
        (rpc("initialize", {"protocolVersion": "2025-11-25"}), "/mcp", False, None),
        (rpc("server/discover", {"_meta": META}), "/mcp", False, None),
        (rpc("ping"), "/mcp", False, None),
        (rpc("tools/list"), "/mcp", False, None),
        (rpc("resources/read", {"uri": "file:///a"}), "/mcp", False, None),
        (rpc("prompts/get", {"name": "p"}), "/mcp", False, None),
        (rpc("completion/complete", {}), "/mcp", False, None),
        (rpc("notifications/initialized", id=None), "/mcp", False, None),
        ({"jsonrpc": "2.0", "id": 7, "result": {"action": "accept"}}, "/mcp", False, None),  # a client's response
        (tool_call("search_tickets"), "/mcp", False, "mcp tools/call search_tickets"),  # its rule: journal: false
        (rpc("eth_sendTransaction", ["0x1"]), "/rpc", True, "jsonrpc eth_sendTransaction"),
        (rpc("eth_call", []), "/rpc", False, None),  # read_methods
        (rpc("eth_getBalance", []), "/rpc", False, None),  # a glob
        ([rpc("eth_call", []), rpc("eth_getBalance", [])], "/rpc", False, None),  # a batch of reads
        ([rpc("eth_call", []), rpc("eth_send", [])], "/rpc", True, None),  # a batch with a write: a plain body
        ({"title": "no jsonrpc"}, "/rpc", True, None),  # protocol: jsonrpc, but not JSON-RPC: a plain body
        (rpc("tools/call", {"name": "x"}), "/plain", True, None),  # protocol: rest
    ],
)
def test_jsonrpc_and_mcp_reads_and_writes(config, body, path, journal, operation):
    call = routing.recognise(facts(body, path=path), config)
    assert (call.journal, call.operation) == (journal, operation)


def test_the_delete_that_ends_an_mcp_session_passes(config):
    ending = facts(b"", method="DELETE", headers={"mcp-session-id": "abc"})
    assert routing.recognise(ending, config).passes == "mcp session end"
    assert routing.recognise(facts(b"", method="DELETE"), config).journal


def tool_fingerprint(config, body: dict) -> str:
    f = facts(body)
    call = routing.recognise(f, config)
    identity = call.identity(analyse_body("application/json", f.body, frozenset({"password"})), None)
    return intent_fingerprint("POST", "rpc.test", 443, "/mcp", [], identity)


def test_a_tool_calls_identity_is_its_name_and_arguments(config):
    base = tool_fingerprint(config, tool_call(arguments={"title": "a", "n": 1}))
    assert tool_fingerprint(config, tool_call(arguments={"n": 1.0, "title": "a"}, id="other-id", _meta=META)) == base
    continuation = tool_call(arguments={"title": "a", "n": 1}, id=9, inputResponses={"k": {"action": "accept"}}, requestState="s")
    assert tool_fingerprint(config, continuation) == base
    assert tool_fingerprint(config, tool_call(arguments={"title": "b", "n": 1})) != base
    assert tool_fingerprint(config, tool_call("delete_ticket", arguments={"title": "a", "n": 1})) != base


def sse_answer(*messages: dict) -> UpstreamResponse:
    body = b": ping\r\n\r\n" + b"".join(sse.encode(m) for m in messages)
    return UpstreamResponse(200, "OK", [(b"content-type", b"text/event-stream")], body)


def json_answer(message: dict) -> UpstreamResponse:
    return UpstreamResponse(200, "OK", [(b"content-type", b"application/json")], json.dumps(message).encode())


PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 0.5}}
DONE = {"content": [{"type": "text", "text": "made 1"}], "isError": False}


@pytest.mark.parametrize(
    "answer, state, code",
    [
        (json_answer({"jsonrpc": "2.0", "id": 5, "result": DONE}), State.SUCCEEDED, None),
        (sse_answer(PROGRESS, {"jsonrpc": "2.0", "id": 5, "result": DONE}), State.SUCCEEDED, None),
        (json_answer({"jsonrpc": "2.0", "id": 5, "error": {"code": -32602, "message": "bad"}}), State.REJECTED, "jsonrpc_error"),
        (json_answer({"jsonrpc": "2.0", "id": 5, "result": {**DONE, "isError": True}}), State.REJECTED, "tool_error"),
        (json_answer({"jsonrpc": "2.0", "id": 5, "result": {"resultType": "input_required", "requestState": "s"}}),
         State.REJECTED, "input_required"),
        (sse_answer(PROGRESS), State.OUTCOME_UNKNOWN, "no_jsonrpc_response"),  # the stream ended without the answer
        (json_answer({"jsonrpc": "2.0", "id": "5", "result": DONE}), State.SUCCEEDED, None),  # the one answer, its id sloppy
        (json_answer({"jsonrpc": "2.0", "method": "notifications/message"}), State.OUTCOME_UNKNOWN, "no_jsonrpc_response"),
        (sse_answer({"jsonrpc": "2.0", "id": 6, "result": DONE}, {"jsonrpc": "2.0", "id": 7, "result": DONE}),
         State.OUTCOME_UNKNOWN, "no_jsonrpc_response"),  # several answers, none to this call
    ],
)  # fmt: skip
def test_mcp_verdicts_read_the_json_rpc_answer(config, answer, state, code):
    call = routing.recognise(facts(tool_call(id=5)), config)
    verdict = call.verdict(Verdict(State.SUCCEEDED, {"status_code": 200}), SendResult(SendEnd.ANSWERED, answer))
    assert (verdict.state, verdict.error_code) == (state, code)


def test_an_answer_in_events_is_stored_as_its_response_alone(config):
    call = routing.recognise(facts(tool_call(id=5)), config)
    stored = call.stored(SendResult(SendEnd.ANSWERED, sse_answer(PROGRESS, {"jsonrpc": "2.0", "id": 5, "result": DONE})))
    assert stored.answer is not None and (b"content-type", b"application/json") in stored.answer.headers
    assert json.loads(stored.answer.content) == {"jsonrpc": "2.0", "id": 5, "result": DONE}


@pytest.mark.parametrize("version, result_type", [("2026-07-28", True), ("2025-06-18", False), (None, True)])
def test_mcp_problems_are_tool_results_with_the_callers_id(config, version, result_type):
    headers = {"mcp-protocol-version": version} if version else {}
    call = routing.recognise(facts(tool_call(id="abc"), headers=headers), config)
    problem = answers.with_receipt(answers.outcome_unknown("op_9", "The upstream did not answer"), "op_9", "outcome_unknown")
    shaped = call.answer(problem)
    assert (shaped.status, shaped.header("content-type"), shaped.header("x-receipt-id")) == (200, "application/json", "op_9")
    document = json.loads(shaped.body)
    assert document["id"] == "abc" and document["jsonrpc"] == "2.0"
    result = document["result"]
    assert result["isError"] is True and ("resultType" in result) == result_type
    text = result["content"][0]["text"]
    assert "op_9" in text and "outcome_unknown" in text and "Do not send it again" in text


def test_mcp_replays_carry_the_callers_id(config):
    call = routing.recognise(facts(tool_call(id=42)), config)
    stored = answers.answer(200, json.dumps({"jsonrpc": "2.0", "id": 1, "result": DONE}).encode(), {"content-type": "application/json"})
    replay = answers.with_receipt(stored.with_headers({answers.REPLAYED_HEADER: "true"}), "op_1", "succeeded")
    shaped = call.answer(replay)
    assert json.loads(shaped.body) == {"jsonrpc": "2.0", "id": 42, "result": {**DONE, "resultType": "complete"}}
    assert shaped.header("x-receipt-replayed") == "true" and shaped.header("x-receipt-id") == "op_1"
    # an answer that cannot be read back is never passed off under another id
    broken = answers.with_receipt(answers.answer(200, b"gone", {}).with_headers({answers.REPLAYED_HEADER: "true"}), "op_1", "succeeded")
    result = json.loads(call.answer(broken).body)["result"]
    assert result["isError"] is True and "op_1" in result["content"][0]["text"]


def test_other_json_rpc_problems_are_json_rpc_errors(config):
    call = routing.recognise(facts(rpc("eth_sendTransaction", ["0x1"], id=3), path="/rpc"), config)
    shaped = call.answer(answers.with_receipt(answers.duplicate_succeeded("op_2"), "op_2", "succeeded"))
    document = json.loads(shaped.body)
    assert shaped.status == 200 and document["id"] == 3
    assert document["error"]["code"] == jsonrpc.SERVER_ERROR
    assert document["error"]["data"] == {"type": "duplicate-succeeded", "operation_id": "op_2", "state": "succeeded"}


def test_read_headers_for_reconcile_reads():
    body = tool_call("list_tickets", arguments={}, _meta=META)
    assert routing.read_headers(body) == {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "list_tickets",
    }
    assert routing.read_headers({"query": "{ a }"})["Accept"].startswith(graphql.RESPONSE_CONTENT_TYPE)
    assert routing.read_headers({"title": "x"}) == {}


def test_call_names_come_back_from_operation_names():
    assert routing.call_name("mcp tools/call create_ticket") == "create_ticket"
    assert routing.call_name("graphql CreateIssue") == "CreateIssue"
    assert routing.call_name("jsonrpc eth_send") == "eth_send"
    assert routing.call_name("POST api.example.com /x") is None


# -- a reconcile read's body ------------------------------------------------------------------------------------


def receipt(body: dict) -> ReceiptRecord:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    values: dict[str, Any] = dict.fromkeys(ReceiptRecord.__dataclass_fields__)
    values.update(operation_id="op_1", operation="mcp tools/call t", method="POST", scheme="https", host="h", port=443,
                  path="/mcp", request_body=json.dumps(body).encode(), created_at=now, submitted_at=now)
    return ReceiptRecord(**values)


def test_a_body_template_takes_values_whole_or_as_text():
    original = receipt(tool_call(arguments={"title": "a b", "tags": ["x"], "password": "[REDACTED]"}))
    template = {"q": "{body.params.arguments.title}", "tags": "{body.params.arguments.tags}", "s": "id {operation_id}",
                "query": "query { issues(first: 2) {title} }"}
    assert fill_body(template, original, {}) == {"q": "a b", "tags": ["x"], "s": "id op_1", "query": template["query"]}
    with pytest.raises(UnreadableRuleError):
        fill_body({"p": "{body.params.arguments.password}"}, original, {})
    with pytest.raises(UnreadableRuleError):
        fill_body({"p": "x {body.params.arguments.tags}"}, original, {})


# -- bad input: the seam never raises -----------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": st.sampled_from(["tools/call", "tools/list", "x", 5])},
    optional={"id": _json_values, "params": _json_values, "result": _json_values, "query": st.text(max_size=60)},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_messages, st.lists(_messages, max_size=3), _json_values, st.binary(max_size=60)),
       path=st.sampled_from(["/mcp", "/graphql", "/rpc", "/api"]), answer=st.binary(max_size=80))
def test_the_seam_never_raises_on_bad_input(config, body, path, answer):
    f = facts(body if isinstance(body, bytes) else json.dumps(body).encode(), path=path)
    call = routing.recognise(f, config)
    body_identity = call.identity(analyse_body("application/json", f.body, frozenset({"password"})), None)
    intent_fingerprint("POST", "rpc.test", 443, path, [], body_identity)
    for content_type in (b"application/json", b"text/event-stream"):
        result = SendResult(SendEnd.ANSWERED, UpstreamResponse(200, "OK", [(b"content-type", content_type)], answer))
        call.verdict(Verdict(State.SUCCEEDED, {"status_code": 200}), result)
        call.stored(result)
    replay = answers.answer(200, answer, {"content-type": "application/json"}).with_headers({answers.REPLAYED_HEADER: "true"})
    call.answer(replay)
    call.answer(answers.duplicate_open("op_1", "submitted"))
