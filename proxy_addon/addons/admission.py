"""What the proxy refuses before a request is journaled or forwarded, and why (the contract's 403, 413 and 400).

- **Forbidden destinations** (403 `forbidden-destination`, any method, CONNECT included): the proxy's own admin
  server (the one running in this proxy, and whatever `admin.listen_host`/`listen_port` name, for a
  `receipts admin` beside it) and the proxy's own listen addresses. An agent must never list or settle
  receipts through the proxy. A destination is refused when its port is one of those and its host is, or
  resolves to, an address of this machine (loopback, unspecified, or one it can bind) or the listen host.
- **Body too large** (413 `body-too-large`): a journaled request whose body is over `proxy.max_body`;
  request/bodylimit.py keeps mitmproxy from holding it in memory.
- **Bad in itself** (400 `bad-request`): a journaled request the upstream protocol would not carry (a header
  name or value HTTP/1.1 forbids, a target that is not ASCII, ...): request/wellformed.py.

The Admission addon runs the first two from mitmproxy's `http_connect` and `requestheaders` hooks, which
come before every addon's `request` hook; `refusal` is what the journal addon asks before journaling.
"""

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from mitmproxy import ctx, http

from proxy_addon.log import get_logger
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.request import bodylimit
from proxy_addon.request.wellformed import bad_request
from proxy_addon.rules import answers
from proxy_addon.rules.answers import Answer

log = get_logger("receipts.proxy")

METADATA_KEY = "receipts"
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


# -- forbidden destinations -----------------------------------------------------------------------------------


class OwnAddresses:
    """The proxy's own listening (host, port) pairs, each with what it is ("the admin server", ...)."""

    def __init__(self) -> None:
        self._listening: dict[int, list[tuple[str, str]]] = {}  # port -> [(listen host, what)]
        self._local: dict[str, bool] = {}

    def add(self, host: str | None, port: int | None, what: str) -> None:
        if port:
            self._listening.setdefault(int(port), []).append(((host or "").strip("[]").lower(), what))

    def ports(self) -> frozenset[int]:
        return frozenset(self._listening)

    def is_local(self, address: str) -> bool:
        """Whether connecting to this IP address reaches this machine."""
        known = self._local.get(address)
        if known is None:
            known = self._local[address] = _is_local(address)
        return known

    async def forbidden(self, host: str, port: int, resolve: Callable[..., Any] | None = None) -> str | None:
        """What `host:port` is of ours (for the answer), or None when it is somewhere else."""
        listening = self._listening.get(port)
        if not listening:
            return None
        name = host.strip("[]").lower()
        addresses = await _addresses(name, port, resolve)
        for listen_host, what in listening:
            if name == listen_host or any(a == listen_host or self.is_local(a) for a in addresses):
                return f"{what} ({host}:{port})"
            if listen_host in _WILDCARDS and name in ("localhost", "localhost."):
                return f"{what} ({host}:{port})"
        return None


def _is_local(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))  # only an address of this machine can be bound
        return True
    except OSError:
        return False


async def _addresses(name: str, port: int, resolve: Callable[..., Any] | None) -> list[str]:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
        return [name]
    except ValueError:
        pass
    try:
        infos = await (resolve or asyncio.get_running_loop().getaddrinfo)(name, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []  # not resolvable: nothing of ours can be reached through it
    return [str(info[4][0]) for info in infos]


def refusal(flow: http.HTTPFlow, facts: RequestFacts, max_body: int) -> tuple[Answer, str] | None:
    """For the journal addon, before journaling: the answer to a request refused for what it is, and why."""
    size = bodylimit.over_limit(flow, max_body)
    if size is not None:
        return answers.body_too_large(max_body, size), "body_too_large"
    problem = bad_request(facts)
    if problem is not None:
        return answers.bad_request(problem), "bad_request"
    return None


# -- the addon ------------------------------------------------------------------------------------------------

Respond = Callable[[Answer, http.HTTPFlow], http.Response]


class Admission:
    """Addon: refuses requests to the proxy itself (403) and journaled bodies over `proxy.max_body` (413) from
    the hooks that come before the body is read. `journal` is the Receipts addon (its config), `admin` the
    InProxyAdmin addon (its server, once running), `respond` turns an Answer into the flow's response."""

    def __init__(self, journal: Any, admin: Any, respond: Respond):
        self.journal, self.admin, self.respond = journal, admin, respond
        self.own: OwnAddresses | None = None

    def configure(self, updated: set[str]) -> None:
        self.own = None  # listen addresses or the admin section may have changed: collect them again

    def _own(self) -> OwnAddresses:
        server = getattr(self.admin, "server", None)
        if self.own is None or (server is not None and server.port not in self.own.ports()):
            self.own = self._collect(server)
        return self.own

    def _collect(self, server: Any) -> OwnAddresses:
        own = OwnAddresses()
        try:
            for host, port, *_ in ctx.master.addons.get("proxyserver").listen_addrs():
                own.add(host, port, "this proxy")
        except AttributeError:  # not running under a proxy server (tests)
            pass
        own.add(getattr(ctx.options, "listen_host", ""), getattr(ctx.options, "listen_port", None), "this proxy")
        config = self.journal.config
        if config is not None:
            own.add(config.admin.listen_host, config.admin.listen_port, "the receipts admin server")
        if server is not None:
            own.add(server.settings.listen_host, server.port, "the receipts admin server")
        return own

    def _journaled(self, flow: http.HTTPFlow) -> int | None:
        """`proxy.max_body` when this request may be journaled (from its head), else None."""
        config = self.journal.config
        if config is None or not self.journal.journals(flow):
            return None
        return int(config.proxy.max_body)

    async def forbidden(self, host: str, port: int) -> str | None:
        """What of the proxy's own `host:port` is (the answer's words), or None (the agent API's check asks)."""
        return await self._own().forbidden(host, port)

    async def _refuse_own(self, flow: http.HTTPFlow) -> bool:
        what = await self._own().forbidden(flow.request.host, flow.request.port)
        if what is None:
            return False
        log.warning("request_refused", reason="forbidden_destination", method=flow.request.method, destination=what)
        self._answer(flow, answers.forbidden_destination(what), "forbidden_destination")
        return True

    def _answer(self, flow: http.HTTPFlow, answer: Answer, reason: str) -> None:
        flow.request.stream = False  # mitmproxy refuses an answer set on a request it streams
        flow.response = self.respond(answer, flow)
        flow.metadata[METADATA_KEY] = {"refused": reason}

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        await self._refuse_own(flow)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if await self._refuse_own(flow):
            bodylimit.bound(flow, 0)  # whatever body follows is drained, not kept
            return
        limit = self._journaled(flow)
        if limit is None:
            return
        declared = bodylimit.declared_length(flow.request)
        if declared is not None and declared > limit:
            log.info("request_refused", reason="body_too_large", method=flow.request.method, size=declared, limit=limit)
            self._answer(flow, answers.body_too_large(limit, declared), "body_too_large")
            bodylimit.bound(flow, 0)
        elif declared is None:
            bodylimit.bound(flow, limit)
