"""What became of one journaled request, as the handler returns it to the addon."""

from dataclasses import dataclass, field
from typing import Any

from proxy_addon.rules.answers import Answer


@dataclass(frozen=True)
class Handled:
    """What became of one request: the answer (None: forward it without a receipt, fail open) and what the
    addon notes on the flow."""

    answer: Answer | None
    note: dict[str, Any] = field(default_factory=dict)
