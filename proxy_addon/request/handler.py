"""The journaled request's path, top to bottom: request facts in, an answer out. No mitmproxy here.

1. Journal: build the intent (fingerprint, account, redacted copy; on a journal thread when the body is
   large), then the journal writer (journal/) decides and commits the receipt as `submitted`, with its
   `planned` and `planned -> submitted` rows, in one commit. A duplicate is answered from the receipt in its
   way (rules/duplicates.py); a journal that cannot be written fails closed (503), or open when configured. A duplicate of an original still in flight, on a host whose `in_flight.policy`
   is `wait`, first waits for the original's verdict (request/waiters.py), then is journaled again: it gets what a
   repeat after that verdict gets.
2. Send it upstream once (request/sender.py) and classify how that ended (rules/verdicts.py).
3. Hand the verdict to the writer (compare-and-set from `submitted`) and answer: the upstream's answer, or a
   problem+json of ours, with the receipt's headers (`X-Receipt-State`: the verdict's state). A `succeeded` or
   `outcome_unknown` verdict commits while the answer travels (answer first), every other one before it
   (request/recording.py says why each is safe). Why answer first: at concurrency 1 that commit and its
   hand-offs were most of what a journaled write added to the agent's wait (docs/performance.md). Once the
   request was sent, nothing that fails can make the answer "not sent": it is `outcome_unknown` at worst.
What a request gets instead of being sent (a refusal, a replay, an approval to wait for, the journal's 503) is
request/refusals.py's; a receipt whose request is not sent after all (the agent left, the proxy stalled, the
writer was lost) is closed by request/unsent.py.
"""

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, Protocol

import structlog

from proxy_addon import metrics, tracing
from proxy_addon.config import ReceiptsConfig
from proxy_addon.exceptions import (
    ApprovalNeededError,
    DuplicateIntentError,
    JournalUnavailableError,
    WriterLostError,
)
from proxy_addon.journal.client import JournalClient
from proxy_addon.log import get_logger
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.request.handled import Handled
from proxy_addon.request.intake import WriteIntent, write_intent
from proxy_addon.request.recording import VerdictRecorder
from proxy_addon.request.refusals import Refusals, awaiting_approval
from proxy_addon.request.sender import Sender, Timeouts
from proxy_addon.request.unsent import UnsentReceipts
from proxy_addon.request.waiters import VerdictWaiters
from proxy_addon.rules import answers, duplicates
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.answers import Answer
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.records import Intent, Verdict, new_operation_id
from proxy_addon.rules.send_result import SendEnd, SendResult
from proxy_addon.rules.states import State
from proxy_addon.rules.verdicts import send_verdict, storable_response
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.proxy")
# Bodies up to this size are fingerprinted on the event loop: a hand-off to a journal thread costs more than
# their canonical form does. Larger ones, whose worst case is far costlier (docs/performance.md, "Hostile
# inputs"), never run there.
INLINE_INTENT_BODY = 16 * 1024

class Liveness(Protocol):
    """Whether another instance may have taken this one for dead (recovery.py, InstanceLiveness)."""

    def mark(self) -> int: ...
    def lost_since(self, mark: int) -> bool: ...


class _Alive:
    """No heartbeat runs (a handler in a test, a proxy not started yet): never taken for dead."""

    def mark(self) -> int:
        return 0

    def lost_since(self, mark: int) -> bool:
        return False


ALIVE: Liveness = _Alive()


class WriteHandler:
    def __init__(
        self,
        config: ReceiptsConfig,
        store: ReceiptStore,
        journal: JournalClient,
        hasher: AccountHasher,
        sender: Sender,
        executor: Executor,
        instance_id: str,
        liveness: Callable[[], Liveness] = lambda: ALIVE,
    ):
        self.config, self.store, self.journal, self.hasher = config, store, journal, hasher
        self.sender, self.executor, self.instance_id = sender, executor, instance_id
        self.liveness = liveness  # the Heartbeat's, once it runs: a write is not sent once this instance may be taken for dead
        # operation ids this process is working on; its other planned/submitted receipts are orphans
        self.in_flight: set[str] = set()
        # the verdicts being committed (each receipt stays in in_flight until its verdict is written)
        self._idle: asyncio.Event | None = None  # idle()'s: set when in_flight empties
        self.verdicts = VerdictRecorder(journal, config.proxy.answer_first, config.proxy.journal_timeout, self._settled)
        self.waiters = VerdictWaiters(lambda ids: self._on_journal_thread(self.store.receipts.states, ids))
        self.unsent = UnsentReceipts(journal, store, self._on_journal_thread, instance_id)
        self.refusals = Refusals(store, executor, instance_id, config.proxy.fail_open)

    async def handle(self, facts: RequestFacts) -> Handled:
        policy = self.config.policy_for(facts.host, facts.port)
        operation_id = new_operation_id()
        self.in_flight.add(operation_id)
        try:
            outcome = await self._journal_and_send(facts, policy, operation_id)
        finally:
            if operation_id not in self.verdicts.recording:
                self._settled(operation_id)
        if outcome.note.get("operation_id") == operation_id:  # answered with a receipt of its own
            metrics.write_answered(facts.host, outcome.note["state"])
        if outcome.answer is None:
            return outcome
        # the answers the proxy makes name where to ask for their receipt later, and come in the request's own
        # protocol (protocols/: MCP, GraphQL, JSON-RPC)
        answer = answers.with_receipt_url(outcome.answer, self.config.agent_api.receipt_url)
        return replace(outcome, answer=facts.call.answer(answer))

    async def _journal_and_send(self, facts: RequestFacts, policy: HostPolicy, operation_id: str) -> Handled:
        started = time.perf_counter()
        written = await self._intent(facts, policy, operation_id)
        intent, rule, agent_key, ask = written.intent, written.rule, written.agent_key, written.approval
        if tracing.enabled:
            tracing.name_write(facts, intent.operation)
        waited = False
        wait_until: float | None = None
        head: str | None = None  # its history head, as its record left it: the verdict's compare-and-set needs it
        loop = asyncio.get_running_loop()
        liveness = self.liveness()
        alive = liveness.mark()
        while True:
            answer_by = loop.time() + self.config.proxy.journal_timeout
            try:
                head = await self.journal.record(intent, policy.after_success, self.instance_id, ask)
                break
            except ApprovalNeededError as e:
                return awaiting_approval(e)
            except DuplicateIntentError as e:
                if policy.in_flight.policy != "wait" or not duplicates.in_flight(e.blocker):
                    return self.refusals.refuse(e, policy, agent_key, waited)
                if wait_until is None:
                    wait_until = loop.time() + policy.in_flight.max_wait
                remaining = wait_until - loop.time()
                if remaining <= 0 or facts.client_gone():
                    return self.refusals.refuse(e, policy, agent_key, waited)
                waited = True
                log.debug("waiting_for_in_flight_original", operation_id=e.operation_id)
                await self.waiters.wait(e.operation_id, e.operation_id in self.in_flight, remaining, facts.client_gone)
                started = time.perf_counter()
            except WriterLostError as e:
                await self.unsent.close_unsent(operation_id, answer_by)
                return self.refusals.journal_down(e, facts)
            except JournalUnavailableError as e:
                return self.refusals.journal_down(e, facts)
        metrics.journaled(time.perf_counter() - started)
        metrics.agent_journaled(intent.agent)
        if facts.client_gone():
            return await self.unsent.agent_left(operation_id, head)
        if liveness.lost_since(alive):
            return await self.unsent.stalled(operation_id, head)

        # structlog's bound_contextvars, without the copy of every context variable it makes to restore this one
        tokens = structlog.contextvars.bind_contextvars(operation_id=operation_id, agent=intent.agent)
        try:
            return await self._send(facts, policy, intent, rule, agent_key, head, lambda: not liveness.lost_since(alive))
        finally:
            structlog.contextvars.reset_contextvars(**tokens)

    async def _send(
        self,
        facts: RequestFacts,
        policy: HostPolicy,
        intent: Intent,
        rule: OperationRule | None,
        agent_key: str | None,
        head: str | None,
        may_send: Callable[[], bool],
    ) -> Handled:
        """2. and 3.: send the journaled request, record its verdict (`head`: its history head), and answer.

        `may_send` is asked again just before the first byte goes out (after the connect, which may take up to
        connect_timeout): a proxy frozen in between may have been taken for dead, its receipt recovered and
        settled `safe_to_retry` by a read that found nothing; sent after all, the write would contradict it."""
        operation_id = intent.operation_id
        headers = list(facts.raw_headers)
        if policy.inject_idempotency_key and agent_key is None:
            headers.append((policy.idempotency_key_header.encode(), operation_id.encode()))
        # at debug: the planned->submitted step is in the receipt's history; the verdict line is the canonical one
        log.debug("receipt_submitted", operation=intent.operation, method=facts.method, host=facts.host)
        keepalive = policy.upstream_keepalive if policy.upstream_connections == "reuse" else None
        timeouts = Timeouts(policy.connect_timeout, policy.upstream_timeout, policy.upstream_deadline, keepalive)
        result = await self.sender.send_once(facts.method, facts.url, headers, facts.raw_body, timeouts, may_send)
        if result.end == SendEnd.NOT_SENT and not may_send():
            return await self.unsent.stalled(operation_id, head)
        state: str | None = None  # the verdict's, once handed over
        try:
            verdict = facts.call.verdict(send_verdict(result, policy, rule), result)  # what its protocol says
            state = await self._record_verdict(intent, facts.call.stored(result), verdict, policy, head)
            reply = answers.with_receipt(_answer(intent, result, verdict), operation_id, state)
        except Exception as e:  # sent, so never the addon's fail-closed "not sent" 503: outcome_unknown
            log.exception("verdict_failed_after_send", error=repr(e))
            return await self._unknown_after_send(operation_id, head, e, state)
        return Handled(reply, {"operation_id": operation_id, "state": state})

    async def _unknown_after_send(self, operation_id: str, head: str | None, error: Exception, state: str | None) -> Handled:
        """The proxy failed between the send and the answer: the agent cannot have the upstream's answer, and is
        told so (504 outcome-unknown). The journal says outcome_unknown too, unless the verdict was handed over
        already (`state`): then X-Receipt-State names that state, which the journal ends in."""
        why = f"the proxy failed after the request was sent ({type(error).__name__})"
        if state is None and operation_id not in self.verdicts.recording:
            unknown = Verdict(State.OUTCOME_UNKNOWN, {"error_code": "proxy_error", "error_message": why}, {"who": self.instance_id, "error": "proxy_error"})
            state = await self.verdicts.record(operation_id, unknown, unknown.detail, unknown.updates, head)
        state = state or State.OUTCOME_UNKNOWN.value
        reply = answers.with_receipt(answers.outcome_unknown(operation_id, why[0].upper() + why[1:], None, state), operation_id, state)
        return Handled(reply, {"operation_id": operation_id, "state": state})

    def _settled(self, operation_id: str) -> None:
        self.in_flight.discard(operation_id)
        self.waiters.settled(operation_id)  # its verdict is recorded (or it never was sent, or it could not be)
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    async def idle(self) -> None:
        """Return once no request is in flight (a handler replaced at run time finishes its own first)."""
        while self.in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()

    async def drain(self) -> None:
        """Wait for the verdicts still being committed (shutdown): request/recording.py."""
        await self.verdicts.drain()

    async def aclose(self) -> None:
        """Wait for the verdicts still being committed, then stop the waiters, the sender and the journal writer."""
        await self.drain()
        await self.waiters.aclose()
        await self.sender.aclose()
        await self.journal.aclose()

    async def _on_journal_thread[T](self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    # -- 1. journal ---------------------------------------------------------------------------------------------

    async def _intent(self, facts: RequestFacts, policy: HostPolicy, operation_id: str) -> WriteIntent:
        """Fingerprint, account and redacted copy (intake.py): on the event loop for a small body, else on a journal
        thread."""
        args = (facts, policy, self.hasher, self.instance_id, self.config.proxy.max_stored_body, operation_id)
        if len(facts.body) <= INLINE_INTENT_BODY:
            return write_intent(*args)
        return await self._on_journal_thread(write_intent, *args)


    # -- 3. the verdict -----------------------------------------------------------------------------------------

    async def _record_verdict(
        self, intent: Intent, result: SendResult, verdict: Verdict, policy: HostPolicy, head: str | None
    ) -> str:
        """Hand the verdict over (request/recording.py); the state to answer with."""
        detail, updates = self._verdict_rows(result, verdict, policy)
        return await self.verdicts.record(intent.operation_id, verdict, detail, updates, head)

    def _verdict_rows(self, result: SendResult, verdict: Verdict, policy: HostPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
        """The verdict's history detail and the receipt's columns it sets."""
        updates = dict(verdict.updates)
        if verdict.state == State.SUCCEEDED:
            updates.update(storable_response(result, policy, self.config.proxy.max_stored_response))
        detail = {
            "who": self.instance_id,
            "end": result.end.value,
            "status": verdict.status_code,
            "error": verdict.error_message,
            "elapsed_ms": round(result.elapsed * 1000, 1),
        }
        if result.reused:
            detail["connection"] = "reused"
        if result.resent is not None:
            detail["resent"] = result.resent  # refused unprocessed (HTTP/2), sent again once on a new connection
        if tracing.enabled:
            detail[tracing.TRACEPARENT] = tracing.write_traceparent()  # what a reconcile verdict's span links to
        return detail, updates


def _answer(intent: Intent, result: SendResult, verdict: Verdict) -> Answer:
    if verdict.state == State.OUTCOME_UNKNOWN:
        reason = (
            f"The upstream answered {verdict.status_code}"
            if verdict.status_code
            else f"The upstream did not answer ({verdict.error_code}: {verdict.error_message})"
        )
        return answers.outcome_unknown(intent.operation_id, reason, verdict.status_code)
    if result.answer is None:
        return answers.not_sent(intent.operation_id, f"Could not connect to the upstream ({verdict.error_message})")
    return answers.from_upstream(result.answer)

