"""Each write's read rule, chosen from what its OpenAPI document says (openapi.py), or none and why.

A read rule settles a write whose answer never came, so it can only use what the request holds: the path's
parameters and the JSON body. The answer's id (`external_id`) is known for a success, never for an unknown;
a rule that reads by it would pass its verifier controls (they run on a known success) and then settle nothing.
Hence:

- **lookup** on the GET at the write's own path, for a write the path names (`PUT`/`PATCH`/`DELETE`, or a
  `POST` to an item): a `DELETE` is done when the item is gone (`absent_means: succeeded`; not where the GET
  may answer a deleted item, `deleted: true`, as Stripe's customers do); a `PUT`/`PATCH`
  is there when the item shows the fields the write requires (`match`); a `PUT` without a body (a relation
  the path names) when the item is there. A write that requires no field is not looked up: the item is there
  whether or not it took effect.
- **lookup** on the item GET (`/things/{id}`) for a `POST` whose body requires the id the item is read by
  (a client-chosen id).
- **search** of the list GET at the `POST`'s own path (`items` where the answer wraps the list), with `match`
  on the body's required fields that the listed items show; as filters, the list's query parameters of the
  same names and a `since` parameter given the submission time; newest first and the largest page where the
  document offers them, and then the items' creation time as `time_field` (how far back the pages must reach).
- none, with the reason, otherwise (no read at that path, a body that is not JSON, no id in the answer, no
  field to match on).

A suggestion is a start, not a proof: `receipts rules check` runs its verifier controls on the live API.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from proxy_addon.config import describe_validation_error
from proxy_addon.rules.operations import OperationRule
from proxy_addon.suggest.openapi import WRITE_METHODS, Api, Operation, path_placeholders
from proxy_addon.suggest.schemas import ENVELOPE, Field, Shape
from proxy_addon.suggest.urls import Target, last_placeholder, path_shape, read_headers, read_url, rule_path

LIST_FIELDS = ("data", "items", "results", "values", "records", "entries", "elements", "content", "list", "nodes")
PAGE_SIZE_PARAMS = ("per_page", "page_size", "pageSize", "perPage", "limit", "_limit", "max_results", "maxResults")
SORT_PARAMS = ("sort", "_sort", "sort_by", "sortBy", "order_by", "orderBy")
DIRECTION_PARAMS = ("direction", "order", "_order", "sort_order", "sortOrder")
# a date-time parameter listing only what was created (or changed) after it: given the submission time, the list holds
# the write's effect if it happened, however many came before
SINCE_PARAMS = ("since", "created_after", "createdAfter", "created_since", "updated_after", "updatedAfter", "modified_since")
NEWEST = ("created", "created_at", "createdAt", "creation_date")  # a sort key that lists the newest first with desc
TIME_FIELDS = ("created_at", "createdAt", "created", "created_on", "createdOn", "creation_date", "creationDate",
               "date_created", "dateCreated", "inserted_at", "insertedAt", "created_time", "createdTime")  # fmt: skip
NEXT_PAGE_FIELDS = ("next", "next_page", "next_page_url", "nextPageUrl", "next_url", "nextUrl")
TOMBSTONE = "deleted"  # an item's field saying it was deleted, while its GET still answers it (Stripe's)
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a field a JSON path names as $.name


@dataclass(frozen=True)
class Suggestion:
    write: Operation
    rule: dict[str, Any] | None  # the operation rule as config.yaml writes it, with its read rule; None: no read
    read: Operation | None = None  # the GET its read rule reads
    note: str = ""  # why there is no read rule, or what to know of the one there is

    @property
    def strategy(self) -> str | None:
        return self.rule["reconcile"]["strategy"] if self.rule else None


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


class Paths:
    """The document's operations by method and path: a read at a write's path, or one item below it, with the
    write's parameters at the same places under the same names (`/a/{x}` and `/a/{id}` name other things)."""

    def __init__(self, operations: Iterable[Operation]):
        self._by_shape = {(op.method, path_shape(op.path)): op for op in operations}

    def get(self, method: str, path: str) -> Operation | None:
        found = self._by_shape.get((method, path_shape(path)))
        return found if found is not None and path_placeholders(found.path) == path_placeholders(path) else None

    def item_of(self, path: str) -> Operation | None:
        """The GET of one item of the collection at `path` (`path/{id}`)."""
        found = self._by_shape.get(("GET", path_shape(path.rstrip("/") + "/{}")))
        return found if found is not None and path_placeholders(found.path)[:-1] == path_placeholders(path) else None


def suggest(api: Api, target: Target, operation_ids: Iterable[str] = ()) -> list[Suggestion]:
    """A suggestion for each write of the document (or for those named), in the document's order."""
    wanted = set(operation_ids)
    writes = [op for op in api.operations if op.method in WRITE_METHODS and (not wanted or op.operation_id in wanted)]
    paths = Paths(api.operations)
    return [checked(suggest_one(write, paths, target)) for write in writes]


def suggest_one(write: Operation, paths: Paths, target: Target) -> Suggestion:
    same = paths.get("GET", write.path)
    if write.method == "DELETE":
        return _delete(write, same, target)
    if same is not None and list_items(same.answer) is None:
        return _item_write(write, same, target)
    if write.method != "POST":
        why = "its GET answers a list, not the item" if same is not None else "no GET at its path reads it back"
        return Suggestion(write, None, note=why)
    return _create(write, same, paths.item_of(write.path), target)


def _delete(write: Operation, same: Operation | None, target: Target) -> Suggestion:
    if same is None:
        return Suggestion(write, None, note="no GET at its path reads the target")
    if list_items(same.answer) is not None:
        return Suggestion(write, None, note="its GET answers a list, which is there (empty) after the delete too")
    if same.answer is not None and TOMBSTONE in {*same.answer.fields, *same.answer.maybe}:
        why = f"{same.where} may answer a deleted item ({TOMBSTONE}: true), which a lookup takes for one still there"
        return Suggestion(write, None, note=why)
    read = {"strategy": "lookup", "url": read_url(target, write.path, same.path), **read_headers(same, target)}
    # absence is success here: a read the API refuses as 404 (what an anonymous caller may not see) would be one
    note = "" if "headers" in read else "its read carries no credentials: a 404 for what it may not see reads as done"
    return Suggestion(write, _rule(write, target, None, {**read, "absent_means": "succeeded"}), same, note)


def _item_write(write: Operation, item: Operation, target: Target) -> Suggestion:
    """A write the path names: there when the item shows the fields it requires (or, bodiless, when it is)."""
    if write.body_media and write.body is None:
        return Suggestion(write, None, note=f"its body is {write.body_media[0]}, not JSON: nothing to compare")
    item_param = last_placeholder(item.path)
    shown = unwrap(item.answer)
    match = _match(unwrap(write.body), shown)
    if not match and (write.body is not None or write.method != "PUT"):
        # only a PUT's path is its whole effect (a relation it makes); any other write may leave the item as it was
        shows = f"it requires no field that {item.where} shows" if write.body is not None else f"a bodiless {write.method}"
        return Suggestion(write, None, note=f"{shows}: the item is there whether or not the write took effect")
    read: dict[str, Any] = {"strategy": "lookup", "url": read_url(target, write.path, item.path), **read_headers(item, target)}
    if match:
        read["match"] = match
    id_name = id_field(shown, item_param)
    if shown is not None and id_name:
        read["id"] = shown.path(id_name)
    return Suggestion(write, _rule(write, target, _answer_id(write, item_param), read), item, _unmatched(write, match))


def _unmatched(write: Operation, match: dict[str, str]) -> str:
    """What a lookup of an item write does not compare: the optional fields the write may set."""
    body = unwrap(write.body)
    if body is None:
        return ""
    matched = {path.rsplit(".", 1)[-1] for path in match.values()}
    optional = sorted(n for n in body.shape.fields if n not in matched)
    if not optional:
        return ""
    more = f" and {len(optional) - 5} more" if len(optional) > 5 else ""
    compared = ", ".join(sorted(matched))
    return f"compares only {compared}: a write that changes {', '.join(optional[:5])}{more} is taken as done once {compared} match"


def _create(write: Operation, listing: Operation | None, item: Operation | None, target: Target) -> Suggestion:
    if write.body_media and write.body is None:
        return Suggestion(write, None, note=f"its body is {write.body_media[0]}, not JSON: nothing to match on")
    answer = unwrap(write.answer)
    id_name = id_field(answer, last_placeholder(item.path) if item else None)
    if answer is None or id_name is None:
        return Suggestion(write, None, note=f"its answer ({write.answer_status or 'none'}) has no id field")
    body = unwrap(write.body) or Located(Shape("object"))
    sets_id = id_name in body.shape.fields and body.shape.fields[id_name].scalar
    if item is not None and sets_id and (id_name in body.shape.required or listing is None):
        return _lookup_by_body_id(write, item, body, id_name, target)
    if listing is None:
        return Suggestion(write, None, note="no GET at its path lists what it creates, and its id is known only from its answer")
    return _search(write, listing, body, (answer, id_name), target)


def _lookup_by_body_id(write: Operation, item: Operation, body: Located, id_name: str, target: Target) -> Suggestion:
    """A create whose body sets the id the item is read by (a client-chosen id)."""
    read: dict[str, Any] = {
        "strategy": "lookup",
        "url": read_url(target, write.path, item.path, last=body.placeholder(id_name)),
        **read_headers(item, target),
    }
    shown = unwrap(item.answer) or Located(Shape("object"))
    match = {k: v for k, v in _match(body, shown).items() if k != shown.path(id_name)}
    if match:
        read["match"] = match
    read["id"] = shown.path(id_name)
    note = "" if id_name in body.shape.required else f"it reads only the writes that set {id_name}"
    return Suggestion(write, _rule(write, target, _answer_id(write, id_name), read), item, note)


def _search(write: Operation, listing: Operation, body: Located, answer_id: tuple[Located, str], target: Target) -> Suggestion:
    answer, id_name = answer_id
    found = list_items(listing.answer)
    if found is None:
        return Suggestion(write, None, note=f"{listing.where} answers no list")
    items_path, item = found
    if id_name not in item.fields:
        return Suggestion(write, None, note=f"the items {listing.where} lists have no {id_name}")
    match = _match(body, Located(item))
    if not match:
        return Suggestion(write, None, note=f"the items {listing.where} lists show none of the fields it requires")
    query = list_query(listing, body, [name.removeprefix("$.") for name in match])
    read: dict[str, Any] = {
        "strategy": "search",
        "url": read_url(target, write.path, listing.path) + (f"?{'&'.join(query.params)}" if query.params else ""),
        **read_headers(listing, target),
    }
    if items_path:
        read["items"] = items_path
    read.update(match=match, id=f"$.{id_name}")
    # a creation time bounds how far back the pages must reach only in a list that shows the newest first
    time_field = next((n for n in TIME_FIELDS if n in item.fields and _is_time(item.fields[n])), None) if query.newest_first else None
    next_page = _next_page(listing.answer)
    if time_field:
        read["time_field"] = f"$.{time_field}"
    if next_page:
        read["next_page"] = next_page
    note = "" if query.filtered or time_field or next_page else "absence is only as good as the first page: no filter, no order"
    return Suggestion(write, _rule(write, target, answer.path(id_name), read), listing, note)


@dataclass(frozen=True)
class ListQuery:
    params: list[str]
    filtered: bool  # by a matched field, or to what came after the submission
    newest_first: bool


def list_query(listing: Operation, body: Located, fields: list[str]) -> ListQuery:
    """The list's query: the matched fields it filters by, only what came since the submission, newest first,
    the largest page it allows."""
    params = listing.query()
    query = [f"{name}={body.placeholder(name)}" for name in fields if name in params and params[name].field.scalar]
    since = next((p for p in SINCE_PARAMS if p in params and params[p].field.format == "date-time"), None)
    if since:
        query.append(f"{since}={{submitted_at}}")
    filtered = bool(query)
    sort = next((p for p in SORT_PARAMS if p in params), None)
    newest = next((v for v in NEWEST if sort and v in params[sort].enum), None)
    direction = next((p for p in DIRECTION_PARAMS if p in params and "desc" in params[p].enum), None)
    if sort and newest and direction:
        query += [f"{sort}={newest}", f"{direction}=desc"]
    size = next((p for p in PAGE_SIZE_PARAMS if p in params and params[p].maximum), None)
    if size:
        query.append(f"{size}={int(params[size].maximum or 0)}")
    return ListQuery(query, filtered, bool(sort and newest and direction))


def list_items(answer: Shape | None) -> tuple[str | None, Shape] | None:
    """Where a list answer holds its items (None: the answer is the array) and their shape; None: no list.
    An object is a list when it has no id of its own and one array of objects (or one named like data)."""
    if answer is None:
        return None
    if answer.kind == "array":
        return (None, answer.items) if answer.items is not None and answer.items.kind == "object" else None
    if answer.kind != "object" or "id" in answer.fields:
        return None
    arrays = {n: f.items for n, f in answer.fields.items() if f.items is not None and f.items.kind == "object"}
    named = [n for n in LIST_FIELDS if n in arrays]
    name = next(iter(arrays)) if len(arrays) == 1 else named[0] if named else None
    items = arrays.get(name) if name is not None and FIELD_NAME.match(name) else None
    return (f"$.{name}", items) if name is not None and items is not None else None


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


def _answer_id(write: Operation, item_param: str | None) -> str | None:
    """The write's `external_id`: its answer's id, as a JSON path."""
    answer = unwrap(write.answer)
    name = id_field(answer, item_param)
    return answer.path(name) if answer is not None and name else None


def _last_word(name: str) -> str:
    """`issue_number` -> `number`, `userId` -> `id`, `pet-id` -> `id`."""
    words = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)
    return words[-1].lower() if words else name


def _match(body: Located | None, shown: Located | None) -> dict[str, str]:
    """The body's required fields that `shown` (an item, a listed item) has too, both scalars of a common type:
    the shown field's path, the request's."""
    if body is None or shown is None:
        return {}
    sent, seen = body.shape, shown.shape
    names = [n for n in sent.fields if n in sent.required and n in seen.fields and FIELD_NAME.match(n)]
    return {shown.path(n): body.path(n) for n in names if _comparable(sent.fields[n], seen.fields[n])}


def _comparable(sent: Field, shown: Field) -> bool:
    return sent.scalar and shown.scalar and bool((sent.types & shown.types) - {"null"})


def _is_time(field: Field) -> bool:
    return field.format in ("date-time", "date") or bool(field.types & {"integer", "number"})


def _next_page(answer: Shape | None) -> str | None:
    """A list answer's field holding the next page's URL."""
    if answer is None or answer.kind != "object":
        return None
    for name in NEXT_PAGE_FIELDS:
        field = answer.fields.get(name)
        if field is not None and "string" in field.types and (field.format == "uri" or "url" in name.lower()):
            return f"$.{name}"
    return None


def _rule(write: Operation, target: Target, external_id: str | None, read: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": write.name, "method": write.method, "path": target.base_path + rule_path(write.path)}
    if external_id:
        rule["external_id"] = external_id
    rule["reconcile"] = read
    return rule


def checked(suggestion: Suggestion) -> Suggestion:
    """The suggestion, if its rule loads as config.yaml's operation rules do; else none, saying why."""
    if suggestion.rule is None:
        return suggestion
    try:
        OperationRule.model_validate(suggestion.rule)
    except ValidationError as e:
        return Suggestion(suggestion.write, None, note=f"cannot be written as a rule: {describe_validation_error(e)}")
    return suggestion
