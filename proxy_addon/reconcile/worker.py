"""The reconciliation worker: lease outcome_unknown receipts, read each by its rule, record the verdict.

Each receipt is leased (outcome_unknown -> reconciling), read according to its operation's rule in
config.yaml (strategies.py), and given a verdict with the evidence in its history (decide.py). A pass
claims each receipt at most once; one whose lease ran out before its read is left to the next pass.
Runs as `receipts reconcile --once | --loop`, or inside the proxy (`reconcile.in_proxy`, InProxyReconciler).
"""

import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from proxy_addon import metrics, tracing
from proxy_addon.config import ReceiptsConfig
from proxy_addon.exceptions import StaleStateError
from proxy_addon.log import configure_logging, get_logger
from proxy_addon.protocols.routing import receipt_rule
from proxy_addon.reconcile.control_runs import VerifierControls
from proxy_addon.reconcile.controls import RuleTarget, controls_needed, unproven_verdict
from proxy_addon.reconcile.decide import Found, ReadOutcome, read_verdict
from proxy_addon.reconcile.strategies import STRATEGIES, Reader, Strategy, read_outcome
from proxy_addon.recovery import InstanceLiveness
from proxy_addon.rules.records import ReceiptRecord, Verdict, utcnow
from proxy_addon.rules.states import ControlKind, State
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.reconcile")

MAX_BATCHES_PER_PASS = 1000


class HostRateLimiter:
    """At most `rate` reads per second to each host, spaced evenly."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self._next: dict[str, float] = {}

    async def wait(self, host: str) -> None:
        now = time.monotonic()
        slot = max(now, self._next.get(host, now))
        self._next[host] = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


@dataclass
class PassReport:
    claimed: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items())) or "nothing due"
        return f"reconciled {self.claimed}: {parts}"


class Reconciler:
    def __init__(self, config: ReceiptsConfig, store: ReceiptStore, worker_id: str | None = None):
        self.config = config
        self.store = store
        self.settings = config.reconcile
        self.worker_id = worker_id or f"worker-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.limiter = HostRateLimiter(self.settings.per_host_rate)
        self._strategies: dict[str, Strategy] = {}
        self._controls = VerifierControls(store, self._strategies, store.db.now)  # a new one each pass: its locks

    async def run_once(self) -> PassReport:
        """Release expired leases, recover dead proxies' receipts, then work the due queue until it is empty."""
        report = PassReport()
        # a receipt put back during this pass waits for the next one, whatever its backoff; database time,
        # as next_attempt_at is compared with it there (this worker's clock may be off)
        pass_started = await asyncio.to_thread(self.store.db.now)
        await asyncio.to_thread(self.store.queue.release_expired, self.worker_id)
        await asyncio.to_thread(self._recover_dead_proxies)
        async with httpx.AsyncClient(trust_env=False, verify=self.settings.verify_tls) as client:
            reader = Reader(client, self.limiter)
            self._strategies = {name: strategy(reader) for name, strategy in STRATEGIES.items()}
            self._controls = VerifierControls(self.store, self._strategies, self.store.db.now)
            semaphore = asyncio.Semaphore(self.settings.concurrency)
            for _ in range(MAX_BATCHES_PER_PASS):
                # the lease runs out `lease` after the database's now at the claim, which is after this
                # moment: by this process's monotonic clock it is held until lease_ends, whatever its wall clock
                lease_ends = time.monotonic() + self.settings.lease
                claimed = await asyncio.to_thread(
                    self.store.queue.claim, self.worker_id, self.settings.lease, self.settings.batch_size, pass_started
                )
                if not claimed:
                    break
                report.claimed += len(claimed)
                verdicts = await asyncio.gather(*[self._bounded(semaphore, r, lease_ends) for r in claimed])
                report.verdicts.update(v for v in verdicts if v)
        return report

    async def run_forever(self) -> None:
        while True:
            try:
                report = await self.run_once()
                if report.claimed:
                    log.info("reconcile_pass", worker=self.worker_id, claimed=report.claimed, **report.verdicts)
            except Exception as e:  # noqa: BLE001 - a pass that failed is logged and tried again; the loop never dies
                log.error("reconcile_pass_failed", error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.settings.interval)

    def _recover_dead_proxies(self) -> None:
        p = self.config.proxy
        InstanceLiveness(self.store, self.worker_id, p.heartbeat_interval, p.instance_dead_after).sweep()

    async def _bounded(self, semaphore: asyncio.Semaphore, receipt: ReceiptRecord, lease_ends: float) -> str | None:
        async with semaphore:
            if time.monotonic() >= lease_ends:
                # it waited for a slot until its lease ran out: another worker may hold it by now, so no
                # read (nor re-send) is made under a lease that is gone; the next pass releases it
                log.warning("lease_expired_before_read", operation_id=receipt.operation_id, worker=self.worker_id)
                return None
            try:
                return await self.reconcile(receipt)
            except StaleStateError:
                log.warning("lease_lost", operation_id=receipt.operation_id, worker=self.worker_id)
                return None
            except Exception as e:  # noqa: BLE001
                # the verdict could not be written (database down, a bug): the lease expires and the
                # receipt returns to the queue; the other receipts of this pass go on
                log.error("verdict_not_recorded", operation_id=receipt.operation_id, error=f"{type(e).__name__}: {e}")
                return None

    async def reconcile(self, receipt: ReceiptRecord) -> str:
        """Read one leased receipt's upstream by its rule and record the verdict; returns the state given."""
        if not tracing.enabled:
            return (await self._settle(receipt))[0]
        # the write span's context is in the verdict row the proxy wrote (`traceparent` in its detail)
        history = await asyncio.to_thread(self.store.receipts.history, receipt.operation_id)
        with tracing.verdict_span(receipt, history, self.worker_id) as span:
            state, detail = await self._settle(receipt)
            tracing.end_verdict(span, state, detail)
        return state

    async def _settle(self, receipt: ReceiptRecord) -> tuple[str, dict[str, Any]]:
        """The verdict read and recorded: the state given, and the detail its history row holds."""
        verdict = await self._verdict(receipt)
        unknown_for = round((utcnow() - (receipt.submitted_at or receipt.created_at)).total_seconds(), 1)
        detail = {"who": self.worker_id, "unknown_for_seconds": unknown_for, **verdict.detail}
        await asyncio.to_thread(
            self.store.receipts.transition,
            receipt.operation_id,
            State.RECONCILING,
            verdict.state,
            detail,
            self.worker_id,
            **verdict.updates,
        )
        log.info("reconcile_verdict", operation_id=receipt.operation_id, state=verdict.state.value, result=detail.get("result"))
        metrics.reconcile_verdict(verdict.state)
        return verdict.state.value, detail

    async def _verdict(self, receipt: ReceiptRecord) -> Verdict:
        policy = self.config.policy_for(receipt.host, receipt.port)
        # the rule for its route, or for its very call (an MCP tool, a GraphQL operation) when one names it
        matched = receipt_rule(policy, receipt.method, receipt.path, receipt.operation, receipt.query)
        op, params = matched if matched else (None, {})
        if op is None or op.reconcile is None:
            reason = f"no reconcile rule for {receipt.operation}" if op is None else f"rule {op.name} has no reconcile"
            reason += f": {op.unreadable}" if op is not None and op.unreadable else ""
            return Verdict(State.MANUAL_REVIEW, {"lease_owner": None, "lease_expires_at": None}, {"reason": reason})
        rule = op.reconcile
        outcome = await read_outcome(self._strategies[rule.strategy], receipt, op, rule, params, policy)
        # database time: the retry time it writes is compared with the database's clock when claiming
        now = await asyncio.to_thread(self.store.db.now)
        verdict = read_verdict(receipt, rule, op.retry_safe, outcome, now, self.settings.backoff)
        needs = controls_needed(rule, verdict, outcome)
        if not needs:
            return verdict
        return await self._proven(RuleTarget(op, rule, params, policy, receipt), outcome, verdict, needs)

    async def _proven(self, target: RuleTarget, outcome: ReadOutcome, verdict: Verdict, needs: frozenset[ControlKind]) -> Verdict:
        """The verdict, if the rule is proven for it (the controls run now when their proof is stale); else a
        person's, or a failed read when a control's own read failed."""
        proof = await self._controls.proof(target, needs)
        failed_read = proof.read_failed
        if failed_read is not None:
            evidence = {**outcome.evidence, "reason": f"the {failed_read.control} control's read failed", "control_read": failed_read.evidence}
            now = await asyncio.to_thread(self.store.db.now)
            return read_verdict(target.base, target.rule, target.op.retry_safe, ReadOutcome(Found.FAILED, evidence), now, self.settings.backoff)
        if proof.failed is not None:
            b = target.base
            log.warning("verifier_unproven", operation_id=b.operation_id, host=b.host, operation=b.operation, failed=proof.failed)
            return unproven_verdict(target.rule, outcome, proof, verdict.state)
        return Verdict(verdict.state, verdict.updates, {**verdict.detail, "controls": proof.summary()})


def run_reconcile(config: ReceiptsConfig, store: ReceiptStore, once: bool) -> int:
    """Entry point of `receipts reconcile --once | --loop`."""
    configure_logging(config.logging.level, config.logging.format)
    reconciler = Reconciler(config, store)
    tracing.set_up()  # from the OTEL_* variables; off unless they ask for it
    try:
        if once:
            report = asyncio.run(reconciler.run_once())
            print(report.summary())
            return 0
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(reconciler.run_forever())
        return 0
    finally:
        tracing.shut_down()  # the verdict spans still queued are exported before the command ends
