"""The state the addons share: what the Receipts addon has set up, as the others see it."""

from concurrent.futures import Executor
from typing import Protocol

from mitmproxy import http

from proxy_addon.config import ReceiptsConfig
from proxy_addon.journal.client import JournalClient
from proxy_addon.request.handler import Liveness, WriteHandler
from proxy_addon.store import ReceiptStore


class ReceiptsState(Protocol):
    """What the Receipts addon has set up (None until configured), as the addons beside it see it."""

    @property
    def config(self) -> ReceiptsConfig | None: ...
    @property
    def store(self) -> ReceiptStore | None: ...
    @property
    def handler(self) -> WriteHandler | None: ...
    @property
    def executor(self) -> Executor | None: ...
    @property
    def journal(self) -> JournalClient | None: ...
    @property
    def instance_id(self) -> str: ...

    liveness: Liveness  # whether a write must not be sent now (recovery.py, InstanceLiveness.lost_since)

    def in_flight(self) -> frozenset[str]:
        """The operation ids this process is working on (the orphan sweep leaves them alone)."""
        ...

    def journals(self, flow: http.HTTPFlow) -> bool:
        """Whether this flow is journaled (read whole, journaled, sent by the handler), not passed through."""
        ...
