"""What is journaled, and what passes through (CONTRACT.md, "What is journaled, and what passes through").

Two steps, so that pass-through traffic streams from its first byte:
1. `route`, from the request's head alone: its method is not in `proxy.methods`, its host says
   `journal: false` (or is a model API), or the operation rule for its route says `journal: false`: it
   passes. Otherwise it may be a write, and its body is read whole.
2. `recognise`, from the body: each protocol module in PROTOCOLS is asked in turn (under `protocol: auto`,
   or the one the host or rule forces; `rest` asks none). Its `Call` says read or write, and how a write is
   identified, named and answered. A rule naming that very call (`call: <tool or operation>`) may still
   say `journal: false`.

Rules: the route's rule is the first whose method and path template match and that names no `call`; a
protocol call's rule is the first that names it (a glob), else the route's. Pure; no mitmproxy.
"""

from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

from proxy_addon.config import ReceiptsConfig
from proxy_addon.protocols import aws, graphql, jsonrpc
from proxy_addon.protocols.base import Call, Route
from proxy_addon.protocols.rest import REST
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy, Query, match_rule

if TYPE_CHECKING:
    from proxy_addon.protocols.facts import RequestFacts


class ProtocolModule(Protocol):
    NAME: str
    OPERATION_PREFIX: str

    def recognise(self, facts: "RequestFacts", route: "Route", policy: HostPolicy) -> Call | None: ...

    def read_headers(self, body: Any) -> dict[str, str] | None: ...



PROTOCOLS: tuple[ProtocolModule, ...] = (graphql, jsonrpc, aws)  # the modules, asked in this order
# operation-name prefixes -> the call's name, for rules matched again later (the reconciler)
_PREFIXES = (jsonrpc.MCP_OPERATION_PREFIX, graphql.OPERATION_PREFIX, jsonrpc.OPERATION_PREFIX)


def route(config: ReceiptsConfig, method: str, host: str, port: int, path: str) -> Route:
    method = method.upper()
    if method not in config.proxy.methods:
        return Route(False, "method")
    policy = config.policy_for(host, port)
    if not policy.journal:
        return Route(False, "model_api" if policy.model_api else "host")
    bare, _, query = path.partition("?")
    rule = _route_rule(policy, method, bare or "/", parse_qsl(query, keep_blank_values=True))
    if rule is not None and not rule.journal:
        return Route(False, "rule")
    if rule is None:
        return Route(True, protocol=policy.protocol)
    return Route(True, protocol=rule.protocol or policy.protocol, read_methods=tuple(rule.read_methods))


def recognise(facts: "RequestFacts", config: ReceiptsConfig) -> Call:
    """The request as its protocol reads it (REST when none claims it)."""
    where = route(config, facts.method, facts.host, facts.port, facts.path)
    if not where.journal:
        return REST.passing(where.passes or "route")
    policy = config.policy_for(facts.host, facts.port)
    call: Call = REST
    if where.protocol != "rest":
        for protocol in PROTOCOLS:
            if where.protocol in ("auto", protocol.NAME):
                found = protocol.recognise(facts, where, policy)
                if found is not None:
                    call = found
                    break
    if call.journal and call.name is not None:
        matched = match_rule(policy, facts.method, facts.path, call.name, facts.query)
        if matched is not None and matched[0].call is not None and not matched[0].journal:
            call = call.passing("rule")
    return call


def receipt_rule(
    policy: HostPolicy, method: str, path: str, operation: str, query: str | None = None
) -> tuple[OperationRule, dict[str, str]] | None:
    """The rule a journaled receipt was matched by, found again from its operation name: the protocol's call in it
    (`mcp tools/call create_ticket`), else a rule naming a call by that name (an AWS call, whose operation name is
    its rule's), else its route's."""
    name = call_name(operation)
    if name is None:
        for rule in policy.operations:
            if rule.name == operation and rule.call is not None and rule.method == method:
                m = rule.path_regex.match(path)
                if m is not None:
                    return rule, m.groupdict()
    return match_rule(policy, method, path, name, parse_qsl(query or "", keep_blank_values=True))


def read_headers(body: Any) -> dict[str, str]:
    """The headers a reconcile read sent as a POST with this JSON body needs in its protocol (none for REST)."""
    for protocol in PROTOCOLS:
        headers = protocol.read_headers(body)
        if headers is not None:
            return headers
    return {}


def call_name(operation: str) -> str | None:
    """The call's name in a receipt's operation name (`mcp tools/call create_ticket` -> `create_ticket`)."""
    return next((operation.removeprefix(p) for p in _PREFIXES if operation.startswith(p)), None)


def _route_rule(policy: HostPolicy, method: str, path: str, query: Query) -> OperationRule | None:
    for rule in policy.operations:
        if rule.call is None and rule.method == method and rule.path_regex.match(path) and rule.matches_query(query):
            return rule
    return None
