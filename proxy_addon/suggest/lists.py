"""Reading a list back: where a list answer holds its items, how its query narrows it (filters, since the
submission, newest first, the largest page), how its pages follow (a next page's URL, or a cursor), and which of
its items' fields is their creation time."""

from dataclasses import dataclass
from typing import Any

from proxy_addon.suggest.bodies import FIELD_NAME, Located
from proxy_addon.suggest.openapi import Operation
from proxy_addon.suggest.schemas import Field, Shape

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
# a cursor the page hands, and the query parameter the next read takes it in
CURSORS = (("next_cursor", "cursor"), ("nextCursor", "cursor"), ("next_page_token", "page_token"), ("nextPageToken", "pageToken"))
AFTER_ID_PARAMS = ("starting_after",)  # the next page starts after the last item's id (Stripe's)
MORE_FIELDS = ("has_more", "hasMore")


@dataclass(frozen=True)
class ListQuery:
    params: list[str]
    filtered: bool  # by a matched field, or to what came after the submission
    newest_first: bool


def list_query(listing: Operation, body: Located, fields: list[str]) -> ListQuery:
    """The list's query: the fields it filters by (`fields`, which every request has), only what came since the
    submission, newest first, the largest page it allows."""
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


def paging(listing: Operation, items_path: str | None, id_name: str) -> dict[str, Any]:
    """How the read follows the list's pages: the next page's URL in a page (`next_page`), or a cursor the next read
    takes in its query (`cursor`); nothing when the document shows neither (the first page is all that is read)."""
    answer = listing.answer
    if answer is None or answer.kind != "object":
        return {}
    for name in NEXT_PAGE_FIELDS:
        field = answer.fields.get(name)
        if field is not None and "string" in field.types and (field.format == "uri" or "url" in name.lower()):
            return {"next_page": f"$.{name}"}
    params = listing.query()
    more = next((f"$.{n}" for n in MORE_FIELDS if n in answer.fields and "boolean" in answer.fields[n].types), None)
    after = next((p for p in AFTER_ID_PARAMS if p in params), None)
    if after and items_path:
        return {"cursor": {"value": f"{items_path}[-1].{id_name}", "into": f"query:{after}", **({"more": more} if more else {})}}
    for field_name, param in CURSORS:
        if field_name in answer.fields and param in params:
            return {"cursor": {"value": f"$.{field_name}", "into": f"query:{param}", **({"more": more} if more else {})}}
    return {}


def time_field(item: Shape) -> str | None:
    """The listed items' creation time."""
    return next((f"$.{n}" for n in TIME_FIELDS if n in item.fields and _is_time(item.fields[n])), None)


def _is_time(field: Field) -> bool:
    return field.format in ("date-time", "date") or bool(field.types & {"integer", "number"})
