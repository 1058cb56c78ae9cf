"""The review page's header, the journal at a glance: counts by state, the oldest open and unknown receipts' ages,
and the last hour's writes by outcome as a stacked bar chart drawn on the server (inline SVG: no script, no
library, nothing fetched, which the page's Content-Security-Policy would refuse anyway).

Pure: the store's counts in (store/retention.py `stats`, store/overview.py `recent_writes`), the chart's
geometry out; the template (templates/_glance.html) only places it.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from proxy_addon.rules.records import JournalStats
from proxy_addon.rules.states import State
from proxy_addon.store.overview import RecentWrites
from proxy_addon.views.documents import STATE_GROUPS

# bottom to top in each bar: what is settled first, then what is still open; colours as the page's badges
STACK_ORDER = (
    State.SUCCEEDED, State.REJECTED, State.SAFE_TO_RETRY, State.OUTCOME_UNKNOWN, State.RECONCILING,
    State.MANUAL_REVIEW, State.SUBMITTED, State.PLANNED,
)  # fmt: skip
COLOURS = {
    State.SUCCEEDED: "#3c9d5d",
    State.REJECTED: "#8b94a3",
    State.SAFE_TO_RETRY: "#2a9d9d",
    State.OUTCOME_UNKNOWN: "#e0a030",
    State.RECONCILING: "#4a7fd6",
    State.MANUAL_REVIEW: "#d04545",
    State.SUBMITTED: "#c3c9d4",
    State.PLANNED: "#dde1e8",
}
WIDTH, HEIGHT = 1080, 170  # the SVG's viewBox: about the page's width, so that its text is the page's size
LEFT, BOTTOM, TOP = 40, 22, 8  # room for the count axis, the time axis, and the top bar's edge
GAP = 6  # between bars
MIN_HEIGHT = 2.5  # a state with any write in a bar stays visible however few


@dataclass(frozen=True)
class Segment:
    state: str
    count: int
    y: float
    height: float
    colour: str


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    start: datetime
    end: datetime
    total: int
    segments: list[Segment]

    @property
    def title(self) -> str:
        """The bar's tooltip: its interval and what it holds."""
        parts = ", ".join(f"{s.count} {s.state}" for s in reversed(self.segments)) or "no write"
        return f"{self.start:%H:%M} to {self.end:%H:%M} UTC: {parts}"


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    top: int  # the count the chart's height stands for
    totals: list[tuple[str, int, str]]  # (state, receipts in the span, colour), in STACK_ORDER, present ones only
    ticks: list[tuple[float, str]]  # (x, label) along the time axis
    counted: int
    cut_short: bool
    bar_minutes: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    baseline: float = HEIGHT - BOTTOM


@dataclass(frozen=True)
class Header:
    """The counts and ages above the list."""

    by_state: list[tuple[str, int]]  # every state, open ones first
    open_total: int
    unknown_total: int
    oldest_open_seconds: float | None
    oldest_unknown_seconds: float | None


def header(stats: JournalStats) -> Header:
    open_states = [s.value for s in STATE_GROUPS["open"]]
    unknown = [s.value for s in STATE_GROUPS["unknown"]]
    others = [s.value for s in State if s.value not in open_states]
    ages = [stats.oldest_age_by_state[s] for s in unknown if s in stats.oldest_age_by_state]
    return Header(
        by_state=[(s, stats.by_state.get(s, 0)) for s in [*open_states, *others]],
        open_total=sum(stats.by_state.get(s, 0) for s in open_states),
        unknown_total=sum(stats.by_state.get(s, 0) for s in unknown),
        oldest_open_seconds=stats.oldest_open_age_seconds,
        oldest_unknown_seconds=max(ages, default=None),
    )


def chart(recent: RecentWrites) -> Chart:
    """Stacked bars, one per bucket, oldest on the left; the height of the fullest bar is the chart's height."""
    count = len(recent.buckets)
    slot = (WIDTH - LEFT) / count
    baseline: float = HEIGHT - BOTTOM
    top = max([sum(b.values()) for b in recent.buckets] + [1])
    scale = (baseline - TOP) / top
    step = timedelta(seconds=recent.bucket_seconds)
    bars = []
    for i, bucket in enumerate(recent.buckets):
        y: float = baseline
        segments = []
        for state in STACK_ORDER:
            n = bucket.get(state.value, 0)
            if n:
                h = max(n * scale, MIN_HEIGHT)
                y -= h
                segments.append(Segment(state.value, n, round(y, 2), round(h, 2), COLOURS[state]))
        start = recent.since + step * i
        bars.append(Bar(round(LEFT + i * slot + GAP / 2, 2), round(slot - GAP, 2), start, start + step, sum(bucket.values()), segments))
    totals = [(s.value, recent.totals[s.value], COLOURS[s]) for s in STACK_ORDER if recent.totals.get(s.value)]
    return Chart(bars, top, totals, _ticks(recent, slot), recent.counted, recent.cut_short, f"{recent.bucket_seconds / 60:g}")


def _ticks(recent: RecentWrites, slot: float) -> list[tuple[float, str]]:
    """A label every quarter of the span (minutes ago), and `now` at the right edge."""
    count = len(recent.buckets)
    span_minutes = recent.bucket_seconds * count / 60
    every = max(1, count // 4)
    ticks = [(round(LEFT + i * slot, 2), f"-{span_minutes - i * recent.bucket_seconds / 60:g} min") for i in range(0, count, every)]
    return [*ticks, (float(WIDTH), "now")]
