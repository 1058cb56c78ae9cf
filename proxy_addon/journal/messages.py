"""What the proxy and its journal writer say to each other, and how it is framed on their socket.

Frames are a 4-byte big-endian length and a pickle. Pickle, because both ends are this package (the records
are its dataclasses) and it is the cheapest encoding Python has; it is safe here because the socket is one
end of a socketpair the proxy made and handed to its own child: no other process can reach it.
"""

import math
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.records import ApprovalRecord, Blocker, Intent

_LENGTH = struct.Struct(">I")
HEADER_SIZE = _LENGTH.size


def framed[C: type](cls: C) -> C:
    """Pickle this slots dataclass as its class and field values. dataclasses' own pickling of a slots class
    calls `fields()` on every pickle and unpickle (`_dataclass_getstate`, `_dataclass_setstate`): with two
    messages each way per write, that was 2.5 % of the proxy's CPU under load; this is a third of the cost."""
    values = _values_of(tuple(f.name for f in fields(cls)))

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[assignment,method-assign]
    return cls


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function giving these attributes' values as a tuple: `attrgetter`, in C, for two and more."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda message: (one(message),)
    return lambda message: ()


@framed
@dataclass(frozen=True, slots=True)
class Setup:
    """The first frame: what the writer writes to, and how it logs."""

    database_url: str
    max_batch: int = 64
    log_level: str = "info"
    log_format: str = "json"
    journal_timeout: float = 15.0  # proxy.journal_timeout: the writer bounds its database waits below it


@framed
@dataclass(frozen=True, slots=True)
class Ready:
    """The writer's first frame: it read its setup and is ready to write (its start-up is over)."""


@framed
@dataclass(frozen=True, slots=True)
class Record:
    """Decide, and record the intent as `submitted` (creation and `planned -> submitted` rows) in one commit.
    `successes_block_for`: the host's after_success policy as the decision takes it (duplicates.py), so that
    the writer needs no configuration to read it."""

    intent: Intent
    successes_block_for: float | None
    who: str
    deadline: float = math.inf  # time.monotonic() (one clock for the whole machine) past which nobody waits
    approval: ApprovalAsk | None = None  # its rule asks for a person's approval first


@framed
@dataclass(frozen=True, slots=True)
class Advance:
    """Compare-and-set `expected_from -> to` with column updates and its history row (the verdict). Never
    expired by the writer: a verdict is a fact (the upstream answered), and its agent may have been told it.
    `answered`: the agent was given this verdict; if a recovery that took its proxy for dead guessed
    `outcome_unknown` first, the verdict replaces the guess (writer.py)."""

    operation_id: str
    expected_from: str
    to: str
    detail: dict[str, Any]
    updates: dict[str, Any]
    head: str | None = None  # the receipt's history head as its record left it (None: the writer reads it)
    answered: bool = False


Request = Record | Advance


@framed
@dataclass(frozen=True, slots=True)
class Done:
    """Committed (a Record: recorded as submitted; an Advance: moved), and the receipt's history head now."""

    head: str | None = None


@framed
@dataclass(frozen=True, slots=True)
class Blocked:
    """A Record refused: this earlier receipt is in the way; nothing was written."""

    blocker: Blocker


@framed
@dataclass(frozen=True, slots=True)
class AwaitingApproval:
    """A Record that needs a person's approval and has none usable: this pending (or denied) approval; no receipt."""

    approval: ApprovalRecord


@dataclass(frozen=True, slots=True)
class Failed:
    """Not done. `reason`: `stale` (an Advance found the receipt in `actual`), `not_found`, or `unavailable`
    (the journal could not be written: nothing of this request was committed)."""

    reason: str
    message: str
    actual: str | None = None


Reply = Done | Blocked | AwaitingApproval | Failed


def frame(request_id: int, message: Any) -> bytes:
    body = pickle.dumps((request_id, message), protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def body_size(header: bytes) -> int:
    (size,) = _LENGTH.unpack(header)
    return int(size)


def unframe(body: bytes) -> tuple[int, Any]:
    request_id, message = pickle.loads(body)  # our own child's socketpair: see the module docstring
    return int(request_id), message


def split_frames(buffer: bytearray) -> list[tuple[int, Any]]:
    """The complete frames at the start of `buffer`, removed from it; an incomplete one stays."""
    out: list[tuple[int, Any]] = []
    start = 0
    while len(buffer) - start >= HEADER_SIZE:
        size = body_size(bytes(buffer[start : start + HEADER_SIZE]))
        end = start + HEADER_SIZE + size
        if len(buffer) < end:
            break
        out.append(unframe(bytes(buffer[start + HEADER_SIZE : end])))
        start = end
    del buffer[:start]
    return out
