"""JSON schemas read into shapes, one level deep (an object's fields; an array's items' fields; an envelope's
fields), which is all a read rule needs: its `match` and `id` name top-level fields of a request, an answer or
a listed item. `$ref`s are resolved by jsonschema-path as each node is walked to."""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema_path import SchemaPath
from referencing.exceptions import Unresolvable

from proxy_addon.exceptions import OpenApiError

SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})
# a body wrapped as {"data": {...}} (Asana, JSON:API), or in an object's one field ({"droplet": {...}}: DigitalOcean):
# that field is read one level deeper
ENVELOPE = "data"
MAX_SCHEMA_DEPTH = 12  # allOf / oneOf nesting followed before a schema counts as unknown


@dataclass(frozen=True)
class Field:
    """One property of an object schema: its JSON types, its format, and (for an array) its items' shape."""

    types: frozenset[str]
    format: str | None = None
    items: "Shape | None" = None
    shape: "Shape | None" = None  # an envelope's object shape (`data`, or an object's one field)
    read_only: bool = False  # `readOnly`: in a request schema, a field no request sends (Asana's gid, created_at)

    @property
    def scalar(self) -> bool:
        """A string, number or boolean (or null): a value a match compares and a URL can carry."""
        known = self.types - {"null"}
        return bool(known) and known <= SCALAR_TYPES


@dataclass(frozen=True)
class Shape:
    """What a JSON schema says a body holds, one level deep."""

    kind: str  # object | array | other
    fields: Mapping[str, Field] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    items: "Shape | None" = None  # an array's item shape
    maybe: Mapping[str, Field] = field(default_factory=dict)  # fields only some oneOf/anyOf alternatives have


def shape_of(schema: SchemaPath, depth: int = MAX_SCHEMA_DEPTH, items: bool = True) -> Shape:
    """The schema's shape: allOf merged; of oneOf/anyOf alternatives, the fields all of them have (and, as `maybe`,
    those only some have: a customer's email, or Stripe's `deleted` of a deleted one)."""
    raw = mapping_of(schema)
    if depth <= 0 or not raw:
        return Shape("other")
    types = _types(schema, raw, depth)
    if "array" in types and "items" in raw and types - {"null"} == {"array"}:
        return Shape("array", items=shape_of(schema / "items", depth - 1, items=False) if items else None)
    if "object" not in types and types:
        return Shape("other")
    fields: dict[str, Field] = {}
    required: set[str] = set(strings(raw.get("required")))
    if "properties" in raw:
        only = len(raw["properties"]) == 1 if isinstance(raw["properties"], dict) else False
        fields.update(
            (name, field_of(node, depth - 1, items, envelope=only or name == ENVELOPE))
            for name, node in children(schema / "properties")
        )
    for part in _parts(schema, raw, "allOf"):
        shape = shape_of(part, depth - 1, items)
        fields.update(shape.fields)
        required |= shape.required
    alternatives = [shape_of(p, depth - 1, items) for key in ("oneOf", "anyOf") for p in _parts(schema, raw, key)]
    objects = [a for a in alternatives if a.kind == "object"]
    maybe: dict[str, Field] = {}
    if objects:
        common = set.intersection(*(set(a.fields) for a in objects))
        fields.update((name, objects[0].fields[name]) for name in common if name not in fields)
        required |= set.intersection(*(set(a.required) for a in objects))
        for alternative in objects:
            maybe.update((n, f) for n, f in {**alternative.maybe, **alternative.fields}.items() if n not in fields)
    if not fields and not types:
        return Shape("other")
    return Shape("object", fields, frozenset(required), maybe=maybe)


def field_of(schema: SchemaPath | None, depth: int, items: bool, envelope: bool = False) -> Field:
    raw = mapping_of(schema) if schema is not None else {}
    if schema is None or not raw or depth <= 0:
        return Field(frozenset())
    types = _types(schema, raw, depth)
    item_shape = shape_of(schema / "items", depth - 1, items=False) if items and "items" in raw and "array" in types else None
    inner = shape_of(schema, depth - 1, items) if envelope and "object" in types else None
    fmt = raw.get("format")
    return Field(frozenset(types), fmt if isinstance(fmt, str) else None, item_shape, inner, raw.get("readOnly") is True)


def _types(schema: SchemaPath, raw: Mapping[str, Any], depth: int) -> set[str]:
    """The JSON types a schema allows: its `type` (3.0's string, 3.1's list), nullable, and those of its
    alternatives; an object or array by its keywords when `type` is left out."""
    declared = raw.get("type")
    types = set(strings(declared)) if isinstance(declared, list) else {declared} if isinstance(declared, str) else set()
    if raw.get("nullable") is True:
        types.add("null")
    for key in ("oneOf", "anyOf", "allOf"):
        for part in _parts(schema, raw, key):
            part_raw = mapping_of(part)
            if depth > 1 and part_raw:
                types |= _types(part, part_raw, depth - 1)
    if not types - {"null"}:
        if "properties" in raw:
            types.add("object")
        elif "items" in raw:
            types.add("array")
    return types


# -- walking the document -------------------------------------------------------------------------------------


def mapping_of(node: SchemaPath | None) -> Mapping[str, Any]:
    """A node's own keys, its `$ref` resolved (its children's refs are resolved when walked to)."""
    if node is None:
        return {}
    try:
        value = node.read_value()
    except (LookupError, ValueError, Unresolvable) as e:
        raise OpenApiError(f"{node.as_posix()}: a $ref that cannot be resolved here: {e}") from None
    return value if isinstance(value, dict) else {}


def _is_object(node: SchemaPath) -> bool:
    return bool(mapping_of(node))


def children(node: SchemaPath) -> Iterator[tuple[str, SchemaPath]]:
    for key in mapping_of(node):
        yield str(key), node / str(key)


def _parts(schema: SchemaPath, raw: Mapping[str, Any], key: str) -> list[SchemaPath]:
    value = raw.get(key)
    return [schema / key / i for i in range(len(value))] if isinstance(value, list) else []


def strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
