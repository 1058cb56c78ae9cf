"""Addon: this proxy instance's registration, heartbeat and recovery (recovery.py does the work)."""

import asyncio

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.log import get_logger
from proxy_addon.recovery import InstanceLiveness

log = get_logger("receipts.recovery")


class Heartbeat:
    """Addon: registers this proxy instance, heartbeats, recovers dead instances' receipts and its own orphans."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.liveness: InstanceLiveness | None = None
        self._task: asyncio.Task[None] | None = None

    async def running(self) -> None:
        j = self.journal
        if j.config is None or j.store is None or j.executor is None or j.handler is None:
            return
        handler = j.handler
        p = j.config.proxy
        self.liveness = InstanceLiveness(
            j.store, j.instance_id, p.heartbeat_interval, p.instance_dead_after, in_flight=lambda: frozenset(handler.in_flight)
        )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(j.executor, self.liveness.register)
        await loop.run_in_executor(j.executor, self.liveness.sweep)
        self._task = asyncio.create_task(self.liveness.run(j.executor))
        log.info("proxy_started", instance=j.instance_id)

    async def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.liveness is not None and self.journal.executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self.journal.executor, self.liveness.stop)
            except JournalUnavailableError as e:
                log.error("instance_stop_not_recorded", error=str(e))
