"""The tables: SQLAlchemy 2 models, the single source of the schema that the Alembic migrations reproduce."""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from proxy_addon.agents.tokens import AGENT_NAME_MAX
from proxy_addon.rules.states import (
    INVALIDATING_METHODS,
    NOT_HAPPENED_STATES,
    OPEN_STATES,
    TERMINAL_STATES,
    ApprovalState,
    ControlKind,
    ControlResult,
    RefusalReason,
    State,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on SQLite (which keeps no zone) as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


HASH_LENGTH = 71  # "sha256:" and 64 hex digits
_STATE_LIST = ", ".join(f"'{s.value}'" for s in State)
_OPEN_LIST = ", ".join(f"'{s.value}'" for s in sorted(OPEN_STATES))
OPEN_STATE_PREDICATE = f"state IN ({_OPEN_LIST})"
TERMINAL_PREDICATE = f"state IN ({', '.join(repr(s.value) for s in sorted(TERMINAL_STATES))})"
# A write that may have changed its target: an invalidating method, not known not to have happened. The
# statements that ask it repeat this text exactly, so that both databases use the partial index it defines.
INVALIDATING_PREDICATE = (
    f"method IN ({', '.join(repr(m) for m in sorted(INVALIDATING_METHODS))}) "
    f"AND state NOT IN ({', '.join(repr(s.value) for s in sorted(NOT_HAPPENED_STATES))})"
)


class Receipt(Base):
    """One row per operation, updated in place as knowledge about its outcome changes."""

    __tablename__ = "receipts"

    operation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    operation: Mapped[str] = mapped_column(Text)
    method: Mapped[str] = mapped_column(String(16))
    scheme: Mapped[str] = mapped_column(String(8))
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    query: Mapped[str | None] = mapped_column(Text)
    intent_fingerprint: Mapped[str] = mapped_column(String(80))
    account: Mapped[str] = mapped_column(String(80))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status_code: Mapped[int | None] = mapped_column(Integer)
    external_id: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    authentication_recorded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    proxy_instance: Mapped[str | None] = mapped_column(String(64))
    request_headers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_body: Mapped[bytes | None] = mapped_column(LargeBinary)
    request_body_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_body_truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    body_note: Mapped[str | None] = mapped_column(Text)
    # the answer as first delivered, for a replay: headers as [name, value] pairs in order (a secret one's value
    # "[REDACTED]"; rows from before migration 0003 hold a dict), body as received (Content-Encoding not undone)
    response_headers: Mapped[list[list[str]] | dict[str, Any] | None] = mapped_column(JSON)
    response_body: Mapped[bytes | None] = mapped_column(LargeBinary)
    response_body_truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # the stored body is not the one delivered (a secret field redacted): kept for people, never replayed
    response_body_redacted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reconcile_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the hash of its last history row (audit/chain.py): the compare-and-set of every step includes it, so
    # each history row is chained to the one before it without reading it first
    history_head: Mapped[str | None] = mapped_column(String(HASH_LENGTH))
    # the order receipts were journaled in, drawn inside the recording transaction (a PostgreSQL sequence,
    # SQLite's max + 1 under its write lock): which of two writes to a target is the later one, whatever the
    # replicas' clocks say; and the newest-first order of every list (keyset pages)
    seq: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    # the agent that made the write, by its proxy authentication (agents/); null: an anonymous agent. Not part
    # of the intent's identity (account + fingerprint): see agents/identity.py
    agent: Mapped[str | None] = mapped_column(String(AGENT_NAME_MAX))

    __table_args__ = (
        CheckConstraint(f"state IN ({_STATE_LIST})", name="state"),
        CheckConstraint("authentication_recorded = false", name="no_authentication"),
        # the lists' filters in journal order: a page reads its index from the cursor on (migration 0009)
        Index("ix_receipts_state_seq", "state", "seq"),
        Index("ix_receipts_host_seq", "host", "seq"),
        Index("ix_receipts_agent_seq", "agent", "seq"),  # one agent's receipts, or the anonymous ones (migration 0010)
        Index("ix_receipts_created_at", "created_at"),
        Index("ix_receipts_account_idempotency_key", "account", "idempotency_key"),
        Index("ix_receipts_account_fingerprint_completed", "account", "intent_fingerprint", "completed_at"),
        Index("ix_receipts_state_next_attempt", "state", "next_attempt_at"),
        Index("ix_receipts_proxy_instance_state", "proxy_instance", "state"),
        Index("ix_receipts_seq", "seq", unique=True),
        # prune and retention: the oldest terminal receipts first, a batch at a time (store/retention.py)
        Index(
            "ix_receipts_terminal_completed_at",
            "completed_at",
            sqlite_where=text(TERMINAL_PREDICATE),
            postgresql_where=text(TERMINAL_PREDICATE),
        ),
        # The writes that may end the replay window of earlier successes on their target (journal/statements.py):
        # only these, so that the question costs an index probe however many other writes the account made.
        Index(
            "ix_receipts_invalidating",
            "account",
            "host",
            "path",
            "port",
            "scheme",
            "seq",
            sqlite_where=text(INVALIDATING_PREDICATE),
            postgresql_where=text(INVALIDATING_PREDICATE),
        ),
        # No open duplicate: at most one open receipt per (account, fingerprint), enforced by the database
        # itself, so that two proxies sharing it can never both forward the same open intent.
        Index(
            "uq_receipts_open_intent",
            "account",
            "intent_fingerprint",
            unique=True,
            sqlite_where=text(OPEN_STATE_PREDICATE),
            postgresql_where=text(OPEN_STATE_PREDICATE),
        ),
    )


class ReceiptTransition(Base):
    """Append-only history: one row per state change, committed together with the change itself."""

    __tablename__ = "receipt_transitions"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    operation_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("receipts.operation_id", ondelete="CASCADE")
    )
    from_state: Mapped[str | None] = mapped_column(String(20))
    to_state: Mapped[str] = mapped_column(String(20))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    # `sha256:<hex>` over this row's content and the previous row's hash for the same receipt (audit/chain.py)
    hash: Mapped[str | None] = mapped_column(String(HASH_LENGTH))

    __table_args__ = (Index("ix_receipt_transitions_operation_id", "operation_id", "id"),)


class ReceiptCount(Base):
    """How many receipts each host has in each state, kept by the database itself (migration 0008's triggers on
    `receipts`: one row `+1` for the state entered, `-1` for the state left, in the same transaction as the
    change, whoever makes it), so that the counts are read without reading the history. Rows are summed by
    (host, state), and folded together now and then (store/retention.py, `fold_counts`): inserts only on the
    write path, so that two writers never wait on one counter row."""

    __tablename__ = "receipt_counts"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(20))
    n: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))


class ProxyInstance(Base):
    """A running (or once running) proxy process; its heartbeat tells live instances from dead ones."""

    __tablename__ = "proxy_instances"

    instance_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    recovered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


_REASON_LIST = ", ".join(f"'{r.value}'" for r in RefusalReason)


class DuplicateRefusal(Base):
    """A request the proxy answered from an earlier receipt (refused or replayed) instead of forwarding it.

    Only what identifies the intent and its blocker: no headers, no body, no secret (`account` is the keyed hash).
    `blocking_operation_id` is not a foreign key, so that a refusal outlives the pruning of the receipt that blocked it.
    """

    __tablename__ = "duplicate_refusals"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    refused_at: Mapped[datetime] = mapped_column(UTCDateTime)
    reason: Mapped[str] = mapped_column(String(40))
    blocking_operation_id: Mapped[str] = mapped_column(String(64))
    account: Mapped[str] = mapped_column(String(80))
    intent_fingerprint: Mapped[str] = mapped_column(String(80))
    method: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text)
    proxy_instance: Mapped[str | None] = mapped_column(String(64))
    agent: Mapped[str | None] = mapped_column(String(AGENT_NAME_MAX))  # the agent refused; null: anonymous

    __table_args__ = (
        CheckConstraint(f"reason IN ({_REASON_LIST})", name="reason"),
        Index("ix_duplicate_refusals_refused_at", "refused_at"),
        Index("ix_duplicate_refusals_blocking_operation_id", "blocking_operation_id"),
    )


class AuditCheckpoint(Base):
    """A signed statement of every receipt's history head at one moment (`receipts checkpoint`).

    `heads` is the sorted [operation_id, head] list itself, so that an auditor holding only the public key can
    tell, later, which receipt was deleted or had its history cut short since. `signed` is the exact document
    the signature covers (audit/checkpoint.py), kept as text so that it verifies byte for byte."""

    __tablename__ = "audit_checkpoints"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    root: Mapped[str] = mapped_column(String(HASH_LENGTH))
    heads: Mapped[list[list[str]]] = mapped_column(JSON)
    signed: Mapped[str] = mapped_column(Text)
    signature: Mapped[str] = mapped_column(Text)
    public_key: Mapped[str] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)


class AuditEvent(Base):
    """What was done to histories on purpose, for `receipts verify` to tell from tampering: `pruned` (the
    receipt and its history deleted by `receipts prune`, with its head then), `rechained` (`receipts scrub`
    rewrote a detail, so its chain was computed again: the head before and after), or `migrated` (once, for
    the whole journal: the histories already there were chained by the migration that added the chain; `note`
    says how many)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    operation_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(20))
    head_before: Mapped[str | None] = mapped_column(String(HASH_LENGTH))
    head_after: Mapped[str | None] = mapped_column(String(HASH_LENGTH))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint("kind IN ('pruned', 'rechained', 'migrated')", name="kind"),
        Index("ix_audit_events_operation_id", "operation_id"),
    )


_CONTROL_LIST = ", ".join(f"'{k.value}'" for k in ControlKind)
_CONTROL_RESULT_LIST = ", ".join(f"'{r.value}'" for r in ControlResult)


class VerifierControl(Base):
    """One run of a verifier control on a read rule, for one host, operation and account; append-only history.

    A verdict of the reconciler trusts a rule only while its latest runs passed within `controls.max_age`.
    `known_operation_id` is not a foreign key, so that a run outlives the pruning of the receipt it was run on.
    `evidence` is what was read, redacted like every transition's detail.
    """

    __tablename__ = "verifier_controls"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    checked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    operation: Mapped[str] = mapped_column(Text)
    account: Mapped[str] = mapped_column(String(80))
    rule: Mapped[str] = mapped_column(String(80))  # the rule's digest: an edited rule is not proven by the old one's runs
    control: Mapped[str] = mapped_column(String(16))
    result: Mapped[str] = mapped_column(String(24))
    known_operation_id: Mapped[str | None] = mapped_column(String(64))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        CheckConstraint(f"control IN ({_CONTROL_LIST})", name="control"),
        CheckConstraint(f"result IN ({_CONTROL_RESULT_LIST})", name="result"),
        Index("ix_verifier_controls_rule", "host", "port", "operation", "account", "rule", "control", "checked_at"),
        Index("ix_verifier_controls_checked_at", "checked_at"),
    )


_APPROVAL_STATE_LIST = ", ".join(f"'{s.value}'" for s in ApprovalState)
PENDING_APPROVAL_PREDICATE = f"state = '{ApprovalState.PENDING.value}'"


class Approval(Base):
    """A person's approval of one intent (account + fingerprint) before a write that needs one is forwarded.

    Holds the request as journaled (redacted, as the receipts keep it: no secret), for the person to judge;
    `operation_id` is the receipt that used it up (not a foreign key: it outlives that receipt's pruning).
    """

    __tablename__ = "approvals"

    approval_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account: Mapped[str] = mapped_column(String(80))
    intent_fingerprint: Mapped[str] = mapped_column(String(80))
    operation: Mapped[str] = mapped_column(Text)
    method: Mapped[str] = mapped_column(String(16))
    scheme: Mapped[str] = mapped_column(String(8))
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    query: Mapped[str | None] = mapped_column(Text)
    request_headers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_body: Mapped[bytes | None] = mapped_column(LargeBinary)
    request_body_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_body_truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    body_note: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_seconds: Mapped[float] = mapped_column(Float)
    asked: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_asked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    decided_by: Mapped[str | None] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)
    operation_id: Mapped[str | None] = mapped_column(String(64))
    proxy_instance: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        CheckConstraint(f"state IN ({_APPROVAL_STATE_LIST})", name="state"),
        Index("ix_approvals_state_requested_at", "state", "requested_at"),
        Index("ix_approvals_account_fingerprint_state", "account", "intent_fingerprint", "state"),
        # one pending approval per intent: two replicas asking at once share it
        Index(
            "uq_approvals_pending_intent",
            "account",
            "intent_fingerprint",
            unique=True,
            sqlite_where=text(PENDING_APPROVAL_PREDICATE),
            postgresql_where=text(PENDING_APPROVAL_PREDICATE),
        ),
    )
