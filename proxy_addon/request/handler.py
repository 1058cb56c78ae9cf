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
"""

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from proxy_addon import metrics, tracing
from proxy_addon.config import HostPolicy, ReceiptsConfig
from proxy_addon.exceptions import (
    ApprovalNeededError,
    DuplicateIntentError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
    WriterLostError,
)
from proxy_addon.journal.client import JournalClient
from proxy_addon.log import get_logger
from proxy_addon.request import answers
from proxy_addon.request.answers import Answer
from proxy_addon.request.facts import RequestFacts
from proxy_addon.request.recording import VerdictRecorder
from proxy_addon.request.sender import Sender, SendResult, Timeouts
from proxy_addon.request.waiters import VerdictWaiters
from proxy_addon.rules import duplicates
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.approvals import approval_for
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.records import Intent, Verdict, new_operation_id
from proxy_addon.rules.states import ApprovalState, State
from proxy_addon.rules.verdicts import not_sent, send_verdict, storable_response
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.proxy")
# Bodies up to this size are fingerprinted on the event loop: a hand-off to a journal thread costs more than
# their canonical form does. Larger ones, whose worst case is far costlier (docs/performance.md, "Hostile
# inputs"), never run there.
INLINE_INTENT_BODY = 16 * 1024
# A receipt the lost writer may have committed is closed before the 503 (so that the retry it invites is
# journaled, not refused), waiting for that until proxy.journal_timeout has passed (but this long at least);
# then it goes on alone, and the 503 is answered.
CLOSE_UNSENT_AT_LEAST = 0.05

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


@dataclass(frozen=True)
class Handled:
    """What became of one request: the answer (None: forward it without a receipt, fail open) and what the
    addon notes on the flow."""

    answer: Answer | None
    note: dict[str, Any] = field(default_factory=dict)


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
        # the answers the proxy makes, in the request's own protocol (protocols/: MCP, GraphQL, JSON-RPC)
        return outcome if outcome.answer is None else replace(outcome, answer=facts.call.answer(outcome.answer))

    async def _journal_and_send(self, facts: RequestFacts, policy: HostPolicy, operation_id: str) -> Handled:
        agent_key = _header(facts, policy.idempotency_key_header)
        started = time.perf_counter()
        intent, rule = await self._intent(facts, policy, agent_key, operation_id)
        ask = approval_for(policy.approval, rule.approval if rule is not None else None)  # None: no approval rule
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
                return _awaiting_approval(e)
            except DuplicateIntentError as e:
                if policy.in_flight.policy != "wait" or not duplicates.in_flight(e.blocker):
                    return self._refuse(e, policy, agent_key, waited)
                if wait_until is None:
                    wait_until = loop.time() + policy.in_flight.max_wait
                remaining = wait_until - loop.time()
                if remaining <= 0 or facts.client_gone():
                    return self._refuse(e, policy, agent_key, waited)
                waited = True
                log.debug("waiting_for_in_flight_original", operation_id=e.operation_id)
                await self.waiters.wait(e.operation_id, e.operation_id in self.in_flight, remaining, facts.client_gone)
                started = time.perf_counter()
            except WriterLostError as e:
                await self._close_unsent(operation_id, answer_by)
                return self._journal_down(e, facts)
            except JournalUnavailableError as e:
                return self._journal_down(e, facts)
        metrics.journaled(time.perf_counter() - started)
        if facts.client_gone():
            return await self._agent_left(operation_id, head)
        if liveness.lost_since(alive):
            return await self._stalled(operation_id, head)

        # structlog's bound_contextvars, without the copy of every context variable it makes to restore this one
        tokens = structlog.contextvars.bind_contextvars(operation_id=operation_id)
        try:
            return await self._send(facts, policy, intent, rule, agent_key, head)
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
    ) -> Handled:
        """2. and 3.: send the journaled request, record its verdict (`head`: its history head), and answer."""
        operation_id = intent.operation_id
        headers = list(facts.raw_headers)
        if policy.inject_idempotency_key and agent_key is None:
            headers.append((policy.idempotency_key_header.encode(), operation_id.encode()))
        # at debug: the planned->submitted step is in the receipt's history; the verdict line is the canonical one
        log.debug("receipt_submitted", operation=intent.operation, method=facts.method, host=facts.host)
        keepalive = policy.upstream_keepalive if policy.upstream_connections == "reuse" else None
        timeouts = Timeouts(policy.connect_timeout, policy.upstream_timeout, policy.upstream_deadline, keepalive)
        result = await self.sender.send_once(facts.method, facts.url, headers, facts.raw_body, timeouts)
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

    async def _intent(
        self, facts: RequestFacts, policy: HostPolicy, agent_key: str | None, operation_id: str
    ) -> tuple[Intent, OperationRule | None]:
        """Fingerprint, account and redacted copy: on the event loop for a small body, else on a journal thread."""
        key = agent_key if agent_key is not None else (operation_id if policy.inject_idempotency_key else None)
        args = (facts, policy, self.hasher, self.instance_id, self.config.proxy.max_stored_body, key, operation_id)
        if len(facts.body) <= INLINE_INTENT_BODY:
            return build_intent(*args)
        return await self._on_journal_thread(build_intent, *args)

    async def _close_unsent(self, operation_id: str, answer_by: float) -> None:
        """`_abandon_unsent` on a journal thread, waited for until `answer_by` (CLOSE_UNSENT_AT_LEAST at least)."""
        loop = asyncio.get_running_loop()
        closing = asyncio.ensure_future(self._on_journal_thread(self._abandon_unsent, operation_id))
        try:
            await asyncio.wait_for(asyncio.shield(closing), max(CLOSE_UNSENT_AT_LEAST, answer_by - loop.time()))
        except TimeoutError:
            log.warning("unsent_receipt_still_closing", operation_id=operation_id)

    async def _agent_left(self, operation_id: str, head: str | None) -> Handled:
        """The agent disconnected while its receipt was being written: nobody waits for what the upstream would
        answer, so the request is not sent, and its receipt is closed as not sent."""
        closed = not_sent(self.instance_id, "the agent disconnected before its receipt was written, so the request was not sent")
        try:
            await self._advance(operation_id, closed.state, closed.detail, closed.updates, head)
        except ReceiptsError as e:
            log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))
        log.info("request_not_sent_agent_left", operation_id=operation_id)
        answer = answers.with_receipt(answers.not_sent(operation_id, "The agent disconnected"), operation_id, State.REJECTED.value)
        return Handled(answer, {"operation_id": operation_id, "state": State.REJECTED.value, "refused": "agent_left"})

    async def _stalled(self, operation_id: str, head: str | None) -> Handled:
        """This instance was frozen (or cut off from its heartbeat) long enough that another may recover its
        receipts while a write is sent: not sent. Its receipt is closed as not sent if it is still `submitted`;
        if a recovery took it already (`outcome_unknown`), the reconciler finds nothing and settles it so."""
        closed = not_sent(self.instance_id, "the proxy stalled (its heartbeats stopped) before it sent the request, so it was not sent")
        state = State.REJECTED.value
        try:
            await self._advance(operation_id, closed.state, closed.detail, closed.updates, head)
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

    def _abandon_unsent(self, operation_id: str) -> None:
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

    def _refuse(self, e: DuplicateIntentError, policy: HostPolicy, agent_key: str | None, waited: bool) -> Handled:
        decision = duplicates.decide_retry(e.blocker, policy.after_success)
        assert decision.reason is not None
        reason = decision.reason.value
        log.info("request_refused", reason=reason, operation_id=e.operation_id, state=e.state, waited=waited)
        metrics.duplicate_refused(reason)
        self._note_refusal(reason, e)
        answer = duplicates.refusal_answer(decision, agent_key, waited)
        return Handled(answer, {"operation_id": e.operation_id, "state": e.state, "refused": reason})

    def _note_refusal(self, reason: str, e: DuplicateIntentError) -> None:
        """Record the refusal on a journal thread, not awaited: it never delays nor fails the answer."""

        def write() -> None:
            try:
                self.store.refusals.record(reason, e.operation_id, e.intent, self.instance_id)
            except Exception as exc:  # noqa: BLE001 - a refusal that cannot be noted is logged, never raised
                log.error("refusal_not_recorded", reason=reason, operation_id=e.operation_id, error=str(exc))

        try:
            self.executor.submit(write)
        except RuntimeError as exc:  # the pool is shutting down
            log.error("refusal_not_recorded", reason=reason, operation_id=e.operation_id, error=str(exc))

    def _journal_down(self, e: JournalUnavailableError, facts: RequestFacts) -> Handled:
        metrics.journal_unavailable(forwarded=self.config.proxy.fail_open)
        if self.config.proxy.fail_open:
            log.error(
                "journal_unavailable_forwarding_without_receipt",
                error=str(e),
                method=facts.method,
                host=facts.host,
                fail_open=True,
            )
            return Handled(None, {"fail_open": True})
        log.error("journal_unavailable_request_refused", error=str(e), method=facts.method, host=facts.host)
        return Handled(answers.journal_unavailable(str(e)), {"refused": "journal_unavailable"})

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

    async def _advance(
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


def _awaiting_approval(e: ApprovalNeededError) -> Handled:
    """Nothing journaled, nothing forwarded: the approval it waits for, or the person's denial."""
    a = e.approval
    log.info("request_awaiting_approval", approval_id=a.approval_id, state=a.state, asked=a.asked, operation=a.operation)
    metrics.approval_awaited(a.state)
    if a.state == ApprovalState.DENIED.value:
        answer = answers.approval_denied(a.approval_id, a.operation, a.decided_by, a.note)
    else:
        answer = answers.approval_required(a.approval_id, a.operation, a.asked, f"{a.expires_at:%Y-%m-%dT%H:%M:%SZ}")
    return Handled(answer, {"approval_id": a.approval_id, "refused": "approval_" + a.state})


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


def _header(facts: RequestFacts, name: str) -> str | None:
    """The header's value, several joined with ", " (as mitmproxy's Headers give it)."""
    wanted = name.lower()
    values = [v for k, v in facts.headers if k.lower() == wanted]
    return ", ".join(values) if values else None
