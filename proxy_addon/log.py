"""structlog, configured once at the entry point: JSON lines in production, a readable console on a TTY.

No secret reaches the log (rules/redaction.py says what one is): every structlog line's text values go through
`redaction.scrub_text`, and so does every record of Python's logging, mitmproxy's own lines included (its
"Bad HTTP request line: b'GET http://user:password@host/?access_token=...'" among them), through a record
factory installed once (`scrub_standard_logging`).
"""

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

from proxy_addon.rules.redaction import scrub_text

_configured = False
_scrubbing = False


def _scrub_event(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # `timestamp` is TimeStamper's, set just before (its colons would send every line's through the patterns)
    return {k: scrub_text(v) if isinstance(v, str) and k != "timestamp" else v for k, v in event.items()}


def scrub_standard_logging() -> None:
    """Make every record of Python's logging carry its message scrubbed (idempotent; wraps the factory in place)."""
    global _scrubbing
    if _scrubbing:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format is logging's to report, not ours
            return record
        scrubbed = scrub_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, ()
        return record

    logging.setLogRecordFactory(factory)
    _scrubbing = True


def configure_logging(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    import structlog  # here, not at the top: see DeferredLogger

    global _configured
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    renderer: Any = structlog.dev.ConsoleRenderer(colors=False) if fmt == "console" else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _scrub_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    _configured = True
    scrub_standard_logging()


def get_logger(name: str) -> Any:
    import structlog

    return structlog.get_logger(name)


class DeferredLogger:
    """A logger whose structlog is imported, and set up, at its first line. For the journal writer process: it
    logs only when a write fails, and structlog with what it imports (rich among them) would be a good part of
    its start-up, which every start of a proxy waits on. Python's logging is scrubbed from `configure` on."""

    def __init__(self, name: str):
        self.name = name
        self._setup: tuple[str, str] | None = None
        self._logger: Any = None

    def configure(self, level: str, fmt: str) -> None:
        """What `configure_logging` is given at the first line (until then nothing of structlog is loaded)."""
        self._setup = (level, fmt)
        scrub_standard_logging()

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            if self._setup is not None:
                configure_logging(*self._setup)
            self._logger = get_logger(self.name)
        return getattr(self._logger, method)
