"""An OpenAPI 3.x document read into what a read rule is made of: each operation's method and path template, its
parameters, the JSON shapes of its request body and of its 2xx answer, and the credentials a call carries.

`$ref`s are resolved by jsonschema-path (the library openapi-spec-validator and openapi-core read documents
with), lazily: only the nodes looked at are resolved, so that GitHub's 13 MB document reads in a fraction of a
second. A schema is read one level deep (an object's fields; an array's item fields), which is all a rule
needs: its `match` and `id` name top-level fields of the request and of the answer or a listed item.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from jsonschema_path import SchemaPath
from jsonschema_path.handlers.urllib import UrllibHandler

from proxy_addon.exceptions import OpenApiError
from proxy_addon.suggest.schemas import MAX_SCHEMA_DEPTH, Field, Shape, children, field_of, mapping_of, shape_of

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
READ_METHODS = ("GET",)
# jsonschema-path splits a key at its separator ("#" unless told): paths like Box's /files/{file_id}#add_shared_link
# hold one, so it is a character no document key has
KEY_SEPARATOR = "\x1f"
RESOLVED_CACHE = 4096  # resolved nodes jsonschema-path keeps: a document's shared schemas are read many times


@dataclass(frozen=True)
class Param:
    name: str
    location: str  # path | query | header | cookie
    required: bool
    field: Field
    enum: tuple[Any, ...] = ()
    maximum: float | None = None


@dataclass(frozen=True)
class Auth:
    """A credential a call carries in a header, as the document's security scheme says."""

    header: str
    prefix: str  # "Bearer ", "Basic ", or "" for an API key


@dataclass(frozen=True)
class Operation:
    method: str  # upper case
    path: str  # the document's path template
    operation_id: str | None
    params: tuple[Param, ...] = ()  # a read's
    body_media: tuple[str, ...] = ()  # the request body's media types, as the document lists them
    body: Shape | None = None  # the request body's schema, when it is JSON or a form (which the reconciler reads)
    answer: Shape | None = None  # the first 2xx answer's JSON schema
    answer_status: str | None = None
    auth: tuple[Auth, ...] = ()  # a read's credentials

    @property
    def where(self) -> str:
        """Where in the document it is: `paths./repos/{owner}/{repo}/issues.post`."""
        return f"paths.{self.path}.{self.method.lower()}"

    @property
    def name(self) -> str:
        return self.operation_id or f"{self.method} {self.path}"

    def query(self) -> dict[str, Param]:
        return {p.name: p for p in self.params if p.location == "query"}


@dataclass(frozen=True)
class Api:
    title: str
    version: str
    host: str | None  # the first server's host[:port], if it names one
    base_path: str  # the first server's path ("" or "/api/v4"), before every path template
    operations: tuple[Operation, ...]


def load_document(path: Path) -> dict[str, Any]:
    """The document as data (JSON or YAML), or OpenApiError naming what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise OpenApiError(f"{path}: cannot read the OpenAPI document: {e}") from None
    try:
        document = json.loads(text) if text.lstrip().startswith("{") else yaml.load(text, Loader=_YAML_LOADER)
    except (ValueError, yaml.YAMLError) as e:
        raise OpenApiError(f"{path}: neither JSON nor YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(document, dict) or not isinstance(document.get("paths"), dict):
        raise OpenApiError(f"{path}: not an OpenAPI document (no paths)")
    version = str(document.get("openapi") or document.get("swagger") or "")
    if not version.startswith("3."):
        raise OpenApiError(f"{path}: OpenAPI {version or 'of no version'}, not 3.x (convert a Swagger 2.0 document first)")
    return document


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# a `$ref` to another file beside the document is followed; one to a URL is not fetched: reading a document
# makes no request
LOCAL_REFS_ONLY = {"file": UrllibHandler("file")}


def read_api(document: dict[str, Any], base_uri: str = "") -> Api:
    """The document's operations (GET and the writes), each with what a rule needs of it; `base_uri` (the
    document's file URI) anchors `$ref`s to files beside it."""
    spec = SchemaPath.from_dict(
        document, separator=KEY_SEPARATOR, base_uri=base_uri, handlers=LOCAL_REFS_ONLY, resolved_cache_maxsize=RESOLVED_CACHE
    )
    info = document.get("info") or {}
    host, base_path = server_of(document.get("servers") or [])
    schemes = _security_schemes(spec)
    default_security = document.get("security")
    operations = [
        _operation(item, method, path, schemes, default_security)
        for path, item in children(spec / "paths")
        for method in (*READ_METHODS, *WRITE_METHODS)
        if mapping_of(item) and method.lower() in item
    ]
    return Api(str(info.get("title", "")), str(info.get("version", "")), host, base_path, tuple(operations))


def server_of(servers: list[Any]) -> tuple[str | None, str]:
    """The first server's host (with a port that is not the scheme's default) and path, variables at their
    defaults; a relative server URL names no host."""
    if not servers or not isinstance(servers[0], dict) or not isinstance(servers[0].get("url"), str):
        return None, ""
    server = servers[0]
    url = server["url"]
    for name, variable in (server.get("variables") or {}).items():
        if isinstance(variable, dict) and "default" in variable:
            url = url.replace("{" + name + "}", str(variable["default"]))
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not parts.hostname:
        return None, path
    default_port = {"http": 80, "https": 443}.get(parts.scheme)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname if port in (None, default_port) else f"{parts.hostname}:{port}"
    return host, path


def _operation(item: SchemaPath, method: str, path: str, schemes: Any, default_security: Any) -> Operation:
    """What a rule needs of one operation: of a read, its query parameters and answer; of a write, its body and
    answer (only what is used is read: resolving is most of the time a document takes)."""
    op = item / method.lower()
    raw = mapping_of(op)
    read = method in READ_METHODS
    body_media, body = ((), None) if read else _request_body(op)
    status, answer = _answer(op)
    operation_id = raw.get("operationId")
    return Operation(
        method=method,
        path=path,
        operation_id=operation_id if isinstance(operation_id, str) else None,
        params=_params(item, op) if read else (),
        body_media=body_media,
        body=body,
        answer=answer,
        answer_status=status,
        auth=_auth(raw.get("security", default_security), schemes) if read else (),
    )


def _params(item: SchemaPath, op: SchemaPath) -> tuple[Param, ...]:
    """The path item's parameters, and the operation's, which win by name and place."""
    params: dict[tuple[str, str], Param] = {}
    for owner in (item, op):
        if "parameters" not in owner:
            continue
        for node in owner / "parameters":
            raw = mapping_of(node)
            name, location = raw.get("name"), raw.get("in")
            if not isinstance(name, str) or not isinstance(location, str):
                continue
            schema = node / "schema" if "schema" in raw else None
            schema_raw = mapping_of(schema) if schema is not None else {}
            maximum = schema_raw.get("maximum")
            params[(name, location)] = Param(
                name,
                location,
                raw.get("required") is True,
                field_of(schema, MAX_SCHEMA_DEPTH, items=False) if schema is not None else Field(frozenset()),
                tuple(schema_raw.get("enum") or ()),
                maximum if isinstance(maximum, int | float) and not isinstance(maximum, bool) else None,
            )
    return tuple(params.values())


def _request_body(op: SchemaPath) -> tuple[tuple[str, ...], Shape | None]:
    if "requestBody" not in op:
        return (), None
    body = op / "requestBody"
    if "content" not in body:
        return (), None
    content = body / "content"
    media = tuple(str(m) for m in mapping_of(content))
    readable = next((m for m in media if is_json_media(m)), None) or next((m for m in media if is_form_media(m)), None)
    if readable is None or "schema" not in content / readable:
        return media, None
    return media, shape_of(content / readable / "schema")


def _answer(op: SchemaPath) -> tuple[str | None, Shape | None]:
    """The first 2xx answer (201 before 200 before the rest): its status and JSON shape."""
    if "responses" not in op:
        return None, None
    responses = op / "responses"
    codes = sorted((str(c) for c in mapping_of(responses) if str(c).startswith("2")), key=lambda c: (c != "201", c))
    if not codes:
        return None, None
    response = responses / codes[0]
    if "content" not in mapping_of(response):
        return codes[0], None
    content = response / "content"
    json_media = next((m for m in mapping_of(content) if is_json_media(str(m))), None)
    if json_media is None or "schema" not in content / json_media:
        return codes[0], None
    return codes[0], shape_of(content / json_media / "schema")


def is_form_media(media: str) -> bool:
    """A form body, which the reconciler reads as a document too (`a[b]=1` as {"a": {"b": "1"}}: Stripe's)."""
    return media.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


def is_json_media(media: str) -> bool:
    """application/json, and its kin (application/vnd.github+json, application/problem+json, */*; charset)."""
    kind = media.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _auth(security: Any, schemes: Any) -> tuple[Auth, ...]:
    """The headers of a security requirement whose schemes all go in a header, one without Basic first (a token
    is kept in the environment as it is; Basic wants it encoded); none: no credentials."""
    if not isinstance(security, list) or not isinstance(schemes, dict):
        return ()
    usable = []
    for requirement in security:
        headers = [_scheme_header(schemes.get(name)) for name in requirement] if isinstance(requirement, dict) else [None]
        if all(h is not None for h in headers):
            usable.append(tuple(h for h in headers if h is not None))
    usable.sort(key=lambda headers: any(h.prefix == "Basic " for h in headers))
    return usable[0] if usable else ()


def _scheme_header(scheme: Any) -> Auth | None:
    if not isinstance(scheme, dict):
        return None
    kind = scheme.get("type")
    if kind == "apiKey" and scheme.get("in") == "header" and isinstance(scheme.get("name"), str):
        return Auth(scheme["name"], "")
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "basic":
        return Auth("Authorization", "Basic ")
    if kind in ("http", "oauth2", "openIdConnect"):
        return Auth("Authorization", "Bearer ")
    return None


def _security_schemes(spec: SchemaPath) -> dict[str, Mapping[str, Any]]:
    components = mapping_of(spec / "components") if "components" in spec else {}
    if "securitySchemes" not in components:
        return {}
    return {name: mapping_of(node) for name, node in children(spec / "components" / "securitySchemes")}


def path_placeholders(path: str) -> list[str]:
    return re.findall(r"\{([^{}]+)\}", path)
