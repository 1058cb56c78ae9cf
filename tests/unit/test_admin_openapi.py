"""The OpenAPI document is built from the admin app's routes and the view models: it is valid OpenAPI 3.1, it
documents exactly the API routes the app serves, every answer it documents is one a real server really gives
(with the documented media type and shape), and its schemas are the view models'."""

import dataclasses
import json
from typing import Any

import httpx
import jsonschema
import pytest
from flask import Flask
from openapi_spec_validator import validate as validate_spec
from pydantic import BaseModel

from proxy_addon.admin.app import create_app
from proxy_addon.admin.openapi import SCHEMA_NAMES, Components, openapi_document, openapi_path
from proxy_addon.admin.routing import Operation, Param, Routes, declared_routes, install, json_reply
from proxy_addon.admin.server import AdminServer
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import ApprovalNeededError
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.views.documents import ShowView, show_document
from proxy_addon.views.review import ProofView, proof
from tests.conftest import migrate
from tests.support.store import intent, recorded, walk

TOKEN_ENV = "RECEIPTS_OPENAPI_TEST_TOKEN"
TOKEN = "openapi-test-token-0123456789"
# every (path, method, status) the hand-written document had before it was generated: none may go missing
DOCUMENTED_BEFORE = {
    ("/receipts", "get", "200"), ("/receipts", "get", "400"), ("/receipts", "get", "401"),
    ("/receipts/{operation_id}", "get", "200"), ("/receipts/{operation_id}", "get", "401"),
    ("/receipts/{operation_id}", "get", "404"),
    ("/receipts/{operation_id}/proof", "get", "200"), ("/receipts/{operation_id}/proof", "get", "401"),
    ("/receipts/{operation_id}/proof", "get", "404"),
    *(("/receipts/{operation_id}/resolve", "post", s) for s in ("200", "400", "401", "404", "409", "415", "422")),
    ("/metrics", "get", "200"), ("/metrics", "get", "401"),
    ("/openapi.json", "get", "200"), ("/openapi.json", "get", "401"),
    # approvals
    ("/approvals", "get", "200"), ("/approvals", "get", "400"), ("/approvals", "get", "401"),
    ("/approvals/{approval_id}", "get", "200"), ("/approvals/{approval_id}", "get", "401"),
    ("/approvals/{approval_id}", "get", "404"),
    *((f"/approvals/{{approval_id}}/{d}", "post", s) for d in ("approve", "deny")
      for s in ("200", "400", "401", "404", "409", "415")),
}
COMPONENTS_BEFORE = {"State", "BodyView", "RequestView", "ResponseView", "Receipt", "Transition", "ReceiptWithHistory",
                     "RetryDecision", "Proof", "Resolution", "Problem", "Approval", "ApprovalState", "Decision"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('openapi') / 'receipts.db'}"
    migrate(url)
    engine = make_engine(url)
    yield ReceiptStore(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return parse_config(f"secret_file: {tmp_path_factory.mktemp('secret') / 's'}\n"
                        f"admin: {{listen_port: 0, token_env: {TOKEN_ENV}}}")


@pytest.fixture(scope="module")
def app(config, store):
    return create_app(config, store)


@pytest.fixture(scope="module")
def document(app):
    return openapi_document(app)


@pytest.fixture(scope="module")
def servers(config, store):
    """A real server without a token, and one with a token."""
    open_server = AdminServer(config, store).start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TOKEN_ENV, TOKEN)
        guarded = AdminServer(config, store).start()
    try:
        with httpx.Client(base_url=open_server.url, timeout=10, trust_env=False) as plain, \
                httpx.Client(base_url=guarded.url, timeout=10, trust_env=False) as tokenless:
            yield plain, tokenless
    finally:
        open_server.stop()
        guarded.stop()


def made(store, target: State, **updates) -> str:
    rec = recorded(store, dataclasses.replace(intent()))
    walk(store, rec.operation_id, target, **updates)
    return rec.operation_id


def triples(document) -> set[tuple[str, str, str]]:
    return {(path, method, status) for path, item in document["paths"].items()
            for method, op in item.items() for status in op["responses"]}


def test_the_document_is_valid_openapi_3_1(document):
    validate_spec(document)
    assert document["openapi"] == "3.1.0"
    assert json.loads(json.dumps(document)) == document  # plain JSON: what /openapi.json serves


def test_it_documents_exactly_the_api_routes_the_app_serves(app, document):
    routes = declared_routes(app)
    undeclared = {r.rule for r in app.url_map.iter_rules() if r.endpoint != "static" and r.endpoint not in routes}
    assert not undeclared, "a route added without its declaration (admin/routing.py)"
    served = {(openapi_path(r), m.lower()) for r in app.url_map.iter_rules() if r.endpoint in routes
              and routes[r.endpoint].operation is not None for m in r.methods - {"HEAD", "OPTIONS"}}
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert served == documented
    pages = {r.rule for r in app.url_map.iter_rules() if r.endpoint in routes and routes[r.endpoint].operation is None}
    assert pages == {"/", "/ui/receipts/<operation_id>", "/ui/receipts/<operation_id>/resolve", "/login", "/logout",
                     "/ui/approvals", "/ui/approvals/<approval_id>/decide"}


def pending_approval(store) -> str:
    try:
        store.receipts.record_and_submit(intent(), None, "test", ApprovalAsk(expires=3600))
    except ApprovalNeededError as e:
        return e.approval.approval_id
    raise AssertionError("a write that needs approval was recorded")


def _approval_request(servers, store, path: str, method: str, status: str) -> httpx.Response:
    plain, tokenless = servers
    approval_id = pending_approval(store)
    if status == "409":
        store.approvals.decide(approval_id, "deny", "decided first", "test")
    url = path.replace("{approval_id}", "ap_nope" if status == "404" else approval_id)
    if status == "401":
        return tokenless.request(method, url, json={"note": "x"} if method == "post" else None)
    if method == "get":
        return plain.get(url, params={"state": "finished"} if status == "400" else None)
    bodies: dict[str, Any] = {
        "200": {"json": {"note": "checked", "who": "ana"}},
        "400": {"json": ["not", "an", "object"]},
        "404": {"json": {"note": "x"}},
        "409": {"json": {"note": "x"}},
        "415": {"content": "note=x", "headers": {"Content-Type": "text/plain"}},
    }
    return plain.post(url, **bodies[status])


def _request(servers, store, path: str, method: str, status: str) -> httpx.Response:
    """A real request that gets `status` from `method path`."""
    if path.startswith("/approvals"):
        return _approval_request(servers, store, path, method, status)
    plain, tokenless = servers
    op = made(store, State.SUCCEEDED if status == "409" else State.MANUAL_REVIEW, status_code=201)
    url = path.replace("{operation_id}", "op_nope" if status == "404" else op)
    if status == "401":
        return tokenless.request(method, url, json={"state": "succeeded", "note": "x"} if method == "post" else None)
    if method == "get":
        return plain.get(url, params={"state": "finished"} if status == "400" else None)
    bodies: dict[str, Any] = {
        "200": {"json": {"state": "succeeded", "note": "found it", "external_id": "A-1"}},
        "400": {"json": ["not", "an", "object"]},
        "404": {"json": {"state": "succeeded", "note": "x"}},
        "409": {"json": {"state": "safe_to_retry", "note": "x"}},
        "415": {"content": "state=succeeded", "headers": {"Content-Type": "text/plain"}},
        "422": {"json": {"state": "rejected", "note": "x"}},
    }
    return plain.post(url, **bodies[status])


@pytest.mark.parametrize("path, method, status", sorted(DOCUMENTED_BEFORE))
def test_every_documented_answer_is_really_given(servers, store, document, path, method, status):
    r = _request(servers, store, path, method, status)
    assert str(r.status_code) == status, r.text
    documented = document["paths"][path][method]["responses"][status]
    [(media_type, content)] = documented["content"].items()
    assert r.headers["content-type"].split(";")[0] == media_type
    if media_type.endswith("json"):
        schema = {**content["schema"], "components": document["components"]}
        jsonschema.Draft202012Validator(schema).validate(r.json())


def test_the_answers_documented_are_the_ones_tested(document):
    assert triples(document) == DOCUMENTED_BEFORE  # a new answer needs its request above


def test_schemas_are_the_view_models_under_the_names_clients_know(document):
    schemas = document["components"]["schemas"]
    assert set(schemas) == COMPONENTS_BEFORE
    assert not set(SCHEMA_NAMES) & set(schemas)  # only the public names

    def walk_refs(node: Any):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for k, v in node.items():
                if k == "title":
                    assert not isinstance(v, str), "pydantic's titles are left out"
                yield from walk_refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk_refs(v)

    refs = set(walk_refs({"paths": document["paths"], "components": document["components"]}))
    assert refs == {f"#/components/schemas/{n}" for n in COMPONENTS_BEFORE}  # every schema used, every ref resolves
    assert schemas["Receipt"]["additionalProperties"] is False
    assert schemas["Resolution"]["required"] == ["state", "note"]
    assert schemas["Resolution"]["properties"]["state"]["enum"] == ["safe_to_retry", "succeeded"]
    assert schemas["State"]["enum"] == [s.value for s in State]


def test_the_models_name_exactly_the_documents_keys(store, config):
    op = made(store, State.MANUAL_REVIEW)
    receipt, history = store.receipts.get(op), store.receipts.history(op)
    assert list(show_document(receipt, history)) == list(ShowView.model_fields)
    assert list(proof(store, config, op)) == list(ProofView.model_fields)


def test_paths_parameters_and_bodies_come_from_the_declarations():
    class Thing(BaseModel):
        name: str

    routes = Routes()

    @routes.api("POST", "/things/<int:thing_id>", Operation(
        "makeThing", "Make a thing",
        parameters=(Param("thing_id", "path", {"type": "integer"}, "its number"),
                    Param("kind", "query", {"type": "array"}, style="form", explode=False)),
        body=Thing,
        responses={201: json_reply(list[Thing], "made")},
    ))
    def make_thing(thing_id: int) -> str:
        return ""

    @routes.page("/things")
    def things() -> str:
        return ""

    app = Flask("t")
    install(app, routes)
    doc = openapi_document(app)
    assert list(doc["paths"]) == ["/things/{thing_id}"]
    op = doc["paths"]["/things/{thing_id}"]["post"]
    assert op["parameters"] == [
        {"name": "thing_id", "in": "path", "description": "its number", "required": True, "schema": {"type": "integer"}},
        {"name": "kind", "in": "query", "schema": {"type": "array"}, "style": "form", "explode": False},
    ]
    assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Thing"}
    assert op["responses"]["201"]["content"]["application/json"]["schema"] == {
        "type": "array", "items": {"$ref": "#/components/schemas/Thing"}}
    assert list(op["responses"]) == ["201", "401"]  # the guards' answer is every operation's
    assert doc["components"]["schemas"]["Thing"] == {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    validate_spec(doc)


def test_a_path_parameter_must_be_declared():
    routes = Routes()

    @routes.api("GET", "/things/<thing_id>", Operation("getThing", "A thing", responses={}))
    def thing(thing_id: str) -> str:
        return ""

    app = Flask("t")
    install(app, routes)
    with pytest.raises(ValueError, match="thing_id"):
        openapi_document(app)


def test_two_models_of_one_name_are_refused():
    def model(field: type) -> type[BaseModel]:
        class Same(BaseModel):
            value: field  # type: ignore[valid-type]

        return Same

    components = Components()
    components.schema_of(model(int), "serialization")
    components.schema_of(model(int), "serialization")  # the same schema again is fine
    with pytest.raises(ValueError, match="Same"):
        components.schema_of(model(str), "serialization")
    assert components.schema_of({"type": "object"}, "serialization") == {"type": "object"}


@pytest.mark.parametrize("rule, path", [
    ("/receipts", "/receipts"),
    ("/receipts/<operation_id>/proof", "/receipts/{operation_id}/proof"),
    ("/a/<int:n>/<path:rest>", "/a/{n}/{rest}"),
])
def test_openapi_paths(rule, path):
    app = Flask("t")
    app.add_url_rule(rule, endpoint="x", view_func=lambda **_: "")
    [r] = [r for r in app.url_map.iter_rules() if r.endpoint == "x"]
    assert openapi_path(r) == path
