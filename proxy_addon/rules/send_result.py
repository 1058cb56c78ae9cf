"""How one send upstream ended, as data: request/sender.py makes it; the rules (rules/verdicts.py: the verdict,
what is stored), the protocols (their verdicts and answers) and rules/answers.py read it."""

from dataclasses import dataclass
from enum import StrEnum


class SendEnd(StrEnum):
    ANSWERED = "answered"
    NOT_SENT = "not_sent"
    TIMEOUT = "upstream_timeout"
    RESET = "upstream_reset"
    ERROR = "upstream_error"


@dataclass(frozen=True)
class UpstreamResponse:
    status_code: int
    reason: str
    headers: list[tuple[bytes, bytes]]  # as received, less the hop-by-hop ones
    content: bytes  # as received: Content-Encoding not undone


@dataclass(frozen=True)
class SendResult:
    end: SendEnd
    answer: UpstreamResponse | None = None
    error: str | None = None
    elapsed: float = 0.0
    reused: bool = False  # sent on a connection an earlier write had used
    resent: str | None = None  # sent again, once, on a new connection: why the first was provably not processed
