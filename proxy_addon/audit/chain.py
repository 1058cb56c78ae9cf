"""The hash chain over a receipt's history: what each `receipt_transitions.hash` is computed from.

Each history row's hash covers its content and the hash of the row before it for the same receipt; the first
row chains from the receipt's identity (its `genesis`). Changing, removing, inserting or reordering a row
therefore changes every hash after it, and the receipt's head (`receipts.history_head`, the last row's hash)
no longer matches what was written.

The canonical form is JSON with sorted keys and no spaces, ASCII only, timestamps as ISO 8601 UTC with
microseconds: the bytes are the same whether the values come from the writer before its INSERT or are read
back from SQLite or PostgreSQL (both keep microseconds; the JSON detail is stored as the JSON text it was
given). Pure: no database here.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PREFIX = "sha256:"
VERSION = 1  # in every hashed document: a later change of the canonical form is a new version, not a silent one


# made once: json.dumps with arguments of its own builds a new encoder at every call, most of a hash's cost
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes hashed: sorted keys, no spaces, ASCII (a stable serialisation on every Python and database).
    NaN and the infinities are written as Python's json writes them, as the detail column stores them."""
    return _ENCODER.encode(document).encode()


def digest(document: Mapping[str, Any]) -> str:
    return PREFIX + hashlib.sha256(canonical(document)).hexdigest()


def timestamp(value: datetime) -> str:
    """A stored timestamp as hashed: UTC, microseconds (what both databases keep)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime in the audit chain")
    return value.astimezone(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class Identity:
    """What the first history row chains from: the receipt's fixed identity (never rewritten, not even by
    `receipts scrub`, which may rewrite its query)."""

    operation_id: str
    account: str
    intent_fingerprint: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    created_at: datetime

    @classmethod
    def of(cls, row: Any) -> "Identity":
        """From any mapping of the receipt's columns (a row, a dict)."""
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class Chain:
    """One receipt's chain as stored: its identity, its head, and its history rows in id order (mappings of
    the history's columns: id, operation_id, from_state, to_state, recorded_at, detail, hash)."""

    identity: Identity
    head: str | None
    rows: list[dict[str, Any]]


def genesis(identity: Identity) -> str:
    """The hash the first history row of this receipt chains from."""
    target = [identity.method, identity.scheme, identity.host, identity.port, identity.path]
    return digest(
        {
            "v": VERSION,
            "operation_id": identity.operation_id,
            "account": identity.account,
            "fingerprint": identity.intent_fingerprint,
            "target": target,
            "created_at": timestamp(identity.created_at),
        }
    )


def row_hash(
    previous: str, operation_id: str, from_state: str | None, to_state: str, recorded_at: datetime, detail: Any
) -> str:
    """One history row's hash, chained to the `previous` row's (or the genesis)."""
    return digest(
        {
            "v": VERSION,
            "prev": previous,
            "operation_id": operation_id,
            "from_state": from_state,
            "to_state": to_state,
            "recorded_at": timestamp(recorded_at),
            "detail": detail,
        }
    )


def hash_of(row: Mapping[str, Any], previous: str) -> str:
    """The hash a stored history row (a mapping of the history's columns) should carry after `previous`."""
    return row_hash(previous, row["operation_id"], row["from_state"], row["to_state"], row["recorded_at"], row["detail"])


def chained(previous: str, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The hashes `rows` (in order, each with the history columns) should carry, chained from `previous`."""
    out: list[str] = []
    for row in rows:
        previous = hash_of(row, previous)
        out.append(previous)
    return out
