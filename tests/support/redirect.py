"""A mitmproxy addon for tests: names that do not resolve here (api.openai.com, *.receipts.test) are connected
to loopback upstreams instead, as the agent's traffic would reach the real ones. Only the TCP connection is
redirected: the request, its Host and its TLS server name stay as the client sent them, so the receipts
addon sees the real host."""

import asyncio
from typing import Any

from support.proxy import RunningProxy


class Redirect:
    def __init__(self, targets: dict[str, int]):
        self.targets = targets  # host, or ".suffix" -> loopback port

    def server_connect(self, data: Any) -> None:
        host, _port = data.server.address
        for name, port in self.targets.items():
            if host == name or (name.startswith(".") and host.endswith(name)):
                data.server.address = ("127.0.0.1", port)
                return


def add_redirect(proxy: RunningProxy, targets: dict[str, int]) -> None:
    """Adds the redirect to a running in-process proxy, on its own event loop."""

    async def add() -> None:
        proxy.master.addons.add(Redirect(targets))

    asyncio.run_coroutine_threadsafe(add(), proxy.loop).result(10)
