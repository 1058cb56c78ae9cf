"""The proxy's side of its journal writer: starts it, hands it the hot path's writes, restarts it when it dies.

Calls are made on the proxy's event loop: a request is a frame written to the socket, its answer a future the
reader task resolves. No thread hand-off, no database work in the proxy's process.

The writer's death is the journal's failure. Every record it had not answered fails at once with
WriterLostError (the proxy answers 503 and sends nothing upstream; whether the writer committed it before it
died is not known, request/unsent.py closes such a receipt itself). A verdict handed over with `advance_now` is
not failed: it is kept, a new writer is started for it at once, and it goes first on the new writer's socket,
before any record, so that a repeat journaled after it still sees it. The next request starts a new writer too;
one that keeps dying before it answered anything is started again only after a growing pause, during which
records fail closed at once (verdicts wait for it).

No request waits longer than proxy.journal_timeout: then it fails (JournalTimeoutError: 503, not sent), and
the writer, which checks each request's deadline before it writes and before it commits, does not write it
after (writer.py); if its commit crossed the deadline, the late answer closes the receipt as not sent. A writer
that stops answering (stopped, looping, waiting on a lock) is found by the same clock: one that has held a
request for proxy.journal_timeout is killed (SIGKILL: it cannot wake up later and act on what it held), and
what it held fails as if it had died. A writer not ready within WRITER_START_TIMEOUT (journal/channel.py) is killed too.
"""

import asyncio
import time
from collections.abc import Callable
from typing import Any

from proxy_addon import metrics
from proxy_addon.exceptions import (
    ApprovalNeededError,
    DuplicateIntentError,
    IllegalTransitionError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
    WriterLostError,
)
from proxy_addon.journal.channel import WriterChannel, _Held
from proxy_addon.journal.messages import Advance, AwaitingApproval, Blocked, Done, Failed, Record, Reply
from proxy_addon.log import get_logger
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Intent
from proxy_addon.rules.states import State, is_allowed
from proxy_addon.rules.verdicts import not_sent

log = get_logger("receipts.proxy")
# Shares of proxy.journal_timeout: the writer is asked to answer within 80 % of it (it writes nothing after:
# writer.py), the caller gives up at 90 %, and the rest is for closing a receipt that may have been committed
# (request/unsent.py). A writer that has held a request for the whole timeout is killed (journal/channel.py).
WRITER_SHARE = 0.8
CALLER_SHARE = 0.9


class JournalClient(WriterChannel):
    """The hot path's calls to the journal writer: `record` a receipt, `advance` it, or hand its verdict over
    (`advance_now`); a receipt the writer committed after its caller gave up is closed as not sent."""

    # -- the hot path's two calls -----------------------------------------------------------------------------

    async def record(
        self, intent: Intent, after_success: AfterSuccess, who: str, approval: ApprovalAsk | None = None
    ) -> str | None:
        """Decide and commit the receipt as `submitted` (creation and `planned -> submitted` rows, one commit);
        its history head, for the verdict's `advance`.

        Raises DuplicateIntentError (nothing written), ApprovalNeededError (no receipt: `approval` asks for a
        person's approval, and there is none usable), JournalUnavailableError (nothing written), or
        WriterLostError (the writer died or was killed first: it may have committed it, or not)."""
        now = time.monotonic()
        request = Record(intent, successes_block_for(after_success), who, now + self.timeout * WRITER_SHARE, approval)
        reply = await self._call(request, now + self.timeout * CALLER_SHARE)
        if isinstance(reply, Blocked):
            raise DuplicateIntentError.of(reply.blocker, intent)
        if isinstance(reply, AwaitingApproval):
            raise ApprovalNeededError(reply.approval, intent)
        _raise_failure(reply, intent.operation_id)
        metrics.transitioned(State.PLANNED)
        metrics.transitioned(State.SUBMITTED)
        return reply.head if isinstance(reply, Done) else None

    async def advance(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None = None,
    ) -> None:
        """`store.receipts.transition`, through the writer: compare-and-set with its history row, one commit
        (journal/writes.py, `advance`). `head`: the history head `record` returned (None: the writer reads it)."""
        request, give_up = self._advance_request(operation_id, expected_from, to, detail, updates, head)
        reply = await self._call(request, give_up)
        _raise_failure(reply, operation_id, expected_from.value)
        metrics.transitioned(to)

    def advance_now(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None,
        then: Callable[[ReceiptsError | None], None],
        answered: bool = False,
    ) -> None:
        """`advance`, handed over before this returns: whatever this client hands over after it, the writer
        commits after it (one socket, read in order). With no writer running, or if the writer is lost before
        it answers, it is kept and is the first thing the next writer is handed (one is started for it at
        once), so the order holds across restarts. `then(error)` once the writer has answered: None when
        committed, else what `advance` would have raised (JournalUnavailableError: the journal could not write
        it; the caller may hand it over again). A callback, not a task: it is on every journaled write's path
        (docs/performance.md). `answered`: its agent was given this verdict (messages.Advance)."""
        request, _ = self._advance_request(operation_id, expected_from, to, detail, updates, head, answered)
        loop = asyncio.get_running_loop()
        held = _Held(request, loop.create_future(), time.monotonic(), kept=True)

        def replied(reply: "asyncio.Future[Reply]") -> None:
            try:
                _raise_failure(reply.result(), operation_id, expected_from.value)
            except ReceiptsError as e:
                then(e)
                return
            metrics.transitioned(to)
            then(None)

        held.answered.add_done_callback(replied)
        if self.closed:
            held.answered.set_exception(WriterLostError("cannot write the journal: the journal writer was stopped"))
            return
        stream = self._stream
        if stream is not None and self._loop is loop:
            self._send(stream, held)
        else:
            self._unsent.append(held)
            self._restart_for_verdicts()

    def _advance_request(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None,
        answered: bool = False,
    ) -> tuple[Advance, float]:
        if not is_allowed(expected_from, to):
            raise IllegalTransitionError(f"{expected_from.value} -> {to.value} is not an allowed transition")
        request = Advance(operation_id, expected_from.value, to.value, detail, updates, head, answered)
        return request, time.monotonic() + self.timeout * CALLER_SHARE

    def _answered_late(self, held: _Held, reply: Reply) -> None:
        """A receipt committed after its caller gave up (the commit crossed the deadline): it was not sent, so
        close it as not sent, through the writer, as request/unsent.py does when the writer is lost."""
        request = held.request
        if not (isinstance(request, Record) and isinstance(reply, Done)):
            return
        operation_id = request.intent.operation_id
        closed = not_sent(request.who, "the journal answered after proxy.journal_timeout, so the request was not sent")

        async def close() -> None:
            try:
                await self.advance(operation_id, State.SUBMITTED, closed.state, closed.detail, closed.updates, reply.head)
            except StaleStateError:
                return  # closed already (request/unsent.py)
            except ReceiptsError as e:
                log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))
                return
            log.warning("late_receipt_closed_as_not_sent", operation_id=operation_id)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


def _raise_failure(reply: Reply, operation_id: str, expected: str | None = None) -> None:
    if isinstance(reply, Done):
        return
    if not isinstance(reply, Failed):
        raise JournalUnavailableError(f"cannot write the journal: the writer answered {type(reply).__name__}")
    if reply.reason == "stale":
        raise StaleStateError(operation_id, expected or "", reply.actual)
    if reply.reason == "not_found":
        raise ReceiptNotFoundError(reply.message)
    raise JournalUnavailableError(reply.message)
