"""A journaled request the proxy does not send after all, and its receipt closed by the proxy itself."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError, ReceiptsError, StaleStateError
from proxy_addon.journal.client import JournalClient
from proxy_addon.log import get_logger
from proxy_addon.request.handled import Handled
from proxy_addon.rules import answers
from proxy_addon.rules.states import State
from proxy_addon.rules.verdicts import not_sent
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.proxy")
# A receipt the lost writer may have committed is closed before the 503 (so that the retry it invites is
# journaled, not refused), waiting for that until proxy.journal_timeout has passed (but this long at least);
# then it goes on alone, and the 503 is answered.
CLOSE_UNSENT_AT_LEAST = 0.05
OnJournalThread = Callable[..., Awaitable[Any]]  # the handler's: work(*args) on a journal thread


class UnsentReceipts:
    """Receipts whose requests are not sent after all, closed by the proxy itself as not sent (`rejected`), so that
    the retry the agent may make is journaled, not refused: the agent left, this instance stalled, or the journal
    writer was lost before it answered (the receipt may have been committed)."""

    def __init__(
        self, journal: JournalClient, store: ReceiptStore, on_journal_thread: OnJournalThread, instance_id: str
    ):
        self.journal, self.store, self.instance_id = journal, store, instance_id
        self._on_journal_thread = on_journal_thread

    async def close_unsent(self, operation_id: str, answer_by: float) -> None:
        """`abandon_unsent` on a journal thread, waited for until `answer_by` (CLOSE_UNSENT_AT_LEAST at least)."""
        loop = asyncio.get_running_loop()
        closing = asyncio.ensure_future(self._on_journal_thread(self.abandon_unsent, operation_id))
        try:
            await asyncio.wait_for(asyncio.shield(closing), max(CLOSE_UNSENT_AT_LEAST, answer_by - loop.time()))
        except TimeoutError:
            log.warning("unsent_receipt_still_closing", operation_id=operation_id)

    async def agent_left(self, operation_id: str, head: str | None) -> Handled:
        """The agent disconnected while its receipt was being written: nobody waits for what the upstream would
        answer, so the request is not sent, and its receipt is closed as not sent."""
        closed = not_sent(self.instance_id, "the agent disconnected before its receipt was written, so the request was not sent")
        try:
            await self.advance(operation_id, closed.state, closed.detail, closed.updates, head)
        except ReceiptsError as e:
            log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))
        log.info("request_not_sent_agent_left", operation_id=operation_id)
        answer = answers.with_receipt(answers.not_sent(operation_id, "The agent disconnected"), operation_id, State.REJECTED.value)
        return Handled(answer, {"operation_id": operation_id, "state": State.REJECTED.value, "refused": "agent_left"})

    async def stalled(self, operation_id: str, head: str | None) -> Handled:
        """This instance was frozen (or cut off from its heartbeat) long enough that another may recover its
        receipts while a write is sent: not sent. Its receipt is closed as not sent if it is still `submitted`;
        if a recovery took it already (`outcome_unknown`), the reconciler finds nothing and settles it so."""
        closed = not_sent(self.instance_id, "the proxy stalled (its heartbeats stopped) before it sent the request, so it was not sent")
        state = State.REJECTED.value
        try:
            await self.advance(operation_id, closed.state, closed.detail, closed.updates, head)
        except StaleStateError as e:
            state = e.actual or State.OUTCOME_UNKNOWN.value
        except ReceiptsError as e:
            log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))
            state = State.SUBMITTED.value
        log.warning("request_not_sent_proxy_stalled", operation_id=operation_id, state=state)
        if state == State.REJECTED.value:
            answer = answers.not_sent(operation_id, "The proxy stalled before it sent the request")
        else:
            answer = answers.outcome_unknown(operation_id, "The proxy stalled before it sent the request and another instance took its receipt over; it is settled by reading the upstream", None, state)
        return Handled(answers.with_receipt(answer, operation_id, state), {"operation_id": operation_id, "state": state, "refused": "stalled"})

    def abandon_unsent(self, operation_id: str) -> None:
        """The writer died before it answered: the receipt may have been committed, and the request will not be
        sent. Close it as not sent, or the retry that the 503 invites would be refused as a duplicate of it
        until the orphan sweep settles it (as `outcome_unknown`, since it cannot know it was never sent)."""
        closed = not_sent(self.instance_id, "the journal writer stopped before it answered, so the request was not sent")
        try:
            self.store.receipts.transition(operation_id, State.SUBMITTED, closed.state, closed.detail, **closed.updates)
        except ReceiptNotFoundError:
            return  # it was never committed
        except StaleStateError as e:
            log.info("unsent_receipt_settled_elsewhere", operation_id=operation_id, state=e.actual)
        except ReceiptsError as e:
            log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))

    async def advance(
        self,
        operation_id: str,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None,
    ) -> None:
        """A receipt closed by the proxy itself (not sent): through the writer; if it failed or died meanwhile, once
        more through the store's general path (a writer that committed the step before it died leaves the receipt
        in that state already), which reads the history head itself."""
        try:
            await self.journal.advance(operation_id, State.SUBMITTED, to, detail, updates, head)
            return
        except JournalUnavailableError as e:
            log.warning("verdict_through_writer_failed", operation_id=operation_id, error=str(e))

        def general_path() -> None:
            try:
                self.store.receipts.transition(operation_id, State.SUBMITTED, to, detail, **updates)
            except StaleStateError as stale:
                if stale.actual != to.value:
                    raise

        await self._on_journal_thread(general_path)
