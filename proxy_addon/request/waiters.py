"""Repeats waiting for an in-flight original's verdict (`in_flight.policy: wait`), at no thread and no database
connection each.

A waiter is an asyncio event. One for an original this proxy is sending is set by the handler when it has
recorded that original's verdict (`settled`). One for an original another replica is sending is set by a
single shared poll: one task, one query for all such originals at a time (on a journal thread), with backoff
from POLL_MIN to POLL_MAX while nothing changes; it ends when nobody waits. A waiter also stops at its own
deadline (`max_wait`) and when its client has left, which it checks every CLIENT_CHECK seconds (the client's
connection shows it; no event announces it while a request hook runs). The agent API's `wait` (agents/) is
the same poll, waiting a receipt out of every open state.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from proxy_addon.log import get_logger
from proxy_addon.rules.states import IN_FLIGHT_STATES

log = get_logger("receipts.proxy")

POLL_MIN = 0.05
POLL_MAX = 1.0
CLIENT_CHECK = 0.25
_IN_FLIGHT = frozenset(s.value for s in IN_FLIGHT_STATES)


@dataclass
class _Watch:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0
    remote: bool = False


class VerdictWaiters:
    def __init__(
        self, read_states: Callable[[Sequence[str]], Awaitable[dict[str, str]]], waiting_in: frozenset[str] = _IN_FLIGHT
    ):
        """`read_states(operation_ids)`: their current states, read off the event loop (one query). `waiting_in`:
        the states a receipt is waited out of (in flight, for a repeat; every open state, for the agent API's
        `wait`)."""
        self._read_states = read_states
        self._waiting_in = waiting_in
        self._watches: dict[str, _Watch] = {}
        self._poller: asyncio.Task[None] | None = None
        self._poll_again = asyncio.Event()
        self.waiting = 0  # requests waiting now (read by tests and, one day, a gauge)

    async def wait(self, operation_id: str, local: bool, at_most: float, client_gone: Callable[[], bool]) -> None:
        """Until the receipt has its verdict, `at_most` seconds pass or the client leaves, whichever comes first.
        `local`: this proxy is sending it (the handler will call `settled`); else the shared poll watches it."""
        watch = self._watches.setdefault(operation_id, _Watch())
        if not local and not watch.remote:
            watch.remote = True
            self._poll_again.set()  # a new receipt to watch: poll from POLL_MIN again
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll(), name="receipts in-flight poll")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + at_most
        watch.waiters += 1
        self.waiting += 1
        try:
            while not watch.event.is_set() and not client_gone():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, CLIENT_CHECK)):
                        await watch.event.wait()
        finally:
            self.waiting -= 1
            watch.waiters -= 1
            if watch.waiters == 0 and self._watches.get(operation_id) is watch:
                del self._watches[operation_id]

    def settled(self, operation_id: str) -> None:
        """The receipt has its verdict (or will get none from this proxy): wake whoever waits for it."""
        watch = self._watches.pop(operation_id, None)
        if watch is not None:
            watch.event.set()

    async def _poll(self) -> None:
        interval = POLL_MIN
        while True:
            watched = [op for op, w in self._watches.items() if w.remote]
            if not watched:
                return
            self._poll_again.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._poll_again.wait()
            interval = POLL_MIN if self._poll_again.is_set() else min(interval * 2, POLL_MAX)
            watched = [op for op, w in self._watches.items() if w.remote]
            if not watched:
                return
            try:
                states = await self._read_states(watched)
            except Exception as e:  # noqa: BLE001 - a failed read wakes nobody; the waiters' deadlines still hold
                log.warning("in_flight_poll_failed", error=str(e))
                continue
            for op in watched:
                if states.get(op) not in self._waiting_in:  # a verdict, or the receipt is gone
                    self.settled(op)

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for op in list(self._watches):
            self.settled(op)
