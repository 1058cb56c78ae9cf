"""Prometheus metrics, on this package's own registry (never the process-global default one).

Counters and the journaling histogram count what this process did, at the place it happened (the store for
transitions, the addon for refusals and journaling time, the reconciler for verdicts). What the database
holds (receipts by state, the oldest receipt of each open state, live proxy instances, pending approvals) is
read from the store at scrape time by StoreCollector, so every replica's admin port tells the same totals.
deploy/prometheus/alerts.yml and deploy/grafana/ use these names; tests/e2e/test_dashboards.py checks that each
one they use is served.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy_addon.agents.tokens import ANONYMOUS_AGENT, OTHER_AGENT
from proxy_addon.exceptions import ReceiptsError
from proxy_addon.rules.records import JournalStats
from proxy_addon.rules.states import OPEN_STATES, RefusalReason, State

# the journal's counts, read at scrape time (store.retention.stats); a callable, so that this module, which
# the store reports its transitions to, does not import the store
JournalStatsReader = Callable[[], JournalStats]
UnprovenRulesReader = Callable[[], int]  # read rules whose verifier controls' newest runs did not both pass
PendingApprovalsReader = Callable[[], int]  # approvals waiting for a person, not yet expired
HOST_LABELS = 50  # distinct `host` label values of receipts_writes_total per process; later hosts are `other`


@dataclass(frozen=True)
class StoreReads:
    """What /metrics reads from the store at scrape time: each a callable, so that this module, which the store
    reports its transitions to, does not import the store. Each is a bounded read (store/overview.py)."""

    stats: JournalStatsReader
    unproven_rules: UnprovenRulesReader | None = None
    approvals_pending: PendingApprovalsReader | None = None
    approval_wait_ratio: Callable[[], float] | None = None  # the longest pending approval's wait / its expiry
    instances: Callable[[], Mapping[str, int]] | None = None  # proxy instances by status: live, lost


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
WRITES = Counter(
    "receipts_writes",
    "Journaled writes this proxy answered with a receipt of their own, by the upstream host (the first "
    f"{HOST_LABELS} hosts this process saw; `other` after them) and the receipt's state in the answer "
    "(X-Receipt-State): succeeded, rejected, outcome_unknown, ...",
    ["host", "state"],
    registry=REGISTRY,
)
JOURNAL_UNAVAILABLE = Counter(
    "receipts_journal_unavailable",
    "Journaled writes this proxy could not journal (its journal writer lost, the database down or too slow, an "
    "internal error), by what it did: `refused` (503 journal-unavailable, nothing forwarded) or `forwarded` "
    "(proxy.fail_open: forwarded without a receipt).",
    ["action"],
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
for _table in ("receipts", "duplicate_refusals", "approvals", "verifier_controls"):
    PRUNED.labels(_table)
for _action in ("refused", "forwarded"):
    JOURNAL_UNAVAILABLE.labels(_action)
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


class _HostLabels:
    """The `host` label's values: each host as itself until HOST_LABELS of them were seen, then `other`, so that
    an agent writing to ever new hosts cannot grow the series without bound."""

    def __init__(self, most: int):
        self.most = most
        self.seen: set[str] = set()

    def __call__(self, host: str) -> str:
        if host in self.seen:
            return host
        if len(self.seen) >= self.most:
            return "other"
        self.seen.add(host)
        return host


_host_label = _HostLabels(HOST_LABELS)


def write_answered(host: str, state: str) -> None:
    WRITES.labels(_host_label(host), state).inc()


def journal_unavailable(forwarded: bool) -> None:
    JOURNAL_UNAVAILABLE.labels("forwarded" if forwarded else "refused").inc()


def reused_connection_unknown() -> None:
    REUSED_CONNECTION_UNKNOWNS.inc()


def approval_decided(decision: str) -> None:
    APPROVAL_DECISIONS.labels(decision).inc()


def approval_awaited(state: str) -> None:
    APPROVALS_AWAITED.labels(state).inc()


class StoreCollector(Collector):
    """What the database holds, queried when Prometheus scrapes: receipts by state, the oldest receipt of each
    open state, unproven read rules, approvals, proxy instances."""

    def __init__(self, reads: StoreReads):
        self.reads = reads

    def describe(self) -> list[Metric]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("receipts_store_up", "1 when the store answered this scrape, 0 when it did not.")
        try:
            families = list(_store_families(self.reads))
        except ReceiptsError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families


def _store_families(reads: StoreReads) -> Iterator[Metric]:
    """The store's gauges, each read once; a store that does not answer raises ReceiptsError before any is served."""
    stats = reads.stats()
    by_state = GaugeMetricFamily("receipts_by_state", "Receipts in the database, by state.", labels=["state"])
    for state, count in sorted(stats.by_state.items()):
        by_state.add_metric([state], count)
    yield by_state
    yield GaugeMetricFamily(
        "receipts_oldest_open_age_seconds",
        "Age of the oldest open receipt, in seconds; 0 when none is open.",
        value=stats.oldest_open_age_seconds or 0.0,
    )
    oldest = GaugeMetricFamily(
        "receipts_oldest_age_seconds",
        "Age of the oldest receipt in each open state, in seconds; 0 when none is in that state.",
        labels=["state"],
    )
    for state in sorted(OPEN_STATES):
        oldest.add_metric([state.value], stats.oldest_age_by_state.get(state.value, 0.0))
    yield oldest
    if reads.unproven_rules is not None:
        yield GaugeMetricFamily(
            "receipts_unproven_rules",
            "Read rules (per host and operation) whose verifier controls' newest runs did not both pass: their "
            "absence verdicts, and their presence verdicts without the negative control, go to a person.",
            value=reads.unproven_rules(),
        )
    if reads.approvals_pending is not None:
        yield GaugeMetricFamily(
            "receipts_approvals_pending",
            "Approvals waiting for a person's decision (not yet expired): their writes are not forwarded until then.",
            value=reads.approvals_pending(),
        )
    if reads.approval_wait_ratio is not None:
        yield GaugeMetricFamily(
            "receipts_approval_wait_ratio",
            "The longest wait of a pending approval as a share of its expiry: 0.5 is half its time gone, 1 or more "
            "an expiry that ran out while nobody decided; 0 when none is pending.",
            value=reads.approval_wait_ratio(),
        )
    if reads.instances is not None:
        instances = GaugeMetricFamily(
            "receipts_proxy_instances",
            "Proxy instances by status: `live` (heartbeating), `lost` (their heartbeats stopped within the last "
            "hour without a clean stop: crashed, killed, cut off; their receipts are recovered by the others).",
            labels=["status"],
        )
        for status, count in sorted(reads.instances().items()):
            instances.add_metric([status], count)
        yield instances


def registry_for(reads: StoreReads | JournalStatsReader | None) -> CollectorRegistry:
    """This process's counters, plus the store's gauges: what an admin server's /metrics serves."""
    registry = CollectorRegistry(auto_describe=True)
    collectors = (
        TRANSITIONS,
        DUPLICATES,
        RECONCILE_VERDICTS,
        JOURNAL_SECONDS,
        VERDICT_SECONDS,
        PRUNED,
        AGENT_JOURNALED,
        REUSED_CONNECTION_UNKNOWNS,
        WRITES,
        JOURNAL_UNAVAILABLE,
        WRITER_STARTS,
        WRITER_RESTARTS,
        WRITER_PENDING,
        APPROVAL_DECISIONS,
        APPROVALS_AWAITED,
    )
    for collector in collectors:
        registry.register(collector)
    if reads is not None:
        registry.register(StoreCollector(reads if isinstance(reads, StoreReads) else StoreReads(reads)))
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text format body and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
