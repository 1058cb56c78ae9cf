"""JSON-RPC 2.0 over HTTP, MCP's streamable HTTP included.

A POST whose JSON body is a JSON-RPC 2.0 request or notification is read here (under `protocol: auto`, when
the body names `"jsonrpc"`; under `protocol: jsonrpc`, always).
- MCP `tools/call` is journaled. Its identity is the tool `name` and its `arguments`, never the JSON-RPC `id`
  nor `_meta` (nor a multi-round-trip continuation's `inputResponses`/`requestState`), so the same call
  with a new id is the same intent; its operation name is `mcp tools/call <name>`.
- Every other MCP method (initialize, server/discover, ping, tools/list, resources/*, prompts/*, ...),
  notifications, the JSON-RPC responses a client sends back, and the DELETE that ends an MCP session pass
  through.
- Any other JSON-RPC method is journaled (`jsonrpc <method>`, identity: method and params) unless the rule
  lists it in `read_methods` (globs). A batch passes when all of it is reads; else it is a plain body.

Answers the proxy makes for a tools/call are HTTP 200 `application/json`: a JSON-RPC response with the
caller's `id` whose `result` is a tool result with `isError: true` and a text naming the receipt, its state
and what the model may do (with `resultType` from protocol 2026-07-28 on, as the SDK requires). For other
methods they are JSON-RPC errors (code -32000) with the receipt in `data`. A replay is the stored result
under the caller's `id`. MCP servers may answer a POST with server-sent events: the verdict reads the
response among them, and what is stored for a replay is that response alone.

Verdicts of a 2xx answer: a JSON-RPC error is `rejected` (the server refused the call); a tool result with
`isError` is `rejected` (the tool reported a failure; the model may try again); a result that asks for more
input (`resultType: input_required`, MCP's multi-round-trip) is `rejected` with error_code
`input_required`: it is not a completed effect, so its continuation (the same call with the answers) is not
refused as its duplicate. An answer without the call's response is `outcome_unknown`.
"""

import json
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from proxy_addon.protocols import sse
from proxy_addon.protocols.base import Call, decoded_body, is_replay, json_document, problem_of, receipt_headers
from proxy_addon.protocols.rest import REST
from proxy_addon.rules import answers
from proxy_addon.rules.answers import Answer
from proxy_addon.rules.fingerprint import BodyIdentity
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import Verdict
from proxy_addon.rules.send_result import SendResult, UpstreamResponse
from proxy_addon.rules.states import State

if TYPE_CHECKING:
    from proxy_addon.protocols.base import Route
    from proxy_addon.protocols.facts import RequestFacts

NAME = "jsonrpc"
MCP = "mcp"
OPERATION_PREFIX = "jsonrpc "
TOOLS_CALL = "tools/call"
MCP_OPERATION_PREFIX = f"{MCP} {TOOLS_CALL} "
# MCP methods a client sends that change nothing on the server's side of the world: they pass through
MCP_READS = (
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "resources/*",
    "prompts/*",
    "completion/complete",
    "logging/setLevel",
    "notifications/*",
    "subscriptions/*",
    "tasks/*",
    "roots/*",
    "sampling/*",
    "elicitation/*",
)
HANDSHAKE_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})  # no resultType before 2026
PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
SESSION_HEADER = "mcp-session-id"
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}  # mirrored in Mcp-Name
SERVER_ERROR = -32000  # JSON-RPC 2.0: -32000 to -32099 are the implementation's server errors
_RESPONSE_KEYS = ("result", "error")


@dataclass(frozen=True)
class RpcCall(Call):
    """A JSON-RPC request that is journaled."""

    protocol: str = NAME
    method: str = ""
    request_id: Any = None
    has_id: bool = False  # a notification has none: the proxy's answers then stay problem+json

    def identity(self, body: BodyIdentity, rule: OperationRule | None) -> BodyIdentity:
        if (rule is not None and rule.fingerprint is not None) or body.kind != "json" or not isinstance(body.identity, dict):
            return body
        return replace(body, kind=self.protocol, identity=self._identity(body.identity.get("params")))

    def _identity(self, params: Any) -> dict[str, Any]:
        if isinstance(params, dict):
            params = {k: v for k, v in params.items() if k != "_meta"}
        return {"method": self.method, "params": params}

    def verdict(self, verdict: Verdict, result: SendResult) -> Verdict:
        if verdict.state != State.SUCCEEDED or result.answer is None:
            return verdict
        response = self.response_in(result.answer)
        if response is None:
            message = "the upstream's answer holds no JSON-RPC response to this call"
            return _with(verdict, State.OUTCOME_UNKNOWN, "no_jsonrpc_response", message)
        if "error" in response:
            error = response["error"] if isinstance(response["error"], dict) else {}
            message = f"JSON-RPC error {error.get('code')}: {str(error.get('message'))[:300]}"
            return _with(verdict, State.REJECTED, "jsonrpc_error", message)
        return self._result_verdict(verdict, response.get("result"))

    def _result_verdict(self, verdict: Verdict, result: Any) -> Verdict:
        return verdict

    def response_in(self, answer: UpstreamResponse, to_this_call: bool = True) -> dict[str, Any] | None:
        """The JSON-RPC response to this call (else the last one) in an answer (JSON, or server-sent events)."""
        content = decoded_body(answer.headers, answer.content)
        if content is None:
            return None
        content_type = next((v.decode("latin-1") for k, v in answer.headers if k.lower() == b"content-type"), None)
        found = sse.json_messages(content) if sse.is_event_stream(content_type) else json_document(content)
        return _response(found, self.request_id if self.has_id and to_this_call else None)

    def stored(self, result: SendResult) -> SendResult:
        """An answer in server-sent events is kept as its JSON-RPC response alone, as JSON."""
        a = result.answer
        if a is None or not sse.is_event_stream(next((v.decode("latin-1") for k, v in a.headers if k.lower() == b"content-type"), None)):
            return result
        response = self.response_in(a)
        if response is None:
            return result
        dropped = {b"content-type", b"content-encoding", b"content-length"}
        headers = [(k, v) for k, v in a.headers if k.lower() not in dropped] + [(b"content-type", b"application/json")]
        content = json.dumps(response, separators=(",", ":")).encode()
        return replace(result, answer=UpstreamResponse(a.status_code, a.reason, headers, content))

    def answer(self, answer: Answer) -> Answer:
        if not self.has_id:
            return answer
        problem = problem_of(answer)
        if problem is not None:
            error = {
                "code": SERVER_ERROR,
                "message": problem.sentence(),
                "data": {"type": problem.kind, "operation_id": problem.operation_id, "state": problem.state}
                | ({"approval_id": problem.approval_id} if problem.approval_id else {})
                | ({"receipt_url": problem.receipt_url} if problem.receipt_url else {}),
            }
            return self._reply({"error": error}, answer)
        if is_replay(answer):
            # the stored response answered the first call's id: the caller's is another
            stored_answer = UpstreamResponse(answer.status, answer.reason or "", list(answer.headers), answer.body)
            stored = self.response_in(stored_answer, to_this_call=False)
            if stored is not None:
                return self._reply(self._replayed({k: stored[k] for k in _RESPONSE_KEYS if k in stored}), answer, answer.status)
            return self._unreplayable(answer)
        return answer

    def _unreplayable(self, answer: Answer) -> Answer:
        return answer

    def _replayed(self, members: dict[str, Any]) -> dict[str, Any]:
        return members

    def _reply(self, members: dict[str, Any], answer: Answer, status: int = 200) -> Answer:
        """A JSON-RPC response to the caller's id, with the receipt's headers."""
        body = json.dumps({"jsonrpc": "2.0", "id": self.request_id, **members}).encode()
        headers = {"Content-Type": "application/json", "Cache-Control": "no-store", **receipt_headers(answer)}
        return answers.answer(status, body, headers)


@dataclass(frozen=True)
class McpToolCall(RpcCall):
    """An MCP `tools/call`."""

    protocol: str = MCP
    tool: str = ""
    result_type: bool = True  # the negotiated protocol requires `resultType` in results (2026-07-28 on)
    # the caller's W3C trace context as MCP carries it, in `params._meta` (`traceparent`, `tracestate`): the
    # parent of the write's span when no `traceparent` header names one (tracing.py)
    trace_context: tuple[tuple[str, str], ...] = ()

    def _identity(self, params: Any) -> dict[str, Any]:
        arguments = params.get("arguments") if isinstance(params, dict) else None
        return {"method": TOOLS_CALL, "name": self.tool, "arguments": arguments}

    def _result_verdict(self, verdict: Verdict, result: Any) -> Verdict:
        if not isinstance(result, dict):
            return verdict
        if result.get("resultType") == "input_required":
            message = "the tool asked for more input (MCP multi-round-trip): not a completed effect; its continuation is journaled on its own"
            return _with(verdict, State.REJECTED, "input_required", message)
        if result.get("isError") is True:
            return _with(verdict, State.REJECTED, "tool_error", f"the tool reported an error: {_tool_text(result)}")
        return verdict

    def answer(self, answer: Answer) -> Answer:
        problem = problem_of(answer) if self.has_id else None
        if problem is None:
            return super().answer(answer)
        return self._tool_error(problem.sentence(), answer)

    def _replayed(self, members: dict[str, Any]) -> dict[str, Any]:
        """A result stored from an older server gets the `resultType` this caller's protocol requires."""
        result = members.get("result")
        if self.result_type and isinstance(result, dict) and "resultType" not in result:
            return {**members, "result": {**result, "resultType": "complete"}}
        return members

    def _unreplayable(self, answer: Answer) -> Answer:
        receipt = receipt_headers(answer)
        op = next((v for k, v in receipt.items() if k.lower() == answers.RECEIPT_ID_HEADER.lower()), "?")
        text = f"This tool call already succeeded as receipt {op}, and its result cannot be replayed. Do not repeat it."
        return self._tool_error(text, answer)

    def _tool_error(self, text: str, answer: Answer) -> Answer:
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
        if self.result_type:
            result["resultType"] = "complete"
        return self._reply({"result": result}, answer)


def recognise(facts: "RequestFacts", route: "Route", policy: HostPolicy) -> Call | None:
    """A JSON-RPC call (MCP's included), REST for a forced one that is not JSON-RPC, or None: not JSON-RPC."""
    forced = route.protocol == NAME
    if facts.method == "DELETE" and not facts.body and _header(facts, SESSION_HEADER) is not None:
        return Call(protocol=MCP).passing("mcp session end")
    if facts.method != "POST" or not (forced or b'"jsonrpc"' in facts.body):
        return None
    message = json_document(facts.body)
    if isinstance(message, list) and message and all(_is_message(m) for m in message):
        calls = [_read(m, facts, route) for m in message]
        return calls[0] if all(not c.journal for c in calls) else REST  # a batch with a write: a plain body
    if not _is_message(message):
        return REST if forced else None
    return _read(message, facts, route)


def read_headers(body: Any) -> dict[str, str] | None:
    """What an MCP server asks of a request: both answer types accepted, and from 2026-07-28 on the headers
    that repeat the body's method, name and protocol version (the reconciler's reads are such requests)."""
    if not _is_message(body) or not isinstance(body.get("method"), str):
        return None
    headers = {"Accept": "application/json, text/event-stream"}
    params = body.get("params")
    version = _meta_version(params)
    if version is not None:
        headers["MCP-Protocol-Version"] = version
        headers["Mcp-Method"] = body["method"]
        name = params.get(NAME_BEARING.get(body["method"], ""))
        if isinstance(name, str) and name.isascii():
            headers["Mcp-Name"] = name
    return headers


def _is_message(m: Any) -> bool:
    if not isinstance(m, dict) or m.get("jsonrpc") != "2.0":
        return False
    return isinstance(m.get("method"), str) or ("id" in m and any(k in m for k in _RESPONSE_KEYS))


def _read(message: dict[str, Any], facts: "RequestFacts", route: "Route") -> Call:
    method = message.get("method")
    if not isinstance(method, str):
        return Call(protocol=NAME).passing("jsonrpc response")
    params = message.get("params")
    request_id, has_id = message.get("id"), "id" in message
    tool = params.get("name") if isinstance(params, dict) else None
    if method == TOOLS_CALL and isinstance(tool, str):
        version = _header(facts, PROTOCOL_VERSION_HEADER) or _meta_version(params)
        return McpToolCall(
            operation=MCP_OPERATION_PREFIX + tool,
            name=tool,
            method=method,
            request_id=request_id,
            has_id=has_id,
            tool=tool,
            result_type=version not in HANDSHAKE_VERSIONS,
            trace_context=_meta_trace_context(params),
        )
    if any(fnmatchcase(method, g) for g in MCP_READS):
        return Call(protocol=MCP).passing(f"mcp {method}")
    if any(fnmatchcase(method, g) for g in route.read_methods):
        return Call(protocol=NAME).passing("read_methods")
    return RpcCall(operation=OPERATION_PREFIX + method, name=method, method=method, request_id=request_id, has_id=has_id)


def _response(found: Any, request_id: Any) -> dict[str, Any] | None:
    """The response to `request_id` (or the last response) among the JSON-RPC messages found."""
    messages = found if isinstance(found, list) else [found]
    responses = [m for m in messages if isinstance(m, dict) and any(k in m for k in _RESPONSE_KEYS) and "method" not in m]
    if request_id is not None and len(responses) > 1:  # one answer to one POST is this call's, whatever its id
        responses = [m for m in responses if m.get("id") == request_id and type(m.get("id")) is type(request_id)]
    return responses[-1] if responses else None


def _with(verdict: Verdict, state: State, error_code: str, message: str) -> Verdict:
    return Verdict(state, {**verdict.updates, "error_code": error_code, "error_message": message}, dict(verdict.detail))


def _tool_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    texts = [str(c["text"]) for c in blocks if isinstance(c, dict) and isinstance(c.get("text"), str)]
    return " ".join(texts)[:300] or "(no text)"


def _meta_version(params: Any) -> str | None:
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


def _meta_trace_context(params: Any) -> tuple[tuple[str, str], ...]:
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        return ()
    return tuple((k, v) for k in ("traceparent", "tracestate") if isinstance(v := meta.get(k), str))


def _header(facts: "RequestFacts", name: str) -> str | None:
    return next((v for k, v in facts.headers if k.lower() == name), None)
