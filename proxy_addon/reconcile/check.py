"""`receipts rules check`: every read rule's verifier controls, run now on the live upstream and kept, so that a
rule just written is proven (or shown broken) before any unknown needs it.

A rule is checked for each host and operation its receipts used: the positive control on the newest success of
that operation (with an external id; any, for a DELETE), the negative control on a probe made from it (or from
the newest receipt of the operation, when none succeeded yet). A rule no receipt has used yet is listed, not
proven, with nothing run: there is no effect to run it on.
"""

import asyncio
from datetime import datetime

import httpx

from proxy_addon.config import ReceiptsConfig
from proxy_addon.protocols.routing import receipt_rule
from proxy_addon.reconcile.control_runs import VerifierControls
from proxy_addon.reconcile.controls import BOTH, READ_RULE_STRATEGIES, RuleTarget, is_known_effect
from proxy_addon.reconcile.strategies import STRATEGIES, Reader, Strategy
from proxy_addon.reconcile.worker import HostRateLimiter
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.states import ControlKind
from proxy_addon.store import ReceiptStore
from proxy_addon.views.rule_health import RuleHealth, proven

RECEIPTS_SCANNED = 5000  # the newest receipts looked through for each rule's known success


def targets_of(config: ReceiptsConfig, receipts: list[ReceiptRecord]) -> dict[tuple[str, int, str], RuleTarget]:
    """For each host, port and operation with a read rule: the receipt its controls run on (newest first in
    `receipts`): the newest known success if there is one, else the newest receipt."""
    targets: dict[tuple[str, int, str], RuleTarget] = {}
    for receipt in receipts:
        key = (receipt.host, receipt.port, receipt.operation)
        if key in targets and is_known_effect(targets[key].base, targets[key].op):
            continue
        policy = config.policy_for(receipt.host, receipt.port)
        matched = receipt_rule(policy, receipt.method, receipt.path, receipt.operation, receipt.query)
        if matched is None or matched[0].reconcile is None or matched[0].reconcile.strategy not in READ_RULE_STRATEGIES:
            continue
        op, params = matched
        if key not in targets or is_known_effect(receipt, op):
            targets[key] = RuleTarget(op, matched[0].reconcile, params, policy, receipt)
    return targets


def unused_rules(config: ReceiptsConfig, checked: list[RuleTarget]) -> list[tuple[str, OperationRule]]:
    """The read rules, by host key, that no receipt has used: nothing to run their controls on."""
    used = {id(t.op) for t in checked}
    return [
        (host, op)
        for host, entry in sorted(config.hosts.items())
        for op in entry.operations
        if op.reconcile is not None and op.reconcile.strategy in READ_RULE_STRATEGIES and id(op) not in used
    ]


async def check_rules(config: ReceiptsConfig, store: ReceiptStore) -> list[RuleHealth]:
    """Run both controls of every rule a receipt used, keep the runs, and say which rules are proven."""
    receipts = await asyncio.to_thread(store.receipts.list, None, None, None, RECEIPTS_SCANNED)
    targets = targets_of(config, receipts)
    settings = config.reconcile
    health = []
    async with httpx.AsyncClient(trust_env=False, verify=settings.verify_tls) as client:
        reader = Reader(client, HostRateLimiter(settings.per_host_rate))
        strategies: dict[str, Strategy] = {name: strategy(reader) for name, strategy in STRATEGIES.items()}
        controls = VerifierControls(store, strategies, store.db.now)
        for (host, port, operation), target in sorted(targets.items()):
            runs = {r.control: r for r in await controls.run(target, BOTH)}
            pos, neg = runs[ControlKind.POSITIVE.value], runs[ControlKind.NEGATIVE.value]
            now: datetime = await asyncio.to_thread(store.db.now)
            health.append(RuleHealth(f"{host}:{port}", operation, proven(pos, neg, now, target.rule.controls.max_age), pos, neg))
    why = "no receipt of this rule yet: no known success to run it on"
    health += [RuleHealth(host, op.name, False, note=why) for host, op in unused_rules(config, list(targets.values()))]
    return health
