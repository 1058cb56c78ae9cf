"""Everything that can go wrong, one class per failure, so callers catch exactly what they handle."""

from proxy_addon.rules.records import ApprovalRecord, Blocker, BlockKind, Intent


class ReceiptsError(Exception):
    """Base of every error this package raises on purpose."""


# -- configuration and set-up -----------------------------------------------------------------------------------


class ConfigError(ReceiptsError):
    """The configuration file or a setting in it is invalid; the message names the key."""


class DatabaseURLError(ConfigError):
    """The database URL cannot be used."""


class OpenApiError(ReceiptsError):
    """An OpenAPI document cannot be read, is not OpenAPI 3.x, or has a `$ref` that cannot be resolved."""


class SchemaNotMigratedError(ReceiptsError):
    """The database has not been migrated to the schema this code needs (`receipts db upgrade`)."""


# -- the journal --------------------------------------------------------------------------------------------------


class JournalUnavailableError(ReceiptsError):
    """A receipt could not be written (database down, disk full, read-only file); nothing may be forwarded."""


class WriterLostError(JournalUnavailableError):
    """The journal writer stopped before it answered: what it was asked may or may not have been committed."""


class JournalTimeoutError(WriterLostError):
    """The journal writer did not answer within proxy.journal_timeout: it may have committed it just before."""


class ReceiptNotFoundError(ReceiptsError):
    """No receipt has this operation id."""


class IllegalTransitionError(ReceiptsError):
    """The contract does not allow this state change."""


class StaleStateError(ReceiptsError):
    """The receipt is no longer in the expected state: another writer changed it first (lost compare-and-set)."""

    def __init__(self, operation_id: str, expected: str, actual: str | None):
        super().__init__(f"receipt {operation_id} is {actual!r}, not {expected!r}")
        self.operation_id = operation_id
        self.expected = expected
        self.actual = actual


# -- duplicates: an earlier receipt stands in the way -------------------------------------------------------------


class DuplicateIntentError(ReceiptsError):
    """A request refused because an earlier receipt for the same intent stands in its way (`blocker`)."""

    def __init__(self, blocker: Blocker, intent: Intent, message: str):
        super().__init__(message)
        self.blocker = blocker
        self.intent = intent  # the refused request's intent, for the refusal log

    @property
    def operation_id(self) -> str:
        return self.blocker.receipt.operation_id

    @property
    def state(self) -> str:
        return self.blocker.receipt.state

    @staticmethod
    def of(blocker: Blocker, intent: Intent) -> "DuplicateIntentError":
        """The error for this blocker's kind, with its one-line message."""
        r = blocker.receipt
        if blocker.kind == BlockKind.KEY_MISMATCH:
            key = intent.idempotency_key
            return IdempotencyKeyMismatchError(
                blocker, intent, f"Idempotency-Key {key!r} was used by {r.operation_id} for a different request"
            )
        if blocker.kind == BlockKind.SUCCEEDED:
            when = f"{r.completed_at:%Y-%m-%dT%H:%M:%SZ}" if r.completed_at else "an unknown time"
            return DuplicateSucceededError(blocker, intent, f"the same request succeeded as {r.operation_id} at {when}")
        return DuplicateOpenError(
            blocker, intent, f"a receipt for the same request is still open: {r.operation_id} is {r.state}"
        )


class DuplicateOpenError(DuplicateIntentError):
    """A receipt for the same intent is still open: forwarding again could act twice."""


class DuplicateSucceededError(DuplicateIntentError):
    """The same intent succeeded within the host's after_success window."""


class IdempotencyKeyMismatchError(DuplicateIntentError):
    """The agent reused an Idempotency-Key for a request with a different fingerprint."""


class ApprovalNeededError(ReceiptsError):
    """A write that needs a person's approval has none usable: it waits for `approval` (pending) or was denied."""

    def __init__(self, approval: ApprovalRecord, intent: Intent):
        super().__init__(f"approval {approval.approval_id} is {approval.state}")
        self.approval = approval
        self.intent = intent


class ApprovalNotFoundError(ReceiptsError):
    """No approval has this id."""


class NotDecidableError(ReceiptsError):
    """Only a pending, unexpired approval can be approved or denied; this one is not (its state says why)."""


# -- a person's verdict -------------------------------------------------------------------------------------------


class NotResolvableError(ReceiptsError):
    """A person may resolve only a manual_review or outcome_unknown receipt; this one is in another state."""


class InvalidResolutionError(ReceiptsError):
    """A person's resolution is malformed: a state other than succeeded or safe_to_retry, or no note."""


# -- reconciliation -----------------------------------------------------------------------------------------------


class UnreadableRuleError(ReceiptsError):
    """The rule cannot be applied to this receipt (a value it needs is missing or redacted)."""


class ReadNotPossibleError(ReceiptsError):
    """The read cannot be made now (an environment variable it needs is not set); it proves nothing."""


# -- the admin server ---------------------------------------------------------------------------------------------


class BadRequestError(ReceiptsError):
    """A query parameter or a body the admin API cannot use (400)."""
