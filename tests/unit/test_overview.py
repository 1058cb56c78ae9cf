"""The journal at a glance, on SQLite and PostgreSQL: the oldest receipt of each open state (store/retention.py),
the last hour's writes bucketed and bounded, proxy instances live and lost, and approvals' waits
(store/overview.py); and the review page's header and chart made of them (views/glance.py)."""

import uuid
from datetime import timedelta

from sqlalchemy import insert, update
from support.store import intent, recorded, walk

from proxy_addon.journal.tables import Approval, ProxyInstance
from proxy_addon.rules.records import JournalStats, utcnow
from proxy_addon.rules.states import State
from proxy_addon.store.overview import LOST_WITHIN, RecentWrites
from proxy_addon.store.receipts import receipts
from proxy_addon.views import glance


def made(store, state: State, age: timedelta) -> str:
    """A receipt in `state`, created `age` ago (its time set afterwards: the write path reads its own clock)."""
    op = recorded(store, intent()).operation_id
    if state != State.PLANNED:
        walk(store, op, state)
    with store.engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.operation_id == op).values(created_at=utcnow() - age))
    return op


def test_the_oldest_receipt_of_each_open_state(store):
    made(store, State.OUTCOME_UNKNOWN, timedelta(minutes=40))
    made(store, State.OUTCOME_UNKNOWN, timedelta(minutes=5))
    made(store, State.MANUAL_REVIEW, timedelta(hours=3))
    made(store, State.SUCCEEDED, timedelta(days=9))  # terminal: not open, not counted
    stats = store.retention.stats()
    ages = stats.oldest_age_by_state
    assert set(ages) == {"outcome_unknown", "manual_review"}
    assert 40 * 60 <= ages["outcome_unknown"] < 41 * 60 and 3 * 3600 <= ages["manual_review"] < 3 * 3600 + 60
    assert stats.oldest_open_age_seconds == ages["manual_review"]


def test_the_last_hour_s_writes_by_bucket_and_state(store):
    for state, minutes in [(State.MANUAL_REVIEW, 24 * 60), (State.SUCCEEDED, 61), (State.SUCCEEDED, 58), (State.SUCCEEDED, 57),
                           (State.REJECTED, 31), (State.OUTCOME_UNKNOWN, 1), (State.SUCCEEDED, 0.5)]:  # in the journal's order
        made(store, state, timedelta(minutes=minutes))
    recent = store.overview.recent_writes()
    assert len(recent.buckets) == 12 and recent.bucket_seconds == 300
    assert recent.buckets[0] == {"succeeded": 2}  # 58 and 57 minutes ago
    assert recent.buckets[5] == {"rejected": 1}  # 31 minutes ago: the sixth five minutes of the hour
    assert recent.buckets[11] == {"outcome_unknown": 1, "succeeded": 1}
    assert sum(map(len, recent.buckets)) == 4
    assert recent.totals == {"succeeded": 3, "rejected": 1, "outcome_unknown": 1} and recent.counted == 5
    assert not recent.cut_short


def test_the_chart_counts_the_newest_writes_only_up_to_its_bound(store):
    for minutes in (50, 40, 30, 20):
        made(store, State.SUCCEEDED, timedelta(minutes=minutes))
    recent = store.overview.recent_writes(limit=3)
    assert recent.cut_short and recent.counted == 3
    assert [sum(b.values()) for b in recent.buckets if b] == [1, 1, 1]  # 40, 30 and 20 minutes ago
    assert recent.buckets[2] == {}  # 50 minutes ago: beyond the bound


def test_proxy_instances_live_and_lost(store):
    now = store.db.now()
    rows = {
        "live": (now, None),
        "lost": (now - timedelta(seconds=40), None),  # no heartbeat for longer than 15 s, never stopped
        "stopped": (now - timedelta(seconds=40), now - timedelta(seconds=40)),  # a clean stop: not lost
        "long-lost": (now - LOST_WITHIN - timedelta(minutes=1), None),  # lost before the last hour
    }
    with store.engine.begin() as conn:
        for name, (beat, stopped) in rows.items():
            conn.execute(insert(ProxyInstance.__table__).values(
                instance_id=name, hostname="h", pid=1, started_at=beat, heartbeat_at=beat, stopped_at=stopped))  # fmt: skip
    assert store.overview.instances(dead_after=15) == {"live": 1, "lost": 1}


def test_the_longest_approval_wait_as_a_share_of_its_expiry(store):
    assert store.overview.approval_wait_ratio() == 0

    def approval(state: str, waited: timedelta, expires: float) -> None:
        requested = utcnow() - waited
        with store.engine.begin() as conn:
            conn.execute(insert(Approval.__table__).values(
                approval_id="ap_" + uuid.uuid4().hex, account="a", intent_fingerprint=uuid.uuid4().hex, operation="op",
                method="POST", scheme="https", host="h", port=443, path="/", state=state, requested_at=requested,
                expires_at=requested + timedelta(seconds=expires), expires_seconds=expires, last_asked_at=requested))  # fmt: skip

    approval("pending", timedelta(minutes=30), 3600)
    approval("pending", timedelta(minutes=10), 900)  # two thirds of its 15 minutes: the longest
    approval("denied", timedelta(hours=5), 3600)  # decided: not waiting
    assert 0.66 < store.overview.approval_wait_ratio() < 0.68
    approval("pending", timedelta(hours=2), 3600)  # its expiry ran out, nobody decided (not yet marked expired)
    assert 2.0 <= store.overview.approval_wait_ratio() < 2.01


def _stats(**ages: float) -> JournalStats:
    by_state = {s.value: 0 for s in State} | {"outcome_unknown": 3, "manual_review": 1, "submitted": 2, "succeeded": 40}
    return JournalStats(by_state, {}, max(ages.values(), default=None), dict(ages))


def test_the_header_counts_open_and_unknown_receipts_and_their_oldest():
    head = glance.header(_stats(submitted=5.0, outcome_unknown=600.0, manual_review=7200.0))
    assert (head.open_total, head.unknown_total) == (6, 4)
    assert head.oldest_open_seconds == 7200.0 and head.oldest_unknown_seconds == 7200.0
    assert [s for s, _ in head.by_state][:5] == ["manual_review", "outcome_unknown", "planned", "reconciling", "submitted"]
    assert dict(head.by_state)["succeeded"] == 40 and len(head.by_state) == len(State)
    assert glance.header(_stats(submitted=5.0)).oldest_unknown_seconds is None


def test_the_chart_stacks_each_bucket_s_states_to_scale():
    since = utcnow() - timedelta(hours=1)
    buckets: list[dict[str, int]] = [{} for _ in range(12)]
    buckets[0] = {"succeeded": 100}
    buckets[11] = {"outcome_unknown": 1, "succeeded": 49, "manual_review": 0}
    chart = glance.chart(RecentWrites(since, 300, buckets, 150, False, {"succeeded": 149, "outcome_unknown": 1}))
    assert len(chart.bars) == 12 and chart.top == 100
    full, last = chart.bars[0], chart.bars[11]
    assert [s.state for s in full.segments] == ["succeeded"]
    assert full.segments[0].y == glance.TOP and full.segments[0].height == chart.baseline - glance.TOP
    assert [s.state for s in last.segments] == ["succeeded", "outcome_unknown"]  # settled first, bottom up
    assert last.segments[0].height == (chart.baseline - glance.TOP) * 49 / 100
    assert last.segments[1].height == glance.MIN_HEIGHT  # one write of 100 is still to be seen
    assert last.segments[1].y + last.segments[1].height == last.segments[0].y
    assert all(b.x + b.width <= glance.WIDTH for b in chart.bars) and chart.bars[1].x > chart.bars[0].x + chart.bars[0].width
    assert [t[0] for t in chart.totals] == ["succeeded", "outcome_unknown"]
    assert chart.ticks[0][1] == "-60 min" and chart.ticks[-1] == (glance.WIDTH, "now")
    assert "49 succeeded" in last.title and "1 outcome_unknown" in last.title
    assert chart.bars[5].segments == [] and chart.bars[5].title.endswith("no write")
