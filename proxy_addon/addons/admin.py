"""Addon: the admin server inside the proxy, when `admin.enabled` is true or `receipts_admin_listen` names where."""

import asyncio
from typing import Any

from mitmproxy import ctx, exceptions

from proxy_addon.addons.state import ReceiptsState
from proxy_addon.admin.server import AdminServer, parse_listen
from proxy_addon.config import AdminSettings, ReceiptsConfig, admin_settings
from proxy_addon.exceptions import ConfigError
from proxy_addon.log import get_logger

log = get_logger("receipts.admin")


class InProxyAdmin:
    """Addon: the admin server inside the proxy. A port that cannot be had, or a listen address that needs a
    token none is set for, is logged (one line) and the proxy goes on without its admin server."""

    def __init__(self, journal: ReceiptsState):
        self.journal = journal
        self.server: AdminServer | None = None
        self.listen: tuple[str, int] | None = None  # receipts_admin_listen, parsed

    def load(self, loader: Any) -> None:
        loader.add_option(
            "receipts_admin_listen",
            str,
            "",
            "HOST:PORT where the proxy serves its admin server (JSON API, review page, /metrics), whatever "
            "admin.enabled says, e.g. 0.0.0.0:8081 for a Prometheus in another container (an address other than "
            "loopback needs the token of admin.token_env). Empty: the config's admin section decides.",
        )

    def configure(self, updated: set[str]) -> None:
        if "receipts_admin_listen" not in updated:
            return
        try:
            spec = ctx.options.receipts_admin_listen
            self.listen = parse_listen(spec, "receipts_admin_listen") if spec else None
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from e

    async def running(self) -> None:
        j = self.journal
        if j.config is None or j.store is None:
            return
        try:
            settings = self._settings(j.config, self.listen)
        except ConfigError as e:
            log.error("admin_not_started", error=str(e), note="the proxy goes on without it")
            return
        if settings is None:
            return
        server = AdminServer(j.config, j.store, settings)
        try:
            await asyncio.to_thread(server.start)
        except OSError as e:
            listen = f"{server.settings.listen_host}:{server.settings.listen_port}"
            log.error("admin_not_started", listen=listen, error=e.strerror or str(e), note="the proxy goes on without it")
            return
        self.server = server
        log.info("admin_started", url=server.url, token_required=server.settings.token is not None)

    @staticmethod
    def _settings(config: ReceiptsConfig, listen: tuple[str, int] | None) -> AdminSettings | None:
        """The admin section, or where `receipts_admin_listen` says; None when neither turns it on."""
        if listen is not None:
            return admin_settings(config, listen_host=listen[0], listen_port=listen[1], enabled=True)
        return config.admin if config.admin.enabled else None

    async def done(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
