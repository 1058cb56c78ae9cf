"""Serving the admin app: a werkzeug server in a background thread, on its own (`receipts admin`) or in the
proxy (`admin.enabled`, the InProxyAdmin addon: addons/admin.py)."""

import socket
import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from proxy_addon.admin.app import create_app
from proxy_addon.config import AdminSettings, ReceiptsConfig, admin_settings
from proxy_addon.log import get_logger
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.admin")


class _RequestHandler(WSGIRequestHandler):
    """Werkzeug's handler, logging through structlog instead of printing every request."""

    def log(self, type: str, message: str, *args: Any) -> None:
        if type == "error":
            log.warning("admin_http_error", message=message % args if args else message)


class AdminServer:
    """The admin app on a werkzeug server in a background thread."""

    def __init__(self, config: ReceiptsConfig, store: ReceiptStore, settings: AdminSettings | None = None):
        self.settings = settings or config.admin
        self.app = create_app(config, store, self.settings)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "AdminServer":
        """Listen and serve; a port that cannot be had raises OSError (werkzeug, left to bind it, would print
        three lines and exit the process)."""
        host, port = self.settings.listen_host, self.settings.listen_port
        family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        listening = socket.create_server(address[:2], family=family)
        try:
            self._server = make_server(
                host, port, self.app, threaded=True, request_handler=_RequestHandler, fd=listening.fileno()
            )
        finally:
            listening.close()  # werkzeug holds its own duplicate of the descriptor
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.1), name="receipts-admin", daemon=True
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.settings.listen_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def parse_listen(spec: str, name: str = "--admin-listen") -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:8081` for IPv6) -> (host, port), or ValueError naming `name` and what is wrong."""
    host, sep, port = spec.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{name} {spec!r}: expected HOST:PORT, e.g. 0.0.0.0:8081")
    return host.strip("[]") if host.startswith("[") else host, int(port)


def serve_at(config: ReceiptsConfig, store: ReceiptStore, listen: tuple[str, int]) -> AdminServer:
    """The admin server at `listen`, whatever admin.enabled says: a process that serves its /metrics beside its
    work (`receipts reconcile --admin-listen`). ConfigError for an address beyond loopback without the token."""
    settings = admin_settings(config, listen_host=listen[0], listen_port=listen[1], enabled=True)
    return AdminServer(config, store, settings).start()
