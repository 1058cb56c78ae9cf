"""Running a read rule's verifier controls on the live upstream (controls.py says what they are and how they are
judged): the runs are kept, a fresh passing run is used again, and receipts of one rule reconciled at once wait
for one run rather than each making its own."""

import asyncio
from collections.abc import Callable
from datetime import datetime

from proxy_addon.reconcile.controls import (
    Proof,
    RuleTarget,
    evidence_of,
    fresh,
    judge_negative,
    judge_positive,
    known_by_its_id,
    nonce,
    probe_of,
)
from proxy_addon.reconcile.decide import ReadOutcome
from proxy_addon.reconcile.strategies import Strategy, read_outcome
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.records import ControlRunRecord, ReceiptRecord
from proxy_addon.rules.states import ControlKind, ControlResult
from proxy_addon.store import ReceiptStore


class VerifierControls:
    """Runs a rule's controls on the live upstream and keeps each run; answers whether a verdict may stand."""

    def __init__(self, store: ReceiptStore, strategies: dict[str, Strategy], now: Callable[[], datetime]):
        self.store = store
        self.strategies = strategies
        self.now = now  # the database's clock: runs are compared with it across replicas
        self._running: dict[tuple[str, int, str, str, str], asyncio.Lock] = {}  # one run at a time per rule and account

    async def proof(self, target: RuleTarget, needs: frozenset[ControlKind]) -> Proof:
        """What a verdict rests on: the runs on record that still prove the rule, and the others run now.
        Receipts of one rule and account reconciled at once wait for one run rather than each making its own."""
        b = target.base
        async with self._running.setdefault((b.host, b.port, b.operation, b.account, target.rule.digest), asyncio.Lock()):
            on_record = await self.proof_on_record(target, needs)
            stale = needs - on_record.keys()
            ran = await self.run(target, stale) if stale else []
        return Proof((*on_record.values(), *ran))

    async def proof_on_record(self, target: RuleTarget, needs: frozenset[ControlKind]) -> dict[ControlKind, ControlRunRecord]:
        """The runs that still prove the rule: passed, within `controls.max_age`."""
        return await asyncio.to_thread(self._on_record, target, needs)

    def _on_record(self, target: RuleTarget, needs: frozenset[ControlKind]) -> dict[ControlKind, ControlRunRecord]:
        now, b = self.now(), target.base
        latest = {kind: self.store.controls.latest(b.host, b.port, b.operation, b.account, target.rule.digest, kind) for kind in needs}
        return {kind: run for kind, run in latest.items() if run is not None and fresh(run, now, target.rule.controls.max_age)}

    async def run(self, target: RuleTarget, which: frozenset[ControlKind]) -> list[ControlRunRecord]:
        """Run these controls now (negative first) and keep the runs."""
        runs = []
        if ControlKind.NEGATIVE in which:
            runs.append(await self._negative(target))
        if ControlKind.POSITIVE in which:
            runs.append(await self._positive(target))
        await asyncio.to_thread(self.store.controls.record, runs)
        return runs

    async def _negative(self, target: RuleTarget) -> ControlRunRecord:
        value = nonce()
        probe, params = probe_of(target.base, target.rule, target.params, value)
        outcome = await self._read(target, probe, params)
        at = await asyncio.to_thread(self.now)
        return target.run(ControlKind.NEGATIVE, judge_negative(outcome), at, evidence=evidence_of(outcome, probe=value))

    async def _positive(self, target: RuleTarget) -> ControlRunRecord:
        b = target.base
        by_id = known_by_its_id(b.method, target.op)
        known = await asyncio.to_thread(self.store.controls.known_success, b.host, b.port, b.operation, b.account, by_id)
        if known is None:
            at = await asyncio.to_thread(self.now)
            why = {"reason": f"no succeeded {b.operation} of this account{' with an external_id' if by_id else ''}"}
            return target.run(ControlKind.POSITIVE, ControlResult.NO_KNOWN_SUCCESS, at, evidence=why)
        params = _path_params(target.op, known) or target.params
        outcome = await self._read(target, known, params)
        at = await asyncio.to_thread(self.now)
        evidence = evidence_of(outcome, known_external_id=known.external_id)
        result = judge_positive(outcome, known, target.rule)
        return target.run(ControlKind.POSITIVE, result, at, known_operation_id=known.operation_id, evidence=evidence)

    async def _read(self, target: RuleTarget, receipt: ReceiptRecord, params: dict[str, str]) -> ReadOutcome:
        strategy = self.strategies[target.rule.strategy]
        return await read_outcome(strategy, receipt, target.op, target.rule, params, target.policy)


def _path_params(op: OperationRule, receipt: ReceiptRecord) -> dict[str, str]:
    m = op.path_regex.match(receipt.path)
    return m.groupdict() if m else {}
