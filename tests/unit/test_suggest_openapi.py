"""Reading an OpenAPI document (suggest/openapi.py, suggest/schemas.py): `$ref`s resolved wherever they stand,
schemas read into shapes (allOf merged, oneOf's common fields, 3.0's nullable and 3.1's type lists, an
envelope), the first server's host and base path, and one clear line for what cannot be read."""

import json
from pathlib import Path

import pytest

from proxy_addon.exceptions import OpenApiError
from proxy_addon.suggest.openapi import Auth, load_document, read_api, server_of
from proxy_addon.suggest.schemas import Field

THING = {
    "type": "object",
    "required": ["id"],
    "properties": {"id": {"type": "string"}, "title": {"type": "string"}, "rank": {"type": "integer", "nullable": True}},
}


def document(paths: dict, **components) -> dict:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths, "components": components}


def only(api, method: str):
    return next(op for op in api.operations if op.method == method)


def answer(schema: dict, status: str = "200") -> dict:
    return {status: {"description": "", "content": {"application/json": {"schema": schema}}}}


def test_refs_are_resolved_in_parameters_bodies_and_answers():
    api = read_api(
        document(
            {
                "/things/{id}": {
                    "parameters": [{"$ref": "#/components/parameters/id"}],
                    "get": {
                        "parameters": [{"name": "dry", "in": "query", "schema": {"$ref": "#/components/schemas/Flag"}}],
                        "responses": {"200": {"$ref": "#/components/responses/Thing"}},
                    },
                    "put": {
                        "operationId": "putThing",
                        "requestBody": {"$ref": "#/components/requestBodies/Thing"},
                        "responses": {"200": {"$ref": "#/components/responses/Thing"}},
                    },
                }
            },
            parameters={"id": {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}},
            schemas={"Thing": THING, "Flag": {"type": "boolean"}},
            requestBodies={"Thing": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}},
            responses={"Thing": {"description": "", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}},
        )
    )

    get, op = only(api, "GET"), only(api, "PUT")
    assert [(p.name, p.location, p.required) for p in get.params] == [("id", "path", True), ("dry", "query", False)]
    assert get.params[1].field.types == {"boolean"}
    assert (op.operation_id, op.where) == ("putThing", "paths./things/{id}.put")
    assert op.body is not None and set(op.body.fields) == {"id", "title", "rank"} and op.body.required == {"id"}
    assert op.answer is not None and op.answer.fields["rank"] == Field(frozenset({"integer", "null"}))
    assert op.answer_status == "200"


@pytest.mark.parametrize(
    "schema, fields, required",
    [
        ({"allOf": [{"$ref": "#/components/schemas/Thing"}, {"properties": {"x": {"type": "string"}}, "required": ["x"]}]},
         {"id", "title", "rank", "x"}, {"id", "x"}),
        ({"oneOf": [{"$ref": "#/components/schemas/Thing"}, {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]},
         {"id"}, {"id"}),
        ({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}, {"a"}, set()),
        ({"properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, {"a"}, set()),
    ],
    ids=["allOf merged", "oneOf: the fields all alternatives have", "3.1 type list", "no type: an object by its properties"],
)  # fmt: skip
def test_schemas_are_read_into_shapes(schema, fields, required):
    paths = {"/x": {"post": {"requestBody": {"content": {"application/json": {"schema": schema}}}, "responses": {}}}}
    body = only(read_api(document(paths, schemas={"Thing": THING})), "POST").body

    assert body is not None and body.kind == "object"
    assert (set(body.fields), set(body.required)) == (fields, required)


def test_an_array_answer_has_its_items_shape_and_an_envelope_its_inner_shape():
    paths = {
        "/things": {"get": {"responses": answer({"type": "array", "items": {"$ref": "#/components/schemas/Thing"}})}},
        "/wrapped": {"get": {"responses": answer({"type": "object", "properties": {"data": {"$ref": "#/components/schemas/Thing"}}})}},
    }
    api = read_api(document(paths, schemas={"Thing": THING}))

    listed, wrapped = api.operations
    assert listed.answer is not None and listed.answer.kind == "array"
    assert listed.answer.items is not None and set(listed.answer.items.fields) == {"id", "title", "rank"}
    assert wrapped.answer is not None
    envelope = wrapped.answer.fields["data"].shape
    assert envelope is not None and set(envelope.fields) == {"id", "title", "rank"}


def test_a_json_kin_body_and_a_form_are_read_and_a_multipart_one_is_not():
    form = {"content": {"multipart/form-data": {"schema": THING}, "application/x-www-form-urlencoded": {"schema": THING}}}
    vendor = {"content": {"application/vnd.github+json; charset=utf-8": {"schema": THING}}}
    multipart = {"content": {"multipart/form-data": {"schema": THING}}}
    paths = {
        "/f": {"post": {"requestBody": form, "responses": {}}},
        "/v": {"post": {"requestBody": vendor, "responses": {}}},
        "/m": {"post": {"requestBody": multipart, "responses": {}}},
    }

    form_op, vendor_op, multipart_op = read_api(document(paths)).operations

    assert form_op.body is not None and "title" in form_op.body.fields  # the reconciler reads a form as a document
    assert vendor_op.body is not None and "title" in vendor_op.body.fields
    assert (multipart_op.body_media, multipart_op.body) == (("multipart/form-data",), None)


def test_the_first_2xx_answer_is_201_before_200():
    responses = {**answer({"type": "object", "properties": {"a": {"type": "string"}}}), **answer(THING, "201")}
    op = only(read_api(document({"/x": {"post": {"responses": responses}}})), "POST")

    assert op.answer_status == "201" and op.answer is not None and "id" in op.answer.fields


def test_a_path_key_holding_a_hash_is_read_whole():
    """Box's /files/{file_id}#add_shared_link: the character jsonschema-path splits keys at by default."""
    paths = {"/files/{file_id}#add_shared_link": {"put": {"operationId": "share", "responses": answer(THING)}}}

    op = only(read_api(document(paths)), "PUT")

    assert op.path == "/files/{file_id}#add_shared_link" and op.answer is not None and "id" in op.answer.fields


def test_security_schemes_name_the_headers_a_read_carries():
    paths = {
        "/a": {"get": {"responses": {}}},
        "/b": {"get": {"security": [{"key": []}], "responses": {}}},
        "/c": {"get": {"security": [{"query": []}, {"basic": []}], "responses": {}}},
        "/d": {"get": {"security": [{"basic": []}, {"bearer": []}], "responses": {}}},
    }
    doc = document(
        paths,
        securitySchemes={
            "bearer": {"type": "http", "scheme": "bearer"},
            "key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            "query": {"type": "apiKey", "in": "query", "name": "key"},
            "basic": {"type": "http", "scheme": "basic"},
        },
    )
    doc["security"] = [{"bearer": []}]

    a, b, c, d = read_api(doc).operations

    assert a.auth == (Auth("Authorization", "Bearer "),)
    assert b.auth == (Auth("X-Api-Key", ""),)
    assert c.auth == (Auth("Authorization", "Basic "),)  # a key in the query cannot come from the environment
    assert d.auth == (Auth("Authorization", "Bearer "),)  # a token as it is, rather than Basic's encoding (Stripe)


@pytest.mark.parametrize(
    "servers, expected",
    [
        ([{"url": "https://api.github.com"}], ("api.github.com", "")),
        ([{"url": "https://gitlab.com/api/v4/"}], ("gitlab.com", "/api/v4")),
        ([{"url": "http://localhost:3000"}], ("localhost:3000", "")),
        ([{"url": "https://example.com:443/v1"}], ("example.com", "/v1")),
        ([{"url": "https://{region}.example.com/{v}", "variables": {"region": {"default": "eu"}, "v": {"default": "v2"}}}],
         ("eu.example.com", "/v2")),
        ([{"url": "/api"}], (None, "/api")),
        ([], (None, "")),
    ],
)  # fmt: skip
def test_the_first_server_gives_the_host_and_the_base_path(servers, expected):
    assert server_of(servers) == expected


def test_a_ref_to_a_file_beside_the_document_is_followed(tmp_path: Path):
    (tmp_path / "thing.json").write_text(json.dumps(THING))
    doc_path = tmp_path / "api.json"
    doc_path.write_text(json.dumps(document({"/x": {"get": {"responses": answer({"$ref": "thing.json"})}}})))

    op = read_api(load_document(doc_path), doc_path.absolute().as_uri()).operations[0]

    assert op.answer is not None and "title" in op.answer.fields


def test_a_ref_to_a_url_is_not_fetched():
    doc = document({"/x": {"get": {"responses": answer({"$ref": "https://schemas.example.com/thing.json"})}}})

    with pytest.raises(OpenApiError, match=r"a \$ref that cannot be resolved here"):
        read_api(doc)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"swagger": "2.0", "paths": {}}', "OpenAPI 2.0, not 3.x"),
        ("openapi: 3.0.0\ninfo: {}\n", "not an OpenAPI document (no paths)"),
        ("openapi: [3.0\n", "neither JSON nor YAML"),
        ('{"openapi": "3.1.0", "paths": {}', "neither JSON nor YAML"),
    ],
)
def test_a_document_that_cannot_be_read_is_one_line_naming_the_file(tmp_path: Path, text, message):
    path = tmp_path / "api.yaml"
    path.write_text(text)

    with pytest.raises(OpenApiError) as e:
        load_document(path)

    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_a_missing_document_is_one_line(tmp_path: Path):
    with pytest.raises(OpenApiError, match="cannot read the OpenAPI document"):
        load_document(tmp_path / "nope.yaml")
