"""Addon: the journal's housekeeping in the background, on a thread of its own (never the heartbeat's, never the
requests' database threads): the counts folded (store/retention.py, `fold_counts`) every heartbeat interval, and
`retention:` applied every `retention.interval`, a batch at a time."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from proxy_addon import metrics
from proxy_addon.addons.state import ReceiptsState
from proxy_addon.config import ReceiptsConfig
from proxy_addon.exceptions import ReceiptsError
from proxy_addon.log import get_logger
from proxy_addon.store import ReceiptStore
from proxy_addon.store.retention import prune_by_retention

log = get_logger("receipts.housekeeping")


class Housekeeping:
    """Addon: folds the kept counts and prunes by `retention:` (off without the section). Several replicas may
    each run it: a batch another one deleted first is simply not found, a fold finds what is left to fold."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = threading.Event()  # asked between prune batches: shutdown does not wait for a whole prune

    def running(self) -> None:
        j = self.journal
        if j.config is None or j.store is None:
            return
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="receipts-housekeeping")
        self._task = asyncio.get_running_loop().create_task(self._run(j.store, j.config))

    async def _run(self, store: ReceiptStore, config: ReceiptsConfig) -> None:
        loop = asyncio.get_running_loop()
        prune_at = time.monotonic()  # the first prune at the start
        while not self._stopping.is_set():
            try:
                await loop.run_in_executor(self.executor, store.retention.fold_counts)
                if config.retention is not None and time.monotonic() >= prune_at:
                    prune_at = time.monotonic() + config.retention.interval
                    await self._prune(loop, store, config)
            except ReceiptsError as e:
                log.error("housekeeping_failed", error=str(e))
            await asyncio.sleep(config.proxy.heartbeat_interval)

    async def _prune(self, loop: asyncio.AbstractEventLoop, store: ReceiptStore, config: ReceiptsConfig) -> None:
        assert config.retention is not None
        pruned = await loop.run_in_executor(self.executor, prune_by_retention, store.retention, config.retention, self._stopping.is_set)
        metrics.pruned(pruned.as_dict())
        if pruned.receipts or pruned.refusals or pruned.approvals or pruned.control_runs:
            log.info("retention_pruned", **pruned.as_dict())

    async def done(self) -> None:
        """Stop, and wait for the work on its thread (a fold, or a prune's current batch: it stops between two),
        so that no connection of it outlives the proxy's shutdown."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
        if self.executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
