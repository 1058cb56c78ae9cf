"""What people and tools see of a receipt: its public shape, defined once, and the JSON documents made from it.

`ReceiptView` is the one definition: its fields are the keys of `receipts ls --json` and of the admin API's
receipts, the OpenAPI schema `Receipt` is generated from it (admin/openapi.py), and the CLI's tables take their
columns from it. `receipts show` adds the request as journaled, the stored answer (views/journaled.py's views) and
the history: `ShowView` and `TransitionView` describe that document, and the admin API's schemas are generated
from them too.
"""

import json
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from proxy_addon.agents.tokens import AGENT_NAME_MAX, ANONYMOUS_AGENT
from proxy_addon.rules.records import AgentFilter, ReceiptRecord, TransitionRecord
from proxy_addon.rules.states import OPEN_STATES, State
from proxy_addon.views.journaled import RequestView, ResponseView, request_view, response_view

_TIME = "UTC, RFC 3339; see docs/architecture.md, Which time is which"


class ReceiptView(BaseModel):
    """A receipt as the CLI and the admin API show it: the request's identity and its outcome, never a secret."""

    model_config = ConfigDict(from_attributes=True, frozen=True, extra="forbid")

    operation_id: str = Field(description="the receipt's id, `op_` and 32 hex digits")
    operation: str = Field(
        description="the rule's name, the protocol's (`graphql createIssue`, `mcp tools/call create_ticket`), "
        "or `METHOD host path-template`"
    )
    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str | None = Field(description="the query, secret parameters redacted")
    intent_fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]+$")
    account: str = Field(description="a keyed hash of the credentials, never the credentials")
    agent: str | None = Field(
        description="the agent that made the write, by the name it gave with proxy authentication "
        "(config `agents:`); null: an anonymous agent"
    )
    idempotency_key: str | None
    state: State
    created_at: datetime = Field(description=_TIME)
    updated_at: datetime = Field(description=_TIME)
    submitted_at: datetime | None = Field(description=_TIME)
    completed_at: datetime | None = Field(description=_TIME)
    status_code: int | None = Field(description="the upstream's status")
    external_id: str | None = Field(description="the upstream's id of what the write created")
    error_code: str | None
    error_message: str | None
    authentication_recorded: Literal[False]
    proxy_instance: str | None
    request_body_size: int
    body_note: str | None
    reconcile_attempts: int
    next_attempt_at: datetime | None = Field(description=_TIME)


class TransitionView(BaseModel):
    """One change of a receipt's state, as its history shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_state: State | None
    to_state: State
    recorded_at: datetime = Field(description=_TIME)
    detail: dict[str, Any] = Field(description="who made the change, and its error, evidence or note")


class ShowView(ReceiptView):
    """A receipt with the request as journaled (secrets redacted), the upstream's stored answer (null when none
    was kept), and its whole history, oldest first: the document of `receipts show --json`."""

    request: RequestView
    response: ResponseView | None
    transitions: list[TransitionView]


PUBLIC_COLUMNS: tuple[str, ...] = tuple(ReceiptView.model_fields)
# `receipts ls`: heading -> field of ReceiptView (age is shown from created_at)
LIST_COLUMNS: dict[str, str] = {
    "operation_id": "operation_id",
    "state": "state",
    "agent": "agent",
    "operation": "operation",
    "host": "host",
    "status": "status_code",
    "age": "created_at",
    "error": "error_code",
    "external_id": "external_id",
}
assert set(LIST_COLUMNS.values()) <= set(PUBLIC_COLUMNS), "receipts ls shows fields of ReceiptView only"

# names for several states at once, in `receipts ls --state`, the API's `?state=` and the review page
STATE_GROUPS: dict[str, tuple[State, ...]] = {
    "open": tuple(sorted(OPEN_STATES)),
    "unknown": (State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW),  # nobody knows the outcome yet
}


def expand_states(names: list[str]) -> list[str]:
    """State names and group names (`open`, `unknown`) -> state values; ValueError names an unknown one."""
    states: list[str] = []
    for name in names:
        if name in STATE_GROUPS:
            states.extend(s.value for s in STATE_GROUPS[name])
            continue
        try:
            states.append(State(name).value)
        except ValueError:
            raise ValueError(
                f"unknown state {name!r} (one of {', '.join(s.value for s in State)}, or open, unknown)"
            ) from None
    return states


def receipt_document(r: ReceiptRecord) -> dict[str, Any]:
    return {c: getattr(r, c) for c in PUBLIC_COLUMNS}


def transition_document(t: TransitionRecord) -> dict[str, Any]:
    return {"from_state": t.from_state, "to_state": t.to_state, "recorded_at": t.recorded_at, "detail": t.detail}


def show_document(r: ReceiptRecord, history: list[TransitionRecord]) -> dict[str, Any]:
    """`receipts show --json`: the receipt, the request as journaled, the upstream's stored answer (or null),
    and the whole history."""
    response = response_view(r)
    return {
        **receipt_document(r),
        "request": request_view(r).model_dump(),
        "response": None if response is None else response.model_dump(),
        "transitions": [transition_document(t) for t in history],
    }


class HostFilter(NamedTuple):
    """`--host` / `?host=`: a host, or `host:port` (an IPv6 address in brackets: `[::1]:8080`)."""

    host: str
    port: int | None

    def __str__(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port is None else f"{shown}:{self.port}"


def host_query(f: HostFilter | None) -> dict[str, Any]:
    """The store's `list` arguments for a host filter."""
    return {} if f is None else {"host": f.host, "port": f.port}


def parse_host_filter(text: str) -> HostFilter:
    """`api.example.com`, `127.0.0.1:18112`, `[::1]:8080`, `::1`; ValueError names a bad one."""
    raw = text.strip().lower()
    host, port = raw, ""
    if raw.startswith("["):
        host, bracket, rest = raw[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid host {text!r} (write it as host, host:port or [ipv6]:port)")
        port = rest[1:]
        if rest and not port:
            raise ValueError(f"invalid host {text!r}: no port after the colon")
    elif raw.count(":") == 1:
        host, port = raw.split(":")
        if not port:
            raise ValueError(f"invalid host {text!r}: no port after the colon")
    if not host:
        raise ValueError(f"invalid host {text!r}: no host name")
    if not port:
        return HostFilter(host, None)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid port in host {text!r} (a number from 1 to 65535)")
    return HostFilter(host, int(port))


def parse_agent_filter(text: str) -> AgentFilter:
    """`--agent` / `?agent=`: an agent's name (that agent's receipts), or `anonymous` (those of agents that gave
    none: a name no agent may have); ValueError names a bad one."""
    name = text.strip()
    if name == ANONYMOUS_AGENT:
        return None
    if not name or len(name) > AGENT_NAME_MAX or not name.isprintable():
        raise ValueError(f"invalid agent {text[:80]!r} (an agent's name, or {ANONYMOUS_AGENT})")
    return name


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(document: Any, indent: int | None = 2) -> str:
    return json.dumps(document, indent=indent, default=json_default)
