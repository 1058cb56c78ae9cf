"""The journal at a glance, for the review page's header and the metrics read at scrape time.

Each read here runs on every page view and every scrape, on a journal of millions of receipts, so each is an
index probe or a bounded range, never a scan of the history:
- the last hour's writes by state: each bucket's edge in time found as a position in the journal's order (the
  first receipt created at or after it: a probe of `ix_receipts_created_at`), then the newest RECENT_ROWS
  receipts since the first edge counted per bucket and state from `ix_receipts_state_seq` alone (both columns
  are in it: no row is read), one row per bucket and state coming back;
- the proxy instances that are live, and those lost (no heartbeat, no clean stop) lately: `proxy_instances`
  holds one row per process start, not per write;
- how long the pending approvals have waited, as a share of their expiry: `ix_approvals_state_requested_at`,
  the oldest PENDING_ROWS of them.
The counts by state and the oldest receipt of each open state are store/retention.py's (`stats`).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, Table, and_, case, func, literal, select

from proxy_addon.journal.tables import Approval, ProxyInstance
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import ApprovalState, State
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import receipts

RECENT_ROWS = 50_000  # receipts the chart counts at most: the newest of its span (it says so when it is cut)
PENDING_ROWS = 1_000  # pending approvals weighed at most, the longest waiting first
LOST_WITHIN = timedelta(hours=1)  # an instance that died without a clean stop counts as lost for this long
_instances: Table = ProxyInstance.__table__  # type: ignore[assignment]
_approvals: Table = Approval.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class RecentWrites:
    """Receipts created in the last `span`, in `len(buckets)` equal buckets from `since`, by their state now."""

    since: datetime
    bucket_seconds: float
    buckets: list[dict[str, int]]  # oldest bucket first; state -> receipts created in it
    counted: int  # receipts counted (RECENT_ROWS at most)
    cut_short: bool = False  # more were created in the span than were counted: the oldest buckets lack some
    totals: dict[str, int] = field(default_factory=dict)  # state -> receipts, over the whole span


class Overview:
    def __init__(self, db: Database):
        self.db = db

    def recent_writes(self, span: timedelta = timedelta(hours=1), buckets: int = 12, limit: int = RECENT_ROWS) -> RecentWrites:
        """The receipts created in the last `span`, newest `limit` at most, counted per bucket and state."""
        since = utcnow() - span
        width = span / buckets
        with self.db.storage_errors(), self.db.reading() as conn:
            *firsts, newest = conn.execute(edges_statement(since, width, buckets)).one()
            newest = newest or 0
            edges = [newest + 1 if first is None else first for first in firsts]  # no receipt since: past the newest
            lowest = max(edges[0], newest - limit + 1)
            rows = conn.execute(recent_statement(edges, lowest)).all()
        per_bucket: list[dict[str, int]] = [{} for _ in range(buckets)]
        totals: dict[str, int] = {}
        for index, state, n in rows:
            per_bucket[int(index)][state] = int(n)
            totals[state] = totals.get(state, 0) + int(n)
        total = sum(totals.values())
        return RecentWrites(since, width.total_seconds(), per_bucket, total, lowest > edges[0], totals)

    def instances(self, dead_after: float) -> dict[str, int]:
        """Proxy instances `live` (heartbeat within `dead_after`, not stopped) and `lost` (no heartbeat since,
        never stopped cleanly, their last heartbeat within LOST_WITHIN), by the database's clock."""
        with self.db.storage_errors(), self.db.reading() as conn:
            now = self.db.clock(conn)
            cutoff = now - timedelta(seconds=dead_after)
            fresh = _instances.c.heartbeat_at >= cutoff
            lost = and_(_instances.c.heartbeat_at < cutoff, _instances.c.heartbeat_at >= now - LOST_WITHIN)
            row = conn.execute(
                select(
                    func.count().filter(fresh),
                    func.count().filter(lost),
                ).where(_instances.c.stopped_at.is_(None), _instances.c.heartbeat_at >= now - LOST_WITHIN)
            ).one()
        return {"live": int(row[0]), "lost": int(row[1])}

    def approval_wait_ratio(self) -> float:
        """The longest wait of a pending approval as a share of its expiry (0 with none pending): 1 or more is an
        approval whose expiry ran out while nobody decided it (it is marked expired when next listed)."""
        pending = (
            select(_approvals.c.requested_at, _approvals.c.expires_seconds)
            .where(_approvals.c.state == ApprovalState.PENDING.value)
            .order_by(_approvals.c.requested_at)
            .limit(PENDING_ROWS)
        )
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(pending).all()
        return wait_ratio(rows, utcnow())


def edges_statement(since: datetime, width: timedelta, buckets: int) -> Select[Any]:
    """Each bucket's start as a position in the journal's order: the `seq` of the first receipt created at or after
    it (NULL: none yet), one probe of ix_receipts_created_at each; and the newest `seq` (ix_receipts_seq's last)."""
    firsts = (
        select(receipts.c.seq).where(receipts.c.created_at >= since + width * i).order_by(receipts.c.created_at).limit(1)
        for i in range(buckets)
    )
    return select(*(first.scalar_subquery() for first in firsts), select(func.max(receipts.c.seq)).scalar_subquery())


def recent_statement(edges: list[int], lowest: int) -> Select[Any]:
    """(bucket, state, count) of the receipts from `lowest` on in the journal's order, `edges` being where each
    bucket starts: read from ix_receipts_state_seq alone (every state named, so that the index's first column is
    given; a receipt's state and seq are all it needs)."""
    bucket = case(*((receipts.c.seq < edge, literal(i)) for i, edge in enumerate(edges[1:])), else_=literal(len(edges) - 1))
    return (
        select(bucket.label("bucket"), receipts.c.state, func.count())
        .where(receipts.c.state.in_([s.value for s in State]), receipts.c.seq >= lowest)
        .group_by(bucket, receipts.c.state)
    )


def wait_ratio(pending: Iterable[Any], now: datetime) -> float:
    """The largest (now - requested_at) / expires_seconds among `pending` rows (0 when there is none)."""
    ratios = [(now - requested).total_seconds() / expires for requested, expires in pending if expires > 0]
    return max(ratios, default=0.0)
