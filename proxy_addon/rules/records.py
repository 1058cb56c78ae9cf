"""The journal's record types: what is written (Intent) and what is read back (ReceiptRecord and the rest).

Plain dataclasses with no database import, so that the pure code (decisions, answers, documents) and the
tests use them without the storage layer.
"""

import uuid
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import Enum, StrEnum
from typing import Any

from proxy_addon.rules.states import State


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_operation_id() -> str:
    return "op_" + uuid.uuid4().hex


@dataclass(frozen=True)
class Intent:
    """What the proxy knows about a write before it is sent; secrets already removed."""

    operation: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    intent_fingerprint: str
    account: str
    query: str | None = None
    idempotency_key: str | None = None
    request_headers: dict[str, str] | None = None
    request_body: bytes | None = None
    request_body_size: int = 0
    request_body_truncated: bool = False
    body_note: str | None = None
    proxy_instance: str | None = None
    agent: str | None = None  # who sent it (its proxy authentication), recorded; never part of its identity
    operation_id: str = field(default_factory=new_operation_id)


INTENT_FIELDS = tuple(f.name for f in fields(Intent))


@dataclass(frozen=True)
class ReceiptRecord:
    """One row of `receipts`, as stored."""

    operation_id: str
    operation: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str | None
    intent_fingerprint: str
    account: str
    idempotency_key: str | None
    state: str
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    completed_at: datetime | None
    status_code: int | None
    external_id: str | None
    error_code: str | None
    error_message: str | None
    authentication_recorded: bool
    proxy_instance: str | None
    request_headers: dict[str, Any] | None
    request_body: bytes | None
    request_body_size: int
    request_body_truncated: bool
    body_note: str | None
    response_headers: list[list[str]] | dict[str, Any] | None  # [name, value] pairs; a dict in older rows
    response_body: bytes | None
    response_body_truncated: bool
    response_body_redacted: bool
    reconcile_attempts: int
    next_attempt_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    agent: str | None = None  # the agent that made the write; None: an anonymous agent

    def response_header_pairs(self) -> list[tuple[str, str]]:
        """The stored answer's headers in order, as (name, value); rows from before migration 0003 kept a dict."""
        stored = self.response_headers or []
        pairs = stored.items() if isinstance(stored, dict) else stored
        return [(str(k), str(v)) for k, v in pairs]

    @classmethod
    def from_row(cls, row: Any) -> "ReceiptRecord":
        m = row._mapping
        return cls(**{name: m[name] for name in RECEIPT_FIELDS})


RECEIPT_FIELDS = tuple(f.name for f in fields(ReceiptRecord))


class AnyAgent(Enum):
    """The type of ANY_AGENT (a sentinel, since None already means something: the anonymous agents)."""

    ANY = "any"


ANY_AGENT = AnyAgent.ANY
# Whose receipts a list holds: ANY_AGENT (everyone's: the default of the people's tools), an agent's name (that
# agent's only), or None (the anonymous agents' only). What an agent may see of its own receipts is exactly
# `agent_of(flow)` (agents/identity.py): a name, or None when it is anonymous (the anonymous share one scope).
AgentFilter = str | None | AnyAgent


@dataclass(frozen=True)
class TransitionRecord:
    """One row of the append-only history `receipt_transitions`."""

    id: int
    operation_id: str
    from_state: str | None
    to_state: str
    recorded_at: datetime
    detail: dict[str, Any]
    hash: str | None = None  # its hash in the audit chain (audit/chain.py)


@dataclass(frozen=True)
class RefusalRecord:
    """A request answered from an earlier receipt instead of being forwarded (`duplicate_refusals`)."""

    id: int
    refused_at: datetime
    reason: str
    blocking_operation_id: str
    account: str
    intent_fingerprint: str
    method: str
    host: str
    path: str
    proxy_instance: str | None
    agent: str | None = None  # the agent refused; None: an anonymous agent


@dataclass(frozen=True)
class ControlRunRecord:
    """One run of a verifier control on a read rule (`verifier_controls`), kept with its history."""

    checked_at: datetime
    host: str
    port: int
    operation: str
    account: str
    rule: str  # the rule's digest (reconcile/controls.py, rule_digest): runs of an edited rule prove nothing
    control: str  # ControlKind
    result: str  # ControlResult
    known_operation_id: str | None = None  # the succeeded receipt a positive control was run on
    evidence: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def passed(self) -> bool:
        return self.result == "passed"


@dataclass(frozen=True)
class CheckpointRecord:
    """A signed checkpoint of every receipt's history head (`audit_checkpoints`, audit/checkpoint.py)."""

    id: int
    created_at: datetime
    root: str
    heads: list[list[str]]  # [operation_id, head], sorted by operation id
    signed: str  # the exact document the signature covers
    signature: str
    public_key: str
    note: str | None


@dataclass(frozen=True)
class AuditEventRecord:
    """What was done to a history on purpose (`audit_events`): pruned, rechained, or migrated (`*`)."""

    operation_id: str
    kind: str
    head_before: str | None
    head_after: str | None
    recorded_at: datetime
    note: str | None


@dataclass(frozen=True)
class Recovered:
    """A receipt that recovery or the orphan sweep settled on behalf of an instance."""

    operation_id: str
    instance_id: str
    from_state: str
    to_state: str


class BlockKind(StrEnum):
    """Why an earlier receipt stands in the way of a new one for the same intent."""

    OPEN = "open"  # a receipt of the same intent is open: its outcome is not known yet
    SUCCEEDED = "succeeded"  # the same intent succeeded within the host's after_success window
    KEY_MISMATCH = "key_mismatch"  # the agent's Idempotency-Key was used for another request


@dataclass(frozen=True)
class Blocker:
    """The earlier receipt that decides what a new request for the same intent gets (rules/duplicates.py)."""

    kind: BlockKind
    receipt: ReceiptRecord


@dataclass(frozen=True)
class Verdict:
    """A receipt's next state, the columns that change with it, and what its history row says: what the proxy
    concludes from an upstream's answer (rules/verdicts.py) and the reconciler from a read (reconcile/decide.py)."""

    state: State
    updates: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def status_code(self) -> int | None:
        return self.updates.get("status_code")

    @property
    def error_code(self) -> str | None:
        return self.updates.get("error_code")

    @property
    def error_message(self) -> str | None:
        return self.updates.get("error_message")

    @property
    def external_id(self) -> str | None:
        return self.updates.get("external_id")


@dataclass(frozen=True)
class JournalStats:
    """What the journal holds as a whole (`receipts stats`, the metrics' gauges)."""

    by_state: dict[str, int]  # every state, 0 included
    by_host: dict[str, dict[str, int]]  # host -> state -> count, the states it has
    oldest_open_age_seconds: float | None
    oldest_age_by_state: dict[str, float] = field(default_factory=dict)  # open state -> its oldest receipt's age


def new_approval_id() -> str:
    return "ap_" + uuid.uuid4().hex


@dataclass(frozen=True)
class ApprovalRecord:
    """One row of `approvals`: a person's approval of one intent, asked for by a journaled write that needs it,
    with the request as journaled (redacted, as a receipt keeps it) for the person to judge."""

    approval_id: str
    account: str
    intent_fingerprint: str
    operation: str
    method: str
    scheme: str
    host: str
    port: int
    path: str
    query: str | None
    request_headers: dict[str, Any] | None
    request_body: bytes | None
    request_body_size: int
    request_body_truncated: bool
    body_note: str | None
    state: str  # ApprovalState
    requested_at: datetime
    expires_at: datetime  # pending: by then a person decides; approved: by then it is used; denied: it stands till then
    expires_seconds: float
    asked: int  # how many times the agent sent this request while it was pending
    last_asked_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    operation_id: str | None  # the receipt that used it
    proxy_instance: str | None


APPROVAL_FIELDS = tuple(f.name for f in fields(ApprovalRecord))
