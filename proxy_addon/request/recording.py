"""Committing a sent write's verdict: before its answer leaves, or while it travels (answer first).

Which verdicts may commit after their answer (`proxy.answer_first`, on by default): those whose receipt, left
`submitted` meanwhile, is taken by every other decision exactly as the verdict will be, so nobody can act on
the difference:
- `succeeded`: open while `submitted`, a repeat is refused (or waits) and is never forwarded; and `submitted`
  counts as "may have happened" for the invalidation of earlier successes on its target, as `succeeded` does.
- `outcome_unknown`: open, and "may have happened", both before and after.
A verdict that releases its intent or ends nothing commits first: `rejected` (an upstream refusal, `not_sent`,
MCP's `input_required`). Left `submitted`, it would refuse the retry its answer invites (on another replica),
and end the window of the earlier successes on its target: a repeat of one of those, sent once the agent heard
"rejected", would be forwarded a second time.

A verdict is never dropped: the journal client keeps it across writer restarts (journal/channel.py), and one
the journal fails (a database down, a lock) is handed over again after a pause, while its receipt stays in
flight (the orphan sweep leaves it alone) and open (a repeat is refused or waits). Shutdown waits for them,
proxy.journal_timeout at most; what is left then is recovery's at the next start.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy_addon import metrics
from proxy_addon.exceptions import JournalUnavailableError, ReceiptsError, StaleStateError
from proxy_addon.journal.client import JournalClient
from proxy_addon.log import get_logger
from proxy_addon.rules.records import Verdict
from proxy_addon.rules.states import State

log = get_logger("receipts.proxy")
ANSWER_FIRST_STATES = frozenset({State.SUCCEEDED, State.OUTCOME_UNKNOWN})
RETRY_PAUSE = 0.2  # seconds before a verdict the journal failed is handed over again, doubled each time
MAX_RETRY_PAUSE = 5.0


@dataclass(slots=True)
class _Verdict:
    operation_id: str
    verdict: Verdict
    detail: dict[str, Any]
    updates: dict[str, Any]
    head: str | None
    answer_first: bool
    committed: "asyncio.Future[str] | None"  # what an answer that waits for the commit awaits
    handed: float  # time.perf_counter() when first handed over
    tries: int = 0


class VerdictRecorder:
    """The verdicts being committed: each one's receipt stays in flight until its verdict is written."""

    def __init__(self, journal: JournalClient, answer_first: bool, journal_timeout: float, settled: Callable[[str], None]):
        self.journal, self.answer_first, self.journal_timeout = journal, answer_first, journal_timeout
        self._settled = settled  # the handler's: the receipt is no longer in flight
        self.recording: set[str] = set()
        self._drained: asyncio.Future[None] | None = None  # drain()'s: set when `recording` empties

    async def record(self, operation_id: str, verdict: Verdict, detail: dict[str, Any], updates: dict[str, Any], head: str | None) -> str:
        """Hand the verdict over; the state to answer with: at once for one that may commit after its answer,
        else once committed (`submitted` if not within proxy.journal_timeout: it is still being handed over,
        and its receipt stays open until it is written)."""
        first = self.answer_first and verdict.state in ANSWER_FIRST_STATES
        committed = None if first else asyncio.get_running_loop().create_future()
        self.recording.add(operation_id)
        self._hand_over(_Verdict(operation_id, verdict, detail, updates, head, first, committed, time.perf_counter()))
        if committed is None:
            return verdict.state.value
        try:
            return await asyncio.wait_for(asyncio.shield(committed), self.journal_timeout)
        except TimeoutError:
            log.warning("verdict_still_committing", operation_id=operation_id, state=verdict.state.value)
            return State.SUBMITTED.value

    def _hand_over(self, v: _Verdict) -> None:
        self.journal.advance_now(
            v.operation_id, State.SUBMITTED, v.verdict.state, v.detail, v.updates, v.head,
            lambda error: self._answered(v, error), answered=v.answer_first,
        )  # fmt: skip

    def _answered(self, v: _Verdict, error: ReceiptsError | None) -> None:
        if isinstance(error, StaleStateError) and error.actual == v.verdict.state.value:
            error = None  # committed by a writer that died before it answered, and handed over again
        if isinstance(error, JournalUnavailableError) and not self.journal.closed:
            v.tries += 1
            pause = min(MAX_RETRY_PAUSE, RETRY_PAUSE * 2 ** (v.tries - 1))
            log.warning("verdict_handed_over_again", operation_id=v.operation_id, error=str(error), in_seconds=pause)
            asyncio.get_running_loop().call_later(pause, self._hand_over, v)
            return
        seconds = time.perf_counter() - v.handed
        state = verdict_written(v.verdict, error, seconds, v.answer_first)
        if error is None:
            metrics.verdict_committed(seconds, v.answer_first)
        self.recording.discard(v.operation_id)
        self._settled(v.operation_id)
        if not self.recording and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if v.committed is not None and not v.committed.done():
            v.committed.set_result(state)

    async def drain(self) -> None:
        """Wait for the verdicts still being committed (on shutdown, before the writer stops),
        proxy.journal_timeout at most: one not written by then is settled by recovery."""
        if not self.recording:
            return
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained), self.journal_timeout)


def verdict_written(verdict: Verdict, error: ReceiptsError | None, seconds: float, answer_first: bool) -> str:
    """Log how writing the verdict ended (`error`: it could not be), and how long after its hand-over (`commit_ms`,
    `answered`: `before` the commit or `after` it: bench/loopback/verdict_lag.py reads them); the state that holds."""
    if isinstance(error, StaleStateError):
        # moved on by someone else first (a person's resolve after a recovery): theirs stands
        log.warning("verdict_not_recorded", state=verdict.state.value, found=error.actual, error=str(error))
        return error.actual or State.SUBMITTED.value
    if error is not None:
        # the journal is closing (shutdown) or the receipt is gone: recovery settles it at the next start
        log.error("verdict_not_recorded", state=verdict.state.value, error=str(error))
        return State.SUBMITTED.value
    log.info(
        "receipt_" + verdict.state.value,
        status=verdict.status_code,
        error_code=verdict.error_code,
        external_id=verdict.external_id,
        commit_ms=round(seconds * 1000, 3),
        answered="before" if answer_first else "after",
    )
    return verdict.state.value
