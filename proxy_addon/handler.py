"""The journaled request's path, top to bottom: request facts in, an answer out. No mitmproxy here.

1. Journal (on a journal thread): build the intent (fingerprint, account, redacted copy), then
   `store.receipts.record_and_submit`: decide and commit `planned`, commit `submitted`. A duplicate is
   answered from the receipt in its way (duplicates.py); a journal that cannot be written fails closed (503),
   or open when configured. A duplicate of an original still in flight, on a host whose `in_flight.policy`
   is `wait`, first waits for the original's verdict (waiters.py), then is journaled again: it gets what a
   repeat after that verdict gets.
2. Send it upstream once (sender.py) and classify how that ended (verdicts.py).
3. Record the verdict (`transition` from `submitted`), then answer: the upstream's answer, or a problem+json
   of ours, with the receipt's headers.
"""

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from proxy_addon import answers, duplicates, metrics
from proxy_addon.account import AccountHasher
from proxy_addon.answers import Answer
from proxy_addon.config import HostPolicy, ReceiptsConfig
from proxy_addon.exceptions import (
    DuplicateIntentError,
    JournalUnavailableError,
    ReceiptsError,
    StaleStateError,
    SubmitNotRecordedError,
)
from proxy_addon.facts import RequestFacts
from proxy_addon.intent import build_intent
from proxy_addon.log import get_logger
from proxy_addon.operations import OperationRule
from proxy_addon.records import Intent, Verdict, new_operation_id
from proxy_addon.sender import SendResult, Timeouts, UpstreamSender
from proxy_addon.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.verdicts import classify_outcome, storable_response
from proxy_addon.waiters import VerdictWaiters

log = get_logger("receipts.proxy")

@dataclass(frozen=True)
class Outcome:
    """What became of one request: the answer (None: forward it without a receipt, fail open) and what the
    addon notes on the flow."""

    answer: Answer | None
    note: dict[str, Any] = field(default_factory=dict)


class JournalState(Protocol):
    """What the journal addon has set up (None until configured), as the addons beside it see it."""

    @property
    def config(self) -> ReceiptsConfig | None: ...
    @property
    def store(self) -> ReceiptStore | None: ...
    @property
    def handler(self) -> "JournalHandler | None": ...
    @property
    def executor(self) -> Executor | None: ...
    @property
    def instance_id(self) -> str: ...


class JournalHandler:
    def __init__(
        self,
        config: ReceiptsConfig,
        store: ReceiptStore,
        hasher: AccountHasher,
        sender: UpstreamSender,
        executor: Executor,
        instance_id: str,
    ):
        self.config, self.store, self.hasher = config, store, hasher
        self.sender, self.executor, self.instance_id = sender, executor, instance_id
        # operation ids this process is working on; its other planned/submitted receipts are orphans
        self.in_flight: set[str] = set()
        self.waiters = VerdictWaiters(lambda ids: self._on_journal_thread(self.store.receipts.states, ids))

    async def handle(self, facts: RequestFacts) -> Outcome:
        policy = self.config.policy_for(facts.host, facts.port)
        operation_id = new_operation_id()
        self.in_flight.add(operation_id)
        try:
            outcome = await self._journal_and_send(facts, policy, operation_id)
        finally:
            self.in_flight.discard(operation_id)
            self.waiters.settled(operation_id)  # its verdict is recorded (or it never was sent)
        # the answers the proxy makes, in the request's own protocol (protocols/: MCP, GraphQL, JSON-RPC)
        return outcome if outcome.answer is None else replace(outcome, answer=facts.call.answer(outcome.answer))

    async def _journal_and_send(self, facts: RequestFacts, policy: HostPolicy, operation_id: str) -> Outcome:
        agent_key = _header(facts, policy.idempotency_key_header)
        waited = False
        wait_until: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            started = time.perf_counter()
            try:
                intent, rule = await self._on_journal_thread(self._record, facts, policy, agent_key, operation_id)
                break
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
            except JournalUnavailableError as e:
                return self._journal_down(e, facts)
        metrics.journaled(time.perf_counter() - started)

        with structlog.contextvars.bound_contextvars(operation_id=operation_id):
            headers = list(facts.raw_headers)
            if policy.inject_idempotency_key and agent_key is None:
                headers.append((policy.idempotency_key_header.encode(), operation_id.encode()))
            # at debug: the planned->submitted step is in the receipt's history; the verdict line is the canonical one
            log.debug("receipt_submitted", operation=intent.operation, method=facts.method, host=facts.host)
            timeouts = Timeouts(policy.connect_timeout, policy.upstream_timeout, policy.upstream_deadline)
            result = await self.sender.send_once(facts.method, facts.url, headers, facts.raw_body, timeouts)
            verdict = facts.call.verdict(classify_outcome(result, policy, rule), result)  # what its protocol says
            state = await self._record_verdict(intent, facts.call.stored(result), verdict, policy)
            reply = answers.with_receipt(_answer(intent, result, verdict), operation_id, state)
            return Outcome(reply, {"operation_id": operation_id, "state": state})

    async def _on_journal_thread[T](self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    # -- 1. journal ---------------------------------------------------------------------------------------------

    def _record(
        self, facts: RequestFacts, policy: HostPolicy, agent_key: str | None, operation_id: str
    ) -> tuple[Intent, OperationRule | None]:
        """On a journal thread: fingerprint, decide, commit planned, commit submitted."""
        key = agent_key if agent_key is not None else (operation_id if policy.inject_idempotency_key else None)
        max_body = self.config.proxy.max_stored_body
        intent, rule = build_intent(facts, policy, self.hasher, self.instance_id, max_body, key, operation_id)
        try:
            self.store.receipts.record_and_submit(intent, policy.after_success, self.instance_id)
        except SubmitNotRecordedError as e:
            self._abandon_planned(e.operation_id)
            raise
        return intent, rule

    def _abandon_planned(self, operation_id: str) -> None:
        """The request will not be sent: close its `planned` receipt, or the retry that the 503 invites
        would be refused as a duplicate of it for as long as this instance lives (recovery is for dead ones)."""
        try:
            self.store.receipts.transition(
                operation_id,
                State.PLANNED,
                State.REJECTED,
                {"who": self.instance_id, "error": "not_sent"},
                error_code="not_sent",
                error_message="the receipt could not be marked submitted, so the request was not sent",
            )
        except StaleStateError as e:
            log.info("planned_receipt_settled_elsewhere", operation_id=operation_id, state=e.actual)
        except ReceiptsError as e:
            log.error("planned_receipt_left_open", operation_id=operation_id, error=str(e))

    def _refuse(self, e: DuplicateIntentError, policy: HostPolicy, agent_key: str | None, waited: bool) -> Outcome:
        decision = duplicates.decide(e.blocker, policy.after_success)
        assert decision.reason is not None
        reason = decision.reason.value
        log.info("request_refused", reason=reason, operation_id=e.operation_id, state=e.state, waited=waited)
        metrics.duplicate_refused(reason)
        self._note_refusal(reason, e)
        answer = duplicates.refusal_answer(decision, agent_key, waited)
        return Outcome(answer, {"operation_id": e.operation_id, "refused": reason})

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

    def _journal_down(self, e: JournalUnavailableError, facts: RequestFacts) -> Outcome:
        if self.config.proxy.fail_open:
            log.error(
                "journal_unavailable_forwarding_without_receipt",
                error=str(e),
                method=facts.method,
                host=facts.host,
                fail_open=True,
            )
            return Outcome(None, {"fail_open": True})
        log.error("journal_unavailable_request_refused", error=str(e), method=facts.method, host=facts.host)
        return Outcome(answers.journal_unavailable(str(e)), {"refused": "journal_unavailable"})

    # -- 3. the verdict -----------------------------------------------------------------------------------------

    async def _record_verdict(self, intent: Intent, result: SendResult, verdict: Verdict, policy: HostPolicy) -> str:
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
        try:
            await self._on_journal_thread(
                lambda: self.store.receipts.transition(intent.operation_id, State.SUBMITTED, verdict.state, detail, **updates)
            )
        except ReceiptsError as e:
            # The upstream has answered but we could not write it down: the receipt stays `submitted`,
            # and crash recovery or the reconciler settles it. The agent is told which state holds.
            log.error("verdict_not_recorded", state=verdict.state.value, error=str(e))
            return State.SUBMITTED.value
        log.info(
            "receipt_" + verdict.state.value,
            status=verdict.status_code,
            error_code=verdict.error_code,
            external_id=verdict.external_id,
        )
        return verdict.state.value


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
