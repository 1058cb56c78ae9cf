"""Choosing each write's read rule (suggest/suggest.py) and printing them (suggest/render.py): a table of small
documents, one way of reading back (or none) each, with the rule it gives; every rule loads as config.yaml's do."""

from typing import Any

import pytest
import yaml

from proxy_addon.config import parse_config
from proxy_addon.rules.operations import OperationRule
from proxy_addon.suggest.openapi import read_api
from proxy_addon.suggest.render import counts, render
from proxy_addon.suggest.suggest import Suggestion, suggest
from proxy_addon.suggest.urls import Target, token_label

TARGET = Target("api.example.com", "/v1")
CREATED = {"type": "string", "format": "date-time"}


def obj(*required: str, **fields: Any) -> dict:
    props = {name: {"type": kind} if isinstance(kind, str) else kind for name, kind in fields.items()}
    return {"type": "object", "required": list(required), "properties": props}


THING = obj("id", id="string", title="string", body="string", created_at=CREATED)
ISSUE = obj("number", id="integer", number="integer", title="string")


def body(schema: dict, media: str = "application/json") -> dict:
    return {"required": True, "content": {media: {"schema": schema}}}


def answer(schema: dict | None, status: str = "200") -> dict:
    if schema is None:
        return {status: {"description": ""}}
    return {status: {"description": "", "content": {"application/json": {"schema": schema}}}}


def q(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "schema": schema or {"type": "string"}}


def p(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def listing(item: dict, *params: dict) -> dict:
    return {"get": {"parameters": list(params), "responses": answer({"type": "array", "items": item})}}


def item_get(item: dict, name: str = "thing_id") -> dict:
    return {"get": {"parameters": [p(name)], "responses": answer(item)}}


def document(paths: dict, **top: Any) -> dict:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths, **top}


def suggestion(paths: dict, operation_id: str, target: Target = TARGET, **top: Any) -> Suggestion:
    api = read_api(document(paths, **top))
    found = {s.write.operation_id: s for s in suggest(api, target)}
    return found[operation_id]


def post(op_id: str, request: dict | None, response: dict, status: str = "201") -> dict:
    op: dict = {"operationId": op_id, "responses": answer(response, status)}
    if request is not None:
        op["requestBody"] = body(request)
    return op


SORTED = [
    q("title"),
    q("sort", {"type": "string", "enum": ["created", "updated"]}),
    q("direction", {"type": "string", "enum": ["asc", "desc"]}),
    q("per_page", {"type": "integer", "maximum": 100}),
]
NEW_THING = obj("title", title="string", body="string")

# id, the document's paths, the write, strategy, the read rule's expected keys (a subset), note (a part of it)
CASES: list[tuple[str, dict, str, str | None, dict, str]] = [
    ("create: search of its list, filtered, newest first",
     {"/things": {**listing(THING, *SORTED), "post": post("create", NEW_THING, THING)}}, "create", "search",
     {"url": "{scheme}://{netloc}/v1/things?title={body.title}&sort=created&direction=desc&per_page=100",
      "match": {"$.title": "$.title", "$.body": "$.body"}, "match_when_missing": "skip", "id": "$.id",
      "time_field": "$.created_at"}, ""),
    ("create: a since parameter filters to what came after the submission",
     {"/things": {**listing(THING, q("since", CREATED)), "post": post("create", NEW_THING, THING)}}, "create", "search",
     {"url": "{scheme}://{netloc}/v1/things?since={submitted_at}", "match": {"$.title": "$.title", "$.body": "$.body"}}, ""),
    ("create: a list in no known order has no time_field",
     {"/things": {**listing(THING), "post": post("create", NEW_THING, THING)}}, "create", "search",
     {"url": "{scheme}://{netloc}/v1/things", "id": "$.id", "time_field": None}, "absence is only as good as the first page"),
    ("create: a list wrapped in an object",
     {"/things": {"get": {"responses": answer(obj(data={"type": "array", "items": THING}, has_more="boolean"))},
                  "post": post("create", NEW_THING, THING)}}, "create", "search", {"items": "$.data"}, ""),
    ("create: a client-chosen id is looked up",
     {"/things": {**listing(THING), "post": post("create", obj("id", "title", id="string", title="string"), THING)},
      "/things/{thing_id}": item_get(THING)}, "create", "lookup",
     {"url": "{scheme}://{netloc}/v1/things/{body.id}", "match": {"$.title": "$.title"}, "id": "$.id"}, ""),
    ("create: an optional id, and a list: search",
     {"/things": {**listing(THING), "post": post("create", obj("title", id="string", title="string"), THING)},
      "/things/{thing_id}": item_get(THING)}, "create", "search",
     {"match": {"$.id": "$.id", "$.title": "$.title"}, "match_when_missing": "skip"}, ""),
    ("create: the item path names the answer's id (issue_number: number)",
     {"/issues": {**listing(ISSUE, *SORTED), "post": post("create", obj("title", title="string"), ISSUE)},
      "/issues/{issue_number}": item_get(ISSUE, "issue_number")}, "create", "search", {"id": "$.number"}, ""),
    ("create: no list and a server's id: none",
     {"/things": {"post": post("create", NEW_THING, THING)}, "/things/{thing_id}": item_get(THING)}, "create", None, {},
     "no GET at its path lists what it creates, and its id is known only from its answer"),
    ("create: an answer without an id: none",
     {"/things": {**listing(THING), "post": post("create", NEW_THING, obj(ok="boolean"))}}, "create", None, {},
     "its answer (201) has no id field"),
    ("create: an answer of 204: none",
     {"/things": {**listing(THING), "post": post("create", NEW_THING, None, "204")}}, "create", None, {},
     "its answer (204) has no id field"),
    ("create: a form body, read as the reconciler reads one",
     {"/things": {**listing(THING), "post": {**post("create", None, THING),
                                              "requestBody": body(NEW_THING, "application/x-www-form-urlencoded")}}},
     "create", "search", {"match": {"$.title": "$.title", "$.body": "$.body"}}, ""),
    ("create: a multipart body: none",
     {"/things": {**listing(THING), "post": {**post("create", None, THING),
                                              "requestBody": body(NEW_THING, "multipart/form-data")}}},
     "create", None, {}, "its body is multipart/form-data: neither JSON nor a form"),
    ("create: the list shows no field the write sets: none",
     {"/things": {**listing(obj(id="string")), "post": post("create", NEW_THING, THING)}}, "create", None, {},
     "show none of the fields it sets"),
    ("create: a field no request sends (readOnly), a secret: not matched",
     {"/things": {**listing(obj(id="string", title="string", created_at="string", password="string")),
                  "post": post("create", obj("title", title="string", password="string",
                                             created_at={"type": "string", "readOnly": True}), THING)}},
     "create", "search", {"match": {"$.title": "$.title"}, "match_when_missing": None}, ""),
    ("create: a list paged by the last item's id (Stripe's)",
     {"/things": {"get": {"parameters": [q("starting_after"), q("limit", {"type": "integer", "maximum": 100})],
                          "responses": answer(obj(data={"type": "array", "items": THING}, has_more="boolean"))},
                  "post": post("create", NEW_THING, THING)}}, "create", "search",
     {"url": "{scheme}://{netloc}/v1/things?limit=100", "items": "$.data",
      "cursor": {"value": "$.data[-1].id", "into": "query:starting_after", "more": "$.has_more"}}, ""),
    ("delete: its target read back, absence is done",
     {"/things/{thing_id}": {**item_get(THING), "delete": {"operationId": "remove", "responses": answer(None, "204")}}},
     "remove", "lookup", {"url": "{scheme}://{netloc}/v1/things/{path.thing_id}", "absent_means": "succeeded"},
     "its read carries no credentials: a 404 for what it may not see reads as done"),
    ("delete: its GET may answer a deleted item: none",
     {"/things/{thing_id}": {"get": {"parameters": [p("thing_id")],
                                     "responses": answer({"anyOf": [THING, obj(id="string", deleted="boolean")]})},
                             "delete": {"operationId": "remove", "responses": answer(None, "204")}}},
     "remove", None, {}, "may answer a deleted item (deleted: true)"),
    ("delete: nothing reads its target: none",
     {"/things/{thing_id}": {"delete": {"operationId": "remove", "responses": answer(None, "204")}}}, "remove", None, {},
     "no GET at its path reads the target"),
    ("delete: the path lists, which an empty list answers too: none",
     {"/things": {**listing(THING), "delete": {"operationId": "clear", "responses": answer(None, "204")}}}, "clear", None,
     {}, "its GET answers a list"),
    ("put without a body: the relation its path names",
     {"/stars/{owner}/{repo}": {"get": {"responses": answer(None, "204")},
                                "put": {"operationId": "star", "responses": answer(None, "204")}}}, "star", "lookup",
     {"url": "{scheme}://{netloc}/v1/stars/{path.owner}/{path.repo}", "match": None, "absent_means": None}, ""),
    ("put: the fields it requires, compared",
     {"/things/{thing_id}": {**item_get(THING), "put": {"operationId": "replace", "requestBody": body(NEW_THING),
                                                        "responses": answer(THING)}}}, "replace", "lookup",
     {"url": "{scheme}://{netloc}/v1/things/{path.thing_id}", "match": {"$.title": "$.title", "$.body": "$.body"},
      "match_when_missing": "skip", "id": "$.id"}, ""),
    ("patch: the fields it may set, those it sets compared; the others named",
     {"/things/{thing_id}": {**item_get(THING), "patch": {"operationId": "edit", "requestBody": body(obj(title="string", tags={"type": "array"})),
                                                          "responses": answer(THING)}}}, "edit", "lookup",
     {"match": {"$.title": "$.title"}, "match_when_missing": "skip"},
     "does not compare tags: a write is taken as done once the fields it set among the matched ones match"),
    ("patch of fields the item does not show: none",
     {"/things/{thing_id}": {**item_get(THING), "patch": {"operationId": "edit", "requestBody": body(obj(colour="string")),
                                                          "responses": answer(THING)}}}, "edit", None, {},
     "it sets no field that paths./things/{thing_id}.get shows"),
    ("a bodiless post to an item: none",
     {"/things/{thing_id}": {**item_get(THING), "post": {"operationId": "touch", "responses": answer(THING)}}}, "touch",
     None, {}, "a bodiless POST"),
    ("put: no GET at its path: none",
     {"/things/{thing_id}/lock": {"put": {"operationId": "lock", "responses": answer(None, "204")}}}, "lock", None, {},
     "no GET at its path reads it back"),
    ("the same path shape under other names is another resource",
     {"/a/{digest}": item_get(THING, "digest"), "/a/{thing_id}": {"delete": {"operationId": "remove", "responses": {}}}},
     "remove", None, {}, "no GET at its path reads the target"),
    ("an envelope: the fields inside data",
     {"/tasks": {"get": {"responses": answer(obj(data={"type": "array", "items": obj(gid="string", name="string")}))},
                 "post": post("create", obj("data", data=obj("name", name="string")),
                              obj(data=obj(gid="string", name="string")))},
      "/tasks/{task_gid}": item_get(obj(data=obj(gid="string", name="string")), "task_gid")}, "create", "search",
     {"items": "$.data", "match": {"$.name": "$.data.name"}, "id": "$.gid"}, ""),
    ("an envelope of one field, named after the resource",
     {"/keys": {"get": {"responses": answer(obj(keys={"type": "array", "items": THING}, links="object"))},
                "post": post("create", NEW_THING, obj(key=THING))}}, "create", "search",
     {"items": "$.keys", "match": {"$.title": "$.title", "$.body": "$.body"}, "id": "$.id"}, ""),
    ("a path parameter a template cannot name is renamed",
     {"/things/{thing-id}": {**item_get(THING, "thing-id"), "delete": {"operationId": "remove", "responses": {}}}},
     "remove", "lookup", {"url": "{scheme}://{netloc}/v1/things/{path.thing_id}"}, ""),
    ("a rule the config would refuse is none, with its reason",
     {"/a/{x-y}/b/{x_y}": {**item_get(THING, "x-y"), "delete": {"operationId": "remove", "responses": {}}}},
     "remove", None, {}, "cannot be written as a rule: path: path template '/v1/a/{x_y}/b/{x_y}' repeats {x_y}"),
]  # fmt: skip


@pytest.mark.parametrize("paths, write, strategy, read, note", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_write_gets_its_read_rule_or_the_reason_it_has_none(paths, write, strategy, read, note):
    s = suggestion(paths, write)

    assert s.strategy == strategy, s.note
    assert note in s.note
    if strategy is None:
        assert s.rule is None and s.note
        return
    assert s.rule is not None and s.read is not None
    assert {k: s.rule["reconcile"].get(k) for k in read} == read
    OperationRule.model_validate(s.rule)  # as config.yaml's rules load


def test_the_operation_rule_names_the_write_and_its_external_id():
    paths = {"/issues": {**listing(ISSUE, *SORTED), "post": post("issues/create", obj("title", title="string"), ISSUE)},
             "/issues/{issue_number}": item_get(ISSUE, "issue_number")}  # fmt: skip

    s = suggestion(paths, "issues/create")

    assert s.rule is not None
    assert {k: s.rule[k] for k in ("name", "method", "path", "external_id")} == {
        "name": "issues/create", "method": "POST", "path": "/v1/issues", "external_id": "$.number",
    }  # fmt: skip
    assert s.read is not None and s.read.where == "paths./issues.get"


SECURED = {"/things/{thing_id}": {**item_get(THING), "delete": {"operationId": "remove", "responses": {}}}}
SCHEMES = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}, "key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}}


@pytest.mark.parametrize(
    "security, target, headers",
    [
        ([{"bearer": []}], TARGET, {"Authorization": "Bearer ${EXAMPLE_TOKEN}"}),
        ([{"key": []}], TARGET, {"X-Api-Key": "${EXAMPLE_X_API_KEY}"}),
        ([{"bearer": []}], Target("api.example.com", "/v1", (("Authorization", "token ${GH}"),)), {"Authorization": "token ${GH}"}),
        (None, TARGET, None),
    ],
    ids=["bearer", "api key header", "given headers win", "no credentials"],
)
def test_a_read_carries_the_credentials_the_document_names_from_the_environment(security, target, headers):
    top: dict = {"components": SCHEMES}
    if security is not None:
        top["security"] = security
    s = suggestion(SECURED, "remove", target, **top)

    assert s.rule is not None and s.rule["reconcile"].get("headers") == headers


@pytest.mark.parametrize(
    "host, label", [("api.github.com", "GITHUB"), ("gitlab.com", "GITLAB"), ("127.0.0.1:3000", "API"), ("localhost", "API")]
)
def test_the_credentials_variable_is_named_after_the_host(host, label):
    assert token_label(host) == label


def test_the_yaml_loads_as_config_and_says_where_each_rule_came_from():
    paths = {
        "/things": {**listing(THING, *SORTED), "post": post("create", NEW_THING, THING)},
        "/things/{thing_id}": {**item_get(THING), "patch": {"operationId": "edit", "requestBody": body(obj(colour="string")),
                                                            "responses": answer(THING)}},
    }  # fmt: skip
    api = read_api(document(paths))
    suggestions = suggest(api, TARGET)

    text = render(suggestions, TARGET, api, "api.yaml")

    config = parse_config(text)
    assert [op.name for op in config.policy_for("api.example.com", 443).operations] == ["create"]
    assert "      # from: paths./things.post; read: search paths./things.get\n      - name: create\n" in text
    assert "# no read rule:\n#   PATCH /things/{thing_id} (edit): it sets no field" in text
    assert counts(suggestions) == {"writes": 2, "lookup": 0, "search": 1, "none": 1}
    assert yaml.safe_load(text)["hosts"]["api.example.com"]["operations"][0]["reconcile"]["strategy"] == "search"


def test_a_document_without_a_read_rule_still_prints_loadable_yaml():
    api = read_api(document({"/x": {"post": post("x", NEW_THING, obj(ok="boolean"))}}))

    text = render(suggest(api, TARGET), TARGET, api, "api.yaml")

    assert parse_config(text).hosts["api.example.com"].operations == []
