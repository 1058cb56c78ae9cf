"""Prometheus metrics, on this package's own registry (never the process-global default one).

Counters and the journaling histogram count what this process did, at the place it happened (the store for
transitions, the addon for refusals and journaling time, the reconciler for verdicts). What the database
holds (receipts by state, the oldest open receipt's age) is read from the store at scrape time by
StoreCollector, so every replica's admin port tells the same totals.
"""

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy_addon.agents.tokens import ANONYMOUS_AGENT, OTHER_AGENT
from proxy_addon.exceptions import ReceiptsError
from proxy_addon.rules.records import JournalStats
from proxy_addon.rules.states import RefusalReason, State

# the journal's counts, read at scrape time (store.retention.stats); a callable, so that this module, which
# the store reports its transitions to, does not import the store
JournalStatsReader = Callable[[], JournalStats]
UnprovenRulesReader = Callable[[], int]  # read rules whose verifier controls' newest runs did not both pass
PendingApprovalsReader = Callable[[], int]  # approvals waiting for a person, not yet expired

REGISTRY = CollectorRegistry(auto_describe=True)

TRANSITIONS = Counter(
    "receipts_transitions",
    "Receipt state changes recorded by this process, by the state reached.",
    ["to_state"],
    registry=REGISTRY,
)
DUPLICATES = Counter(
    "receipts_duplicates",
    "Requests answered from an earlier receipt (refused or replayed) instead of being forwarded, by reason.",
    ["reason"],
    registry=REGISTRY,
)
RECONCILE_VERDICTS = Counter(
    "receipts_reconcile_verdicts",
    "Verdicts of the reconciliation worker, by the state given.",
    ["state"],
    registry=REGISTRY,
)
JOURNAL_SECONDS = Histogram(
    "receipts_journal_seconds",
    "Time from a write's arrival to its receipt committed as submitted, before it is forwarded.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
VERDICT_SECONDS = Histogram(
    "receipts_verdict_seconds",
    "Time from a sent write's verdict handed to the journal writer to its commit, by when the answer left: "
    "`after` the commit (the agent waited for it) or `before` it (answer first: how long the journal lagged "
    "behind what the agent was told, the receipt open meanwhile).",
    ["answer"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
_VERDICT_ANSWERED = {True: VERDICT_SECONDS.labels("before"), False: VERDICT_SECONDS.labels("after")}
PRUNED = Counter(
    "receipts_pruned",
    "Rows deleted by this process's background retention (`retention:`), by table: `receipts` (with their history), "
    "`duplicate_refusals`, `approvals`, `verifier_controls`.",
    ["table"],
    registry=REGISTRY,
)
REUSED_CONNECTION_UNKNOWNS = Counter(
    "receipts_reused_connection_unknowns",
    "Journaled writes sent on a reused HTTP/1.1 connection that ended with no byte of an answer (outcome_unknown): "
    "among them, any upstream idle close that crossed the request. Compare with receipts_transitions{to_state=outcome_unknown}.",
    registry=REGISTRY,
)
AGENT_JOURNALED = Counter(
    "receipts_agent_journaled",
    "Writes this process journaled (a new receipt, committed before the write went upstream), by agent: a name "
    "of config `agents:`, `anonymous` (no proxy authentication), or `other` (a name not configured, such as "
    "one from mitmproxy's own `proxyauth` option), so that the label's values stay as few as the agents.",
    ["agent"],
    registry=REGISTRY,
)

WRITER_STARTS = Counter(
    "receipts_journal_writer_starts",
    "Journal writer processes this proxy started (the first, and each restart after one stopped).",
    registry=REGISTRY,
)
WRITER_RESTARTS = Counter(
    "receipts_journal_writer_restarts",
    "Journal writers this proxy lost, by cause: `died` (it exited), `unresponsive` (it held a write past "
    "proxy.journal_timeout, or did not start, and was killed). The next write starts a new one.",
    ["cause"],
    registry=REGISTRY,
)
WRITER_PENDING = Gauge(
    "receipts_journal_writer_pending",
    "Writes this proxy handed to its journal writer that it has not answered yet.",
    registry=REGISTRY,
)
APPROVAL_DECISIONS = Counter(
    "receipts_approval_decisions",
    "People's decisions on approvals made through this process, by decision (`approved`, `denied`).",
    ["decision"],
    registry=REGISTRY,
)
APPROVALS_AWAITED = Counter(
    "receipts_approvals_awaited",
    "Journaled writes not forwarded because they wait for a person's approval, by the approval's state "
    "(`pending`: asked or asked again; `denied`).",
    ["state"],
    registry=REGISTRY,
)

for _d in ("approved", "denied"):
    APPROVAL_DECISIONS.labels(_d)
for _d in ("pending", "denied"):
    APPROVALS_AWAITED.labels(_d)
for _cause in ("died", "unresponsive"):
    WRITER_RESTARTS.labels(_cause)
# Every series exists from the start, at 0, so rates and alerts need no special case. The transitions' are kept:
# `labels()` takes a lock and checks its values on every call, three times per journaled write.
_TRANSITIONS_TO = {s.value: TRANSITIONS.labels(s.value) for s in State}
for _r in RefusalReason:
    DUPLICATES.labels(_r.value)
for _s in (State.SUCCEEDED, State.SAFE_TO_RETRY, State.MANUAL_REVIEW, State.OUTCOME_UNKNOWN):
    RECONCILE_VERDICTS.labels(_s.value)
_OTHER_AGENT = AGENT_JOURNALED.labels(OTHER_AGENT)
_AGENTS_JOURNALED: dict[str | None, Counter] = {None: AGENT_JOURNALED.labels(ANONYMOUS_AGENT)}  # name_agents


def transitioned(to_state: State | str) -> None:
    key = str(to_state)
    series = _TRANSITIONS_TO.get(key)
    (series if series is not None else TRANSITIONS.labels(key)).inc()


def duplicate_refused(reason: RefusalReason | str) -> None:
    DUPLICATES.labels(str(reason)).inc()


def reconcile_verdict(state: State | str) -> None:
    RECONCILE_VERDICTS.labels(str(state)).inc()


def journaled(seconds: float) -> None:
    JOURNAL_SECONDS.observe(seconds)


def name_agents(names: Iterable[str]) -> None:
    """The configured agents (config `agents:`): each its own series, at 0 from the start; any other name counts
    as `other`. Replaced whole, so that the hot path reads it without a lock."""
    global _AGENTS_JOURNALED
    _AGENTS_JOURNALED = {None: _AGENTS_JOURNALED[None], **{name: AGENT_JOURNALED.labels(name) for name in names}}


def agent_journaled(agent: str | None) -> None:
    """A write journaled for this agent (None: an anonymous one)."""
    series = _AGENTS_JOURNALED.get(agent)
    (series if series is not None else _OTHER_AGENT).inc()


def verdict_committed(seconds: float, answered_first: bool) -> None:
    _VERDICT_ANSWERED[answered_first].observe(seconds)


def pruned(by_table: dict[str, int]) -> None:
    for table in ("receipts", "duplicate_refusals", "approvals", "verifier_controls"):
        PRUNED.labels(table).inc(by_table.get(table, 0))


def reused_connection_unknown() -> None:
    REUSED_CONNECTION_UNKNOWNS.inc()


def approval_decided(decision: str) -> None:
    APPROVAL_DECISIONS.labels(decision).inc()


def approval_awaited(state: str) -> None:
    APPROVALS_AWAITED.labels(state).inc()


class StoreCollector(Collector):
    """Receipts by state, the oldest open receipt's age and the unproven read rules, queried when Prometheus scrapes."""

    def __init__(
        self,
        read_stats: JournalStatsReader,
        read_unproven: UnprovenRulesReader | None = None,
        read_pending: PendingApprovalsReader | None = None,
    ):
        self.read_stats = read_stats
        self.read_unproven = read_unproven
        self.read_pending = read_pending

    def describe(self) -> list[Metric]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("receipts_store_up", "1 when the store answered this scrape, 0 when it did not.")
        try:
            stats = self.read_stats()
            unproven = None if self.read_unproven is None else self.read_unproven()
            pending = None if self.read_pending is None else self.read_pending()
        except ReceiptsError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        by_state = GaugeMetricFamily("receipts_by_state", "Receipts in the database, by state.", labels=["state"])
        for state, count in sorted(stats.by_state.items()):
            by_state.add_metric([state], count)
        yield by_state
        age = stats.oldest_open_age_seconds
        yield GaugeMetricFamily(
            "receipts_oldest_open_age_seconds",
            "Age of the oldest open receipt, in seconds; 0 when none is open.",
            value=age or 0.0,
        )
        if unproven is not None:
            yield GaugeMetricFamily(
                "receipts_unproven_rules",
                "Read rules (per host and operation) whose verifier controls' newest runs did not both pass: their "
                "absence verdicts, and their presence verdicts without the negative control, go to a person.",
                value=unproven,
            )
        if pending is not None:
            yield GaugeMetricFamily(
                "receipts_approvals_pending",
                "Approvals waiting for a person's decision (not yet expired): their writes are not forwarded until then.",
                value=pending,
            )


def registry_for(
    read_stats: JournalStatsReader | None,
    read_unproven: UnprovenRulesReader | None = None,
    read_pending: PendingApprovalsReader | None = None,
) -> CollectorRegistry:
    """This process's counters, plus the store's gauges: what an admin server's /metrics serves."""
    registry = CollectorRegistry(auto_describe=True)
    collectors = (
        TRANSITIONS,
        DUPLICATES,
        RECONCILE_VERDICTS,
        JOURNAL_SECONDS,
        AGENT_JOURNALED,
        REUSED_CONNECTION_UNKNOWNS,
        WRITER_STARTS,
        WRITER_RESTARTS,
        WRITER_PENDING,
        APPROVAL_DECISIONS,
        APPROVALS_AWAITED,
    )
    for collector in collectors:
        registry.register(collector)
    if read_stats is not None:
        registry.register(StoreCollector(read_stats, read_unproven, read_pending))
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text format body and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
