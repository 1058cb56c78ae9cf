"""The asking agent's own receipts: list, get, wait and check, as the REST API (api.py) and the MCP tools (mcp.py)
both serve them, with the same arguments and the same one-line errors.

Every database read runs on the agent API's own threads (`executor`), never on the proxy's event loop and never
on the journal's threads, so that agents asking cannot slow the writes down. `wait` holds no thread: it is an
event, set by one shared poll of the waited receipts' states (request/waiters.py: one query for every waiter,
every 50 ms to 1 s as nothing changes), bounded by MAX_WAIT.
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from proxy_addon.agent_api import check, documents
from proxy_addon.agent_api.check import CheckContext, CheckRequest, Forbidden
from proxy_addon.agent_api.scope import AgentScope
from proxy_addon.config import HostPolicy, ReceiptsConfig
from proxy_addon.exceptions import BadRequestError, JournalUnavailableError, ReceiptNotFoundError
from proxy_addon.journal.writes import Foreseen
from proxy_addon.request.intake import WriteIntent
from proxy_addon.request.waiters import VerdictWaiters
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.states import OPEN_STATES
from proxy_addon.store import ReceiptStore
from proxy_addon.units import parse_duration
from proxy_addon.views.documents import expand_states, receipt_document

MAX_WAIT = 60.0  # a longer wait is refused (400): an agent asks again rather than hold a request open for minutes
LIST_LIMIT = 50
MAX_LIST_LIMIT = 200
_OPEN = frozenset(s.value for s in OPEN_STATES)


class Sources(Protocol):
    """What the agent API reads: the proxy's config and store, its account key and its instance id (the proxy's
    WriteHandler has them all; `receipts mcp` makes its own)."""

    @property
    def config(self) -> ReceiptsConfig: ...
    @property
    def store(self) -> ReceiptStore: ...
    @property
    def hasher(self) -> AccountHasher: ...
    @property
    def instance_id(self) -> str: ...


async def _not_ours(host: str, port: int) -> str | None:
    return None


class OwnReceipts:
    """`sources()`: what to read now (None while the proxy is not set up: 503); `forbidden`: the proxy's own
    addresses (addons/admission.py), for `check`."""

    def __init__(self, sources: Callable[[], Sources | None], executor: Executor, forbidden: Forbidden = _not_ours):
        self._sources, self.executor, self.forbidden = sources, executor, forbidden
        self.waiters = VerdictWaiters(self._states, waiting_in=_OPEN)

    def sources(self) -> Sources:
        current = self._sources()
        if current is None:
            raise JournalUnavailableError("the proxy is not set up yet (no config loaded)")
        return current

    async def _read[T](self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    async def _states(self, operation_ids: Any) -> dict[str, str]:
        return await self._read(self.sources().store.receipts.states, operation_ids)

    # -- list -------------------------------------------------------------------------------------------------

    async def list(
        self, scope: AgentScope, state: list[str], operation: str | None, since: str | None, limit: Any, after: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page, newest first, and the `after` of the next (None on the last). BadRequestError names a bad
        argument."""
        states = _states_arg(state)
        since_at, count = _since_arg(since), _limit_arg(limit)
        store = self.sources().store
        if after and not await self._sees(scope, after):
            raise BadRequestError(f"after: no receipt {after}")  # another agent's is not one to page from

        def read() -> list[ReceiptRecord]:
            return store.receipts.list(
                states=states, operation=operation or None, since=since_at, limit=count, after=after or None, agent=scope.agent
            )

        try:
            rows = await self._read(read)
        except ReceiptNotFoundError:
            raise BadRequestError(f"after: no receipt {after}") from None
        return [receipt_document(r) for r in rows], (rows[-1].operation_id if len(rows) == count else None)

    async def _sees(self, scope: AgentScope, operation_id: str) -> bool:
        store = self.sources().store
        try:
            return scope.sees(await self._read(store.receipts.get, operation_id))
        except ReceiptNotFoundError:
            return False

    # -- get and wait ---------------------------------------------------------------------------------------------

    async def get(self, scope: AgentScope, operation_id: str) -> dict[str, Any]:
        """The receipt with its history, what happened and what a retry would get; ReceiptNotFoundError for
        another agent's as for none."""
        sources = self.sources()
        store, config = sources.store, sources.config

        def read() -> dict[str, Any]:
            receipt = self._own(store, scope, operation_id)
            return documents.receipt_document(store, config, receipt, store.receipts.history(operation_id))

        return await self._read(read)

    async def wait(
        self, scope: AgentScope, operation_id: str, wait: Any, gone: Callable[[], bool] = lambda: False
    ) -> dict[str, Any]:
        """`get`, once the receipt has left every open state, or once `wait` has passed (then still open), or when
        the asker has left (`gone`)."""
        seconds = wait_arg(wait)
        first = await self.get(scope, operation_id)
        if not first["open"] or seconds == 0:
            return first
        await self.waiters.wait(operation_id, False, seconds, gone)
        return await self.get(scope, operation_id)

    @staticmethod
    def _own(store: ReceiptStore, scope: AgentScope, operation_id: str) -> ReceiptRecord:
        receipt = store.receipts.get(operation_id)
        if not scope.sees(receipt):
            raise ReceiptNotFoundError(f"no receipt {operation_id}")  # another agent's: as if there were none
        return receipt

    # -- check ------------------------------------------------------------------------------------------------

    async def check(self, scope: AgentScope, request: CheckRequest) -> dict[str, Any]:
        """What the proxy would do now with this request (check.py); nothing journaled, forwarded or stored."""
        sources = self.sources()
        context = CheckContext(sources.config, sources.hasher, sources.instance_id, self.forbidden, self._read)

        async def foresee(written: WriteIntent, policy: HostPolicy) -> Foreseen:
            return await self._read(sources.store.receipts.foresee, written.intent, policy.after_success, written.approval)

        checked = await check.check_write(request, context, foresee)
        visible = checked.receipt is not None and scope.sees(checked.receipt)
        return documents.check_document(checked, sources.config, visible)

    async def aclose(self) -> None:
        await self.waiters.aclose()


# -- arguments, as the API's query and the MCP tools' arguments give them --------------------------------------


def _states_arg(values: list[str]) -> list[str] | None:
    raw = [p.strip() for v in values for p in v.split(",") if p.strip()]
    try:
        return expand_states(raw) or None
    except ValueError as e:
        raise BadRequestError(f"state: {e}") from None


def _since_arg(value: str | None) -> datetime | None:
    """A duration back from now (`10m`), or an RFC 3339 time (`2026-05-01T12:00:00Z`)."""
    if not value:
        return None
    try:
        return datetime.now(UTC) - timedelta(seconds=parse_duration(value))
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadRequestError(f"since: {value!r} is neither a duration (10m, 2h) nor an RFC 3339 time") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _limit_arg(value: Any) -> int:
    try:
        limit = LIST_LIMIT if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        raise BadRequestError("limit must be a whole number") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise BadRequestError(f"limit must be between 1 and {MAX_LIST_LIMIT}")
    return limit


def wait_arg(value: Any) -> float:
    """`30s`, `1m` or a number of seconds, at most MAX_WAIT."""
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise BadRequestError(f"wait: {e}") from None
    if seconds > MAX_WAIT:
        raise BadRequestError(f"wait: at most {MAX_WAIT:g}s (ask again after it)")
    return seconds
