"""What a read rule compares: where a body's fields sit (inside an envelope or not), the answer's id, and the
fields a request and what a read shows have in common (`match`)."""

import re
from dataclasses import dataclass
from typing import Any

from proxy_addon.config import DEFAULT_REDACT_FIELDS
from proxy_addon.rules.redaction import SecretFields
from proxy_addon.suggest.openapi import Operation
from proxy_addon.suggest.schemas import ENVELOPE, Field, Shape

FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a field a JSON path names as $.name
# a field the journal redacts by default (password, token, ...): a match on it could never be made
SECRETS = SecretFields(DEFAULT_REDACT_FIELDS)


@dataclass(frozen=True)
class Located:
    """A body's shape and where in the body it sits: `$`, or `$.data` inside an envelope."""

    shape: Shape
    prefix: str = "$"

    def path(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def placeholder(self, name: str) -> str:
        """The URL placeholder of the request body's field: {body.data.gid}."""
        return "{body." + self.path(name).removeprefix("$.") + "}"


def unwrap(shape: Shape | None) -> Located | None:
    """An object body as its fields are read: inside its envelope (`data`, or its one field) when it has one and
    no id of its own."""
    if shape is None or shape.kind != "object":
        return None
    name = ENVELOPE if ENVELOPE in shape.fields else next(iter(shape.fields)) if len(shape.fields) == 1 else None
    inner = shape.fields[name].shape if name is not None and FIELD_NAME.match(name) else None
    if "id" not in shape.fields and inner is not None and inner.kind == "object":
        return Located(inner, f"$.{name}")
    return Located(shape)


def id_field(answer: Located | None, item_param: str | None) -> str | None:
    """The answer's id: the field the item path reads by (`issue_number` -> `number`), else `id`."""
    if answer is None:
        return None
    names = [item_param, _last_word(item_param)] if item_param else []
    for name in [*names, "id"]:
        found = answer.shape.fields.get(name) if name else None
        if name and found is not None and found.scalar and FIELD_NAME.match(name):
            return name
    return None


def answer_id(write: Operation, item_param: str | None) -> str | None:
    """The write's `external_id`: its answer's id, as a JSON path."""
    answer = unwrap(write.answer)
    name = id_field(answer, item_param)
    return answer.path(name) if answer is not None and name else None


def _last_word(name: str) -> str:
    """`issue_number` -> `number`, `userId` -> `id`, `pet-id` -> `id`."""
    words = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)
    return words[-1].lower() if words else name


def match_of(body: Located | None, shown: Located | None, leave_out: str | None = None) -> dict[str, str]:
    """The body's fields that `shown` (an item, a listed item) has too, or may have (a field of some of its
    alternatives), both plain values of a common type, none a secret: the shown field's path, the request's."""
    if body is None or shown is None:
        return {}
    sent = {n: f for n, f in body.shape.fields.items() if not f.read_only}
    seen = {**shown.shape.maybe, **shown.shape.fields}
    names = [n for n in sent if n in seen and n != leave_out and FIELD_NAME.match(n) and n not in SECRETS]
    return {shown.path(n): body.path(n) for n in names if _comparable(sent[n], seen[n])}


def match_keys(body: Located, match: dict[str, str]) -> dict[str, Any]:
    """The read's `match`, with `match_when_missing: skip` when the write may leave out some of its fields: then
    those it has are compared (one at least, or the read goes to a person)."""
    if not match:
        return {}
    optional = [path for path in match.values() if field_name(path) not in body.shape.required]
    return {"match": match, **({"match_when_missing": "skip"} if optional else {})}


def unmatched(body: Located | None, match: dict[str, str]) -> list[str]:
    """The body's fields a match does not compare (objects, lists, secrets, fields the read does not show)."""
    compared = {field_name(path) for path in match.values()}
    return sorted(n for n, f in body.shape.fields.items() if n not in compared and not f.read_only) if body is not None else []


def field_name(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _comparable(sent: Field, shown: Field) -> bool:
    return sent.scalar and shown.scalar and bool((sent.types & shown.types) - {"null"})
