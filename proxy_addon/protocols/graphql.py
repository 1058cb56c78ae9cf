"""GraphQL over HTTP: queries and subscriptions are reads, mutations are writes.

A POST to a path ending in `/graphql` (or under `protocol: graphql`) whose JSON body has a `query` string is
parsed with graphql-core, never matched with regular expressions. The operation it selects (`operationName`,
or the only one) decides: `query` and `subscription` pass through, `mutation` is journaled. A mutation's
identity is the document printed in canonical form (layout and comments do not matter, nor the order of what
GraphQL leaves unordered: arguments, input fields, variable definitions), the selected operation's name and
the redacted `variables`; its name is `graphql <operation name, or its first field>`. Argument literals
written into the document under a secret name are redacted like body fields, and count for the identity like
them, through a keyed digest of the document that holds them. A body that does not parse is
journaled as a plain body (REST). A batch (a JSON array of operations) passes when every one is a read and is
journaled as a plain body otherwise.

The proxy's own problems are GraphQL errors: the contract's status with
`{"errors": [{"message", "extensions": {"code", "operation_id", "state", "receipt_url"}}]}`. Replays are the stored answer.
A 2xx answer with `errors` and no data (`data` absent: refused before execution, as the GraphQL spec has it;
null, or every mutation field null: the mutation's resolver failed) is `rejected`: the server says the
mutation did not happen, and a retry goes upstream. With data, it is `succeeded`.
"""

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from graphql import GraphQLError, parse, print_ast
from graphql.language import (
    ArgumentNode,
    DocumentNode,
    FieldNode,
    ObjectFieldNode,
    OperationDefinitionNode,
    OperationType,
    StringValueNode,
    Visitor,
    visit,
)

from proxy_addon.protocols.base import Call, decoded_body, json_document, problem_of, receipt_headers
from proxy_addon.protocols.rest import REST
from proxy_addon.rules import answers
from proxy_addon.rules.answers import Answer
from proxy_addon.rules.fingerprint import BodyIdentity, canonical_json, process_keyed
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import Verdict
from proxy_addon.rules.redaction import REDACTED, is_secret_field
from proxy_addon.rules.send_result import SendResult
from proxy_addon.rules.states import State

if TYPE_CHECKING:
    from proxy_addon.protocols.base import Route
    from proxy_addon.protocols.facts import RequestFacts

NAME = "graphql"
OPERATION_PREFIX = "graphql "
MAX_TOKENS = 50_000  # graphql-core's parser bound: a larger document is journaled as a plain body
RESPONSE_CONTENT_TYPE = "application/graphql-response+json"


@dataclass(frozen=True)
class GraphQLCall(Call):
    """A GraphQL mutation (or, passing, a query)."""

    protocol: str = NAME
    document: str = ""  # canonical, secret literals redacted
    operation_name: str | None = None
    redacted_query: str | None = None  # the document as stored, when a literal was redacted
    # the canonical document with its secret literals, when it has some: never stored nor shown, only its keyed
    # digest counts for the identity (the same mutation with another password is another intent)
    secret_document: str | None = field(default=None, repr=False)
    graphql_response: bool = False  # the client accepts application/graphql-response+json

    def identity(self, body: BodyIdentity, rule: OperationRule | None) -> BodyIdentity:
        if (rule is not None and rule.fingerprint is not None) or body.kind != "json" or not isinstance(body.identity, dict):
            return body  # the rule's allowlist stays in charge; a body that is not JSON is identified by its bytes
        identity = {"document": self.document, "operationName": self.operation_name, "variables": body.identity.get("variables")}
        if self.secret_document is not None:
            identity["literals"] = (body.keyed or process_keyed)(self.secret_document.encode())
        stored = body.stored
        if self.redacted_query is not None and isinstance(body.document, dict):
            stored = canonical_json({**body.document, "query": self.redacted_query}).encode()
        return replace(body, kind=NAME, identity=identity, stored=stored)

    def verdict(self, verdict: Verdict, result: SendResult) -> Verdict:
        if verdict.state != State.SUCCEEDED or result.answer is None:
            return verdict
        content = decoded_body(result.answer.headers, result.answer.content)
        document = json_document(content) if content is not None else None
        if isinstance(document, dict) and document.get("errors") and _no_data(document.get("data")):
            message = f"GraphQL errors and no data: {_first_message(document)}"
            return Verdict(State.REJECTED, {**verdict.updates, "error_code": "graphql_errors", "error_message": message})
        return verdict

    def answer(self, answer: Answer) -> Answer:
        problem = problem_of(answer)
        if problem is None:
            return answer
        extensions = {"code": problem.kind, "operation_id": problem.operation_id, "state": problem.state, "approval_id": problem.approval_id,
                      "receipt_url": problem.receipt_url}
        error = {"message": problem.sentence(), "extensions": {k: v for k, v in extensions.items() if v is not None}}
        content_type = RESPONSE_CONTENT_TYPE if self.graphql_response else "application/json"
        body = json.dumps({"errors": [error]}).encode()
        headers = {"Content-Type": content_type, "Cache-Control": "no-store", **receipt_headers(answer)}
        return answers.answer(problem.status, body, headers)


def recognise(facts: "RequestFacts", route: "Route", policy: HostPolicy) -> Call | None:
    """A GraphQL call, REST for a GraphQL request that does not parse, or None: not GraphQL."""
    forced = route.protocol == NAME
    if facts.method != "POST" or not (forced or facts.path.rstrip("/").endswith("/graphql")):
        return None
    document = json_document(facts.body)
    if isinstance(document, list) and document and all(_is_request(d) for d in document):
        calls = [_read(d, facts, policy) for d in document]
        return calls[0].passing("graphql queries") if all(not c.journal for c in calls) else REST
    if not _is_request(document):
        return REST if forced else None
    return _read(document, facts, policy)


def read_headers(body: Any) -> dict[str, str] | None:
    """A reconcile read that is a GraphQL query accepts GraphQL's answers."""
    return {"Accept": f"{RESPONSE_CONTENT_TYPE}, application/json"} if _is_request(body) else None


def _is_request(document: Any) -> bool:
    return isinstance(document, dict) and isinstance(document.get("query"), str)


def _read(request: dict[str, Any], facts: "RequestFacts", policy: HostPolicy) -> Call:
    operation_name = request.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        return REST
    try:
        ast = parse(request["query"], no_location=True, max_tokens=MAX_TOKENS)
    except (GraphQLError, RecursionError):
        return REST  # does not parse: a plain body
    operation = _selected(ast, operation_name)
    if operation is None:
        return REST  # no operation to run: the server refuses it; journaled as a plain body
    if operation.operation != OperationType.MUTATION:
        return Call(protocol=NAME).passing(f"graphql {operation.operation.value}")
    name = operation.name.value if operation.name else _first_field(operation)
    redacted = _redact_literals(ast, policy.redact_fields)
    accept = next((v for k, v in facts.headers if k.lower() == "accept"), "")
    return GraphQLCall(
        operation=OPERATION_PREFIX + name,
        name=name,
        document=print_ast(visit(redacted, _Canonical())),
        operation_name=operation.name.value if operation.name else None,  # as selected: given or implied, the same
        redacted_query=print_ast(redacted) if redacted is not ast else None,
        secret_document=print_ast(visit(ast, _Canonical())) if redacted is not ast else None,
        graphql_response=RESPONSE_CONTENT_TYPE in accept.lower(),
    )


def _selected(ast: DocumentNode, operation_name: str | None) -> OperationDefinitionNode | None:
    operations = [d for d in ast.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is None:
        return operations[0] if len(operations) == 1 else None
    return next((o for o in operations if o.name is not None and o.name.value == operation_name), None)


def _first_field(operation: OperationDefinitionNode) -> str:
    field = next((s for s in operation.selection_set.selections if isinstance(s, FieldNode)), None)
    return field.name.value if field is not None else "anonymous"


class _Canonical(Visitor):
    """What GraphQL leaves unordered is put in order: arguments, input object fields, variable definitions
    (selections keep theirs: they order the answer)."""

    def leave_field(self, node: FieldNode, *_args: Any) -> Any:
        return _sorted(node, "arguments")

    def leave_directive(self, node: Any, *_args: Any) -> Any:
        return _sorted(node, "arguments")

    def leave_object_value(self, node: Any, *_args: Any) -> Any:
        return _sorted(node, "fields")

    def leave_operation_definition(self, node: OperationDefinitionNode, *_args: Any) -> Any:
        if not node.variable_definitions:
            return None
        ordered = tuple(sorted(node.variable_definitions, key=lambda d: d.variable.name.value))
        return copy_node(node, variable_definitions=ordered)


def _sorted(node: Any, attribute: str) -> Any:
    items = getattr(node, attribute)
    if not items or len(items) < 2:
        return None
    return copy_node(node, **{attribute: tuple(sorted(items, key=lambda a: a.name.value))})


def copy_node(node: Any, **changes: Any) -> Any:
    """A copy of an AST node with some of its attributes changed."""
    return type(node)(**{**{k: getattr(node, k) for k in node.keys}, **changes})


class _RedactLiterals(Visitor):
    """Argument and input-object field literals under a secret name become the redaction marker."""

    def __init__(self, redact_fields: frozenset[str]):
        super().__init__()
        self.redact_fields = redact_fields
        self.changed = False

    def _redacted(self, node: ArgumentNode | ObjectFieldNode) -> Any:
        if is_secret_field(node.name.value, self.redact_fields) and node.value.kind != "variable":
            self.changed = True
            return copy_node(node, value=StringValueNode(value=REDACTED))
        return None

    def enter_argument(self, node: ArgumentNode, *_args: Any) -> Any:
        return self._redacted(node)

    def enter_object_field(self, node: ObjectFieldNode, *_args: Any) -> Any:
        return self._redacted(node)


def _redact_literals(ast: DocumentNode, redact_fields: frozenset[str]) -> DocumentNode:
    visitor = _RedactLiterals(redact_fields)
    redacted = visit(ast, visitor)
    return redacted if visitor.changed else ast


def _no_data(data: Any) -> bool:
    return data is None or (isinstance(data, dict) and all(v is None for v in data.values()))


def _first_message(document: dict[str, Any]) -> str:
    errors = document.get("errors")
    first = errors[0] if isinstance(errors, list) and errors else None
    return str(first.get("message") if isinstance(first, dict) else first)[:300]
