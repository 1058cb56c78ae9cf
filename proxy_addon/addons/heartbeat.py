"""Addon: this proxy instance's registration, heartbeat and recovery (recovery.py does the work)."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.log import get_logger
from proxy_addon.recovery import InstanceLiveness

log = get_logger("receipts.recovery")


class Heartbeat:
    """Addon: registers this proxy instance, heartbeats, recovers dead instances' receipts and its own orphans.

    On a thread of its own, not the database threads the requests share: a stall that fills those (verdicts
    handed over again, slow reads) must not delay the heartbeat until a replica takes this live proxy for dead."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.liveness: InstanceLiveness | None = None
        self.executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    async def running(self) -> None:
        j = self.journal
        if j.config is None or j.store is None or j.handler is None:
            return
        p = j.config.proxy
        self.liveness = InstanceLiveness(j.store, j.instance_id, p.heartbeat_interval, p.instance_dead_after, in_flight=j.in_flight)
        j.liveness = self.liveness  # asked by the handler before each send (recovery.py, `lost_since`)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="receipts-heartbeat")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.liveness.register)
        await loop.run_in_executor(self.executor, self.liveness.sweep)
        self._task = asyncio.create_task(self.liveness.run(self.executor))
        log.info("proxy_started", instance=j.instance_id)

    async def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.liveness is not None and self.executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, self.liveness.stop)
            except JournalUnavailableError as e:
                log.error("instance_stop_not_recorded", error=str(e))
            self.executor.shutdown(wait=False)
