"""Addon: the reconcile worker inside the proxy, when `reconcile.in_proxy` is true."""

import asyncio

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.reconcile.worker import Reconciler


class InProxyReconciler:
    """Addon: the reconcile worker inside the proxy, when `reconcile.in_proxy` is true."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self._task: asyncio.Task[None] | None = None

    async def running(self) -> None:
        j = self.journal
        if j.config is not None and j.store is not None and j.config.reconcile.in_proxy:
            reconciler = Reconciler(j.config, j.store, worker_id=f"{j.instance_id}-reconcile")
            self._task = asyncio.create_task(reconciler.run_forever())

    async def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
