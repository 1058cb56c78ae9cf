"""Each read rule's health, as `receipts rules check`, the review page and the metric show it: proven or not, and
each verifier control's last result, time and evidence (what was read, redacted)."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from proxy_addon.config import ReceiptsConfig
from proxy_addon.rules.operations import ControlSettings
from proxy_addon.rules.records import ControlRunRecord
from proxy_addon.rules.states import ControlKind
from proxy_addon.store import ReceiptStore

DEFAULT_MAX_AGE = ControlSettings().max_age
MaxAge = Callable[[ControlRunRecord], float]


@dataclass(frozen=True)
class RuleHealth:
    host: str  # host:port as journaled; the config's host key for a rule no receipt has used yet
    operation: str
    proven: bool
    positive: ControlRunRecord | None = None
    negative: ControlRunRecord | None = None
    note: str | None = None  # why a control was not run

    @property
    def failing(self) -> bool:
        """A control's newest run did not pass (however old it is: a stale proof is renewed before a verdict)."""
        return not (self.positive and self.positive.passed and self.negative and self.negative.passed)

    def document(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "operation": self.operation,
            "proven": self.proven,
            "positive": self._control(self.positive),
            "negative": self._control(self.negative),
        }

    def _control(self, run: ControlRunRecord | None) -> dict[str, Any]:
        if run is None:
            return {"result": "not_run", "checked_at": None, "evidence": {"reason": self.note or "never run"}}
        return {
            "result": run.result,
            "checked_at": run.checked_at.isoformat(),
            "known_operation_id": run.known_operation_id,
            "evidence": run.evidence,
        }


def proven(positive: ControlRunRecord | None, negative: ControlRunRecord | None, now: datetime, max_age: float) -> bool:
    """Both controls passed within max_age."""
    since = now - timedelta(seconds=max_age)
    return all(r is not None and r.passed and r.checked_at >= since for r in (positive, negative))


def health_of(runs: Iterable[ControlRunRecord], now: datetime, max_age: MaxAge) -> list[RuleHealth]:
    """Per host and operation, the newest run of each control (whichever account or version of the rule)."""
    newest: dict[tuple[str, int, str], dict[str, ControlRunRecord]] = {}
    for run in runs:
        kept = newest.setdefault((run.host, run.port, run.operation), {})
        if run.control not in kept or (run.checked_at, run.id or 0) > (kept[run.control].checked_at, kept[run.control].id or 0):
            kept[run.control] = run
    health = []
    for (host, port, operation), kept in sorted(newest.items()):
        pos, neg = kept.get(ControlKind.POSITIVE.value), kept.get(ControlKind.NEGATIVE.value)
        oldest = min((r for r in (pos, neg) if r is not None), key=lambda r: r.checked_at)
        health.append(RuleHealth(f"{host}:{port}", operation, proven(pos, neg, now, max_age(oldest)), pos, neg))
    return health


def max_age_in(config: ReceiptsConfig) -> MaxAge:
    """A run's rule's `controls.max_age`, as the config writes the rule now (the default for a rule since removed)."""
    def max_age(run: ControlRunRecord) -> float:
        for op in config.policy_for(run.host, run.port).operations:
            if op.reconcile is not None and op.reconcile.digest == run.rule:
                return op.reconcile.controls.max_age
        return DEFAULT_MAX_AGE

    return max_age


def rows(health: Iterable[RuleHealth]) -> list[tuple[Any, ...]]:
    """The table's rows: host, operation, proven, and each control's result and time."""

    def cell(run: ControlRunRecord | None) -> str:
        return "not run" if run is None else f"{run.result} {run.checked_at.isoformat(timespec='seconds')}"

    return [(h.host, h.operation, "yes" if h.proven else "NO", cell(h.positive), cell(h.negative)) for h in health]


def stored_health(store: ReceiptStore, config: ReceiptsConfig) -> list[RuleHealth]:
    """The rules' health from the runs on record (the review page): nothing is run."""
    return health_of(store.controls.latest_of_each(), store.db.now(), max_age_in(config))


def unproven_rules(store: ReceiptStore) -> int:
    """The metric: rules whose controls' newest runs did not both pass."""
    return sum(h.failing for h in health_of(store.controls.latest_of_each(), store.db.now(), lambda _run: DEFAULT_MAX_AGE))
