"""Everything that can go wrong, one class per failure, so callers catch exactly what they handle."""


class ReceiptsError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ReceiptsError):
    """The configuration file or a setting in it is invalid; the message names the key."""


class DatabaseURLError(ConfigError):
    """The database URL cannot be used."""


class JournalUnavailableError(ReceiptsError):
    """A receipt could not be written (database down, disk full, read-only file); nothing may be forwarded."""


class SubmitNotRecordedError(JournalUnavailableError):
    """`planned` was committed but `submitted` could not be: the request must not be sent."""

    def __init__(self, operation_id: str, message: str):
        super().__init__(message)
        self.operation_id = operation_id


class SchemaNotMigratedError(ReceiptsError):
    """The database has not been migrated to the schema this code needs (`receipts db upgrade`)."""


class ReceiptNotFoundError(ReceiptsError):
    """No receipt has this operation id."""


class IllegalTransitionError(ReceiptsError):
    """The contract does not allow this state change."""


class NotResolvableError(ReceiptsError):
    """A person may resolve only a manual_review or outcome_unknown receipt; this one is in another state."""


class InvalidResolutionError(ReceiptsError):
    """A person's resolution is malformed: a state other than succeeded or safe_to_retry, or no note."""


class StaleStateError(ReceiptsError):
    """The receipt is no longer in the expected state: another writer changed it first (lost compare-and-set)."""

    def __init__(self, operation_id: str, expected: str, actual: str | None):
        super().__init__(f"receipt {operation_id} is {actual!r}, not {expected!r}")
        self.operation_id = operation_id
        self.expected = expected
        self.actual = actual


class DuplicateIntentError(ReceiptsError):
    """Base for a request refused because an earlier receipt for the same intent says so."""

    def __init__(self, operation_id: str, state: str, message: str):
        super().__init__(message)
        self.operation_id = operation_id
        self.state = state
        self.intent: object = None  # the refused NewIntent, set by the store


class DuplicateOpenError(DuplicateIntentError):
    """A receipt for the same intent is still open: forwarding again could act twice."""


class DuplicateSucceededError(DuplicateIntentError):
    """The same intent succeeded within the host's after_success window."""

    def __init__(self, operation_id: str, state: str, message: str, receipt: object = None, policy: str = "refuse"):
        super().__init__(operation_id, state, message)
        self.receipt = receipt
        self.policy = policy


class IdempotencyKeyMismatchError(DuplicateIntentError):
    """The agent reused an Idempotency-Key for a request with a different fingerprint."""
