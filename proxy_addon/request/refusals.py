"""What a journaled request gets instead of being sent: a duplicate's refusal or replay, the approval it waits
for, or the journal's failure."""

from concurrent.futures import Executor

from proxy_addon import metrics
from proxy_addon.exceptions import ApprovalNeededError, DuplicateIntentError, JournalUnavailableError
from proxy_addon.log import get_logger
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.request.handled import Handled
from proxy_addon.rules import answers, duplicates
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.proxy")


class Refusals:
    """A request answered without being sent: a duplicate refused or replayed (the refusal noted, never awaited),
    or the journal down (503, or forwarded without a receipt under `proxy.fail_open`)."""

    def __init__(self, store: ReceiptStore, executor: Executor, instance_id: str, fail_open: bool):
        self.store, self.executor, self.instance_id, self.fail_open = store, executor, instance_id, fail_open

    def refuse(self, e: DuplicateIntentError, policy: HostPolicy, agent_key: str | None, waited: bool) -> Handled:
        decision = duplicates.decide_retry(e.blocker, policy.after_success)
        assert decision.reason is not None
        reason = decision.reason.value
        log.info("request_refused", reason=reason, operation_id=e.operation_id, state=e.state, waited=waited, agent=e.intent.agent)
        metrics.duplicate_refused(reason)
        self._note(reason, e)
        answer = duplicates.refusal_answer(decision, agent_key, waited)
        return Handled(answer, {"operation_id": e.operation_id, "state": e.state, "refused": reason})

    def _note(self, reason: str, e: DuplicateIntentError) -> None:
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

    def journal_down(self, e: JournalUnavailableError, facts: RequestFacts) -> Handled:
        metrics.journal_unavailable(forwarded=self.fail_open)
        if self.fail_open:
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


def awaiting_approval(e: ApprovalNeededError) -> Handled:
    """Nothing journaled, nothing forwarded: the approval it waits for, or the person's denial."""
    a = e.approval
    log.info("request_awaiting_approval", approval_id=a.approval_id, state=a.state, asked=a.asked, operation=a.operation)
    metrics.approval_awaited(a.state)
    return Handled(answers.approval_answer(a), {"approval_id": a.approval_id, "refused": "approval_" + a.state})
