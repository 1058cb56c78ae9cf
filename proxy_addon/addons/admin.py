"""Addon: the admin server inside the proxy, when `admin.enabled` is true."""

import asyncio

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.admin.server import AdminServer
from proxy_addon.log import get_logger

log = get_logger("receipts.admin")


class InProxyAdmin:
    """Addon: the admin server inside the proxy, when `admin.enabled` is true. A port that cannot be had is
    logged (one line) and the proxy goes on without its admin server."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.server: AdminServer | None = None

    async def running(self) -> None:
        j = self.journal
        if j.config is None or j.store is None or not j.config.admin.enabled:
            return
        server = AdminServer(j.config, j.store)
        try:
            await asyncio.to_thread(server.start)
        except OSError as e:
            listen = f"{server.settings.listen_host}:{server.settings.listen_port}"
            log.error("admin_not_started", listen=listen, error=e.strerror or str(e), note="the proxy goes on without it")
            return
        self.server = server
        log.info("admin_started", url=server.url, token_required=server.settings.token is not None)

    async def done(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
