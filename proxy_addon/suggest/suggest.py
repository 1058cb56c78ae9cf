"""Each write's read rule, chosen from what its OpenAPI document says (openapi.py), or none and why.

A read rule settles a write whose answer never came, so it can only use what the request holds: the path's
parameters and the JSON body. The answer's id (`external_id`) is known for a success, never for an unknown;
a rule that reads by it would pass its verifier controls (they run on a known success) and then settle nothing.
Hence:

- **lookup** on the GET at the write's own path, for a write the path names (`PUT`/`PATCH`/`DELETE`, or a
  `POST` to an item): a `DELETE` is done when the item is gone (`absent_means: succeeded`; not where the GET
  may answer a deleted item, `deleted: true`, as Stripe's customers do); a `PUT`/`PATCH` is there when the
  item shows the fields the write set (`match`; `match_when_missing: skip` for those it may leave out); a `PUT`
  without a body (a relation the path names) when the item is there. A write that sets no field the item
  shows is not looked up: the item is there whether or not it took effect.
- **lookup** on the item GET (`/things/{id}`) for a `POST` whose body requires the id the item is read by
  (a client-chosen id).
- **search** of the list GET at the `POST`'s own path (`items` where the answer wraps the list), with `match`
  on the body's fields that the listed items show; as filters, the list's query parameters named as fields
  every request has, and a `since` parameter given the submission time; newest first and the largest page
  where the document offers them, and then the items' creation time as `time_field` (how far back the pages
  must reach); its pages followed by a next page's URL or a cursor (`starting_after`) where the list has one.
- none, with the reason, otherwise (no read at that path, a body neither JSON nor a form, no id in the answer,
  no field to match on).

A suggestion is a start, not a proof: `receipts rules check` runs its verifier controls on the live API.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from proxy_addon.config import describe_validation_error
from proxy_addon.rules.operations import OperationRule
from proxy_addon.suggest.bodies import Located, answer_id, field_name, id_field, match_keys, match_of, unmatched, unwrap
from proxy_addon.suggest.lists import list_items, list_query, paging, time_field
from proxy_addon.suggest.openapi import WRITE_METHODS, Api, Operation, path_placeholders
from proxy_addon.suggest.schemas import Shape
from proxy_addon.suggest.urls import Target, last_placeholder, path_shape, read_headers, read_url, rule_path

TOMBSTONE = "deleted"  # an item's field saying it was deleted, while its GET still answers it (Stripe's)


@dataclass(frozen=True)
class Suggestion:
    write: Operation
    rule: dict[str, Any] | None  # the operation rule as config.yaml writes it, with its read rule; None: no read
    read: Operation | None = None  # the GET its read rule reads
    note: str = ""  # why there is no read rule, or what to know of the one there is

    @property
    def strategy(self) -> str | None:
        return self.rule["reconcile"]["strategy"] if self.rule else None


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
    if write.body_media and write.body is None:
        return Suggestion(write, None, note=f"its body is {write.body_media[0]}: neither JSON nor a form, nothing to compare")
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
    """A write the path names: there when the item shows the fields it set (or, a bodiless PUT, when it is)."""
    item_param = last_placeholder(item.path)
    shown, body = unwrap(item.answer), unwrap(write.body)
    match = match_of(body, shown)
    if not match and (write.body is not None or write.method != "PUT"):
        # only a PUT's path is its whole effect (a relation it makes); any other write may leave the item as it was
        shows = f"it sets no field that {item.where} shows" if write.body is not None else f"a bodiless {write.method}"
        return Suggestion(write, None, note=f"{shows}: the item is there whether or not the write took effect")
    read: dict[str, Any] = {"strategy": "lookup", "url": read_url(target, write.path, item.path), **read_headers(item, target)}
    read.update(match_keys(body, match) if body is not None else {})
    id_name = id_field(shown, item_param)
    if shown is not None and id_name:
        read["id"] = shown.path(id_name)
    return Suggestion(write, _rule(write, target, answer_id(write, item_param), read), item, _not_compared(body, match))


def _not_compared(body: Located | None, match: dict[str, str]) -> str:
    """What a lookup of an item write does not compare: what it sets beyond the matched fields."""
    others = unmatched(body, match)
    if not others:
        return ""
    more = f" and {len(others) - 5} more" if len(others) > 5 else ""
    return f"does not compare {', '.join(others[:5])}{more}: a write is taken as done once the fields it set among the matched ones match"


def _create(write: Operation, listing: Operation | None, item: Operation | None, target: Target) -> Suggestion:
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
    return _search(write, listing, body, answer.path(id_name), target)


def _lookup_by_body_id(write: Operation, item: Operation, body: Located, id_name: str, target: Target) -> Suggestion:
    """A create whose body sets the id the item is read by (a client-chosen id)."""
    read: dict[str, Any] = {
        "strategy": "lookup",
        "url": read_url(target, write.path, item.path, last=body.placeholder(id_name)),
        **read_headers(item, target),
    }
    shown = unwrap(item.answer) or Located(Shape("object"))
    read.update(match_keys(body, match_of(body, shown, leave_out=id_name)))
    read["id"] = shown.path(id_name)
    note = "" if id_name in body.shape.required else f"it reads only the writes that set {id_name}"
    return Suggestion(write, _rule(write, target, answer_id(write, id_name), read), item, note)


def _search(write: Operation, listing: Operation, body: Located, external_id: str, target: Target) -> Suggestion:
    found = list_items(listing.answer)
    if found is None:
        return Suggestion(write, None, note=f"{listing.where} answers no list")
    items_path, item = found
    id_name = field_name(external_id)
    if id_name not in item.fields:
        return Suggestion(write, None, note=f"the items {listing.where} lists have no {id_name}")
    match = match_of(body, Located(item))
    if not match:
        return Suggestion(write, None, note=f"the items {listing.where} lists show none of the fields it sets")
    every_request = [field_name(path) for path in match if field_name(path) in body.shape.required]
    query = list_query(listing, body, every_request)
    read: dict[str, Any] = {
        "strategy": "search",
        "url": read_url(target, write.path, listing.path) + (f"?{'&'.join(query.params)}" if query.params else ""),
        **read_headers(listing, target),
    }
    if items_path:
        read["items"] = items_path
    read.update(**match_keys(body, match), id=f"$.{id_name}")
    created = time_field(item) if query.newest_first else None  # how far back the pages must reach: newest first only
    if created:
        read["time_field"] = created
    read.update(paging(listing, items_path, id_name))
    bounded = query.filtered or created or "next_page" in read or "cursor" in read
    note = "" if bounded else "absence is only as good as the first page: no filter, no order, no next page"
    return Suggestion(write, _rule(write, target, external_id, read), listing, note)


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
