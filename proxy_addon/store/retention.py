"""What the journal holds as a whole: its counts (`receipts stats`, the metrics, the review page), and pruning.

Counts are read from `receipt_counts`, which the database keeps in the same transaction as every change of
`receipts` (migration 0008): summing a few rows per host and state, not counting the history. The rows the
triggers add are folded together now and then (`fold_counts`: by the proxy's Housekeeping addon every heartbeat
interval, and in each batch of a prune), so that the sum stays a few rows per host and state.

Pruning goes in small batches, each its own short transaction (sized to hold the write lock about BATCH_SECONDS),
so that the journal's writers wait for one batch at most (on SQLite, one writer at a time: a prune of a year in one transaction held
the write lock for 40 s): resumable (each batch committed is done), each receipt recorded as pruned with its
history head in its batch (store/audit.py), and the other tables pruned by their own age.
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Select, Table, and_, delete, func, insert, select, text

from proxy_addon.config import RetentionSettings
from proxy_addon.journal.tables import TERMINAL_PREDICATE, Approval, DuplicateRefusal, ReceiptCount, VerifierControl
from proxy_addon.rules.records import JournalStats, utcnow
from proxy_addon.rules.states import OPEN_STATES, ApprovalState, State
from proxy_addon.store.audit import record_pruned
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import receipts, transitions

BATCH = 500  # receipts per prune transaction at most on SQLite (and rows of the other tables per transaction)
MIN_BATCH = 50
BATCH_SECONDS = 0.025  # what a batch of receipts should take on SQLite: its size follows (docs/performance.md, "Prune")
PAUSE = 0.01  # seconds between two batches at least: the journal's writers go first
# PostgreSQL locks rows: a proxy's write never waits for a batch, which costs it only CPU and I/O, so a batch may
# be larger (at a million receipts on a busy machine, SQLite's batch sizes pruned 180 receipts a second there).
# It still pauses as long as a batch took: pruning without a pause took a core of this 2-core machine from the
# proxies (10M receipts: 17,000 pruned a second, 48 of 73,000 writes delayed past the load's p99 + 100 ms).
PG_BATCH = 5000
PG_BATCH_SECONDS = 0.25
_counts: Table = ReceiptCount.__table__  # type: ignore[assignment]
_refusals: Table = DuplicateRefusal.__table__  # type: ignore[assignment]
_approvals: Table = Approval.__table__  # type: ignore[assignment]
_controls: Table = VerifierControl.__table__  # type: ignore[assignment]
_DECIDED = [ApprovalState.DENIED.value, ApprovalState.USED.value, ApprovalState.EXPIRED.value]
_CONTROL_KEY = ("host", "port", "operation", "account", "rule", "control")


@dataclass
class Pruned:
    """What a prune deleted, by table."""

    receipts: int = 0
    refusals: int = 0
    approvals: int = 0
    control_runs: int = 0
    batches: int = 0

    def add(self, other: "Pruned") -> None:
        self.receipts += other.receipts
        self.refusals += other.refusals
        self.approvals += other.approvals
        self.control_runs += other.control_runs
        self.batches += other.batches

    def as_dict(self) -> dict[str, int]:
        return {
            "receipts": self.receipts,
            "duplicate_refusals": self.refusals,
            "approvals": self.approvals,
            "verifier_controls": self.control_runs,
            "batches": self.batches,
        }


Hosts = tuple[bool, list[str]] | None  # (True, names): only these hosts; (False, names): all but these
Progress = Callable[[int, int], None]  # receipts pruned so far, receipts to prune in all (as counted at the start)


class Retention:
    def __init__(self, db: Database):
        self.db = db

    def stats(self) -> JournalStats:
        """Counts per state and per host and state, and the age of the oldest receipt of each open state (one
        index probe each: see `_oldest_of_each`)."""
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(
                select(_counts.c.host, _counts.c.state, func.sum(_counts.c.n)).group_by(_counts.c.host, _counts.c.state)
            ).all()
            oldest = _oldest_of_each(conn)
        by_state: dict[str, int] = {s.value: 0 for s in State}
        by_host: dict[str, dict[str, int]] = {}
        for host, state, count in rows:
            if not count:
                continue
            by_state[state] += int(count)
            by_host.setdefault(host, {})[state] = int(count)
        now = utcnow()
        ages = {state: (now - created).total_seconds() for state, created in oldest.items()}
        return JournalStats(by_state, by_host, max(ages.values(), default=None), ages)

    def fold_counts(self) -> int:
        """Fold the count rows into one per host and state; how many rows there were."""
        with self.db.writing() as conn:
            return _fold(conn)

    def prune(
        self,
        older_than: timedelta,
        progress: Progress | None = None,
        pause: float = PAUSE,
        hosts: Hosts = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> Pruned:
        """Delete terminal receipts completed before `now - older_than`, with their history (never an open one),
        BATCH at a time, each batch recorded as pruned (store/audit.py) in its own transaction; then the
        duplicate refusals, decided approvals and verifier control runs older than that (each rule's newest
        control run is kept: it is what its health shows). `progress(done, total)` after each batch; `stop()`
        before each (a prune stopped is resumed by the next: every batch committed is done). `hosts`: only
        these hosts' receipts (`(True, [...])`), or all but these (`(False, [...])`): the other tables are then
        left alone (retention's per-host ages, `prune_by_retention`)."""
        cutoff = utcnow() - older_than
        pruned = Pruned()
        which = _old_terminal(cutoff, hosts)
        total = self._count(which) if progress is not None else 0  # a progress bar's; a read of them all
        for deleted in self._batches(which, pause, stop):
            pruned.receipts += deleted
            pruned.batches += 1
            if progress is not None:
                progress(pruned.receipts, max(total, pruned.receipts))
        if hosts is not None or stop():
            self.fold_counts()
            return pruned
        pruned.add(self.prune_others(older_than, pause))
        self.fold_counts()
        return pruned

    def prune_others(self, older_than: timedelta, pause: float = PAUSE) -> Pruned:
        """The duplicate refusals, decided approvals and verifier control runs older than that (each rule's newest
        control run kept), BATCH rows at a time."""
        cutoff = utcnow() - older_than
        pruned = Pruned()
        pruned.refusals = self._prune_by_age(_refusals, _refusals.c.refused_at < cutoff, pause)
        decided = and_(_approvals.c.state.in_(_DECIDED), _approvals.c.requested_at < cutoff)
        pruned.approvals = self._prune_by_age(_approvals, decided, pause, key=_approvals.c.approval_id)
        pruned.control_runs = self._prune_by_age(_controls, self._old_control_runs(cutoff), pause)
        return pruned

    def _count(self, which: ColumnElement[bool]) -> int:
        with self.db.storage_errors(), self.db.reading() as conn:
            count = select(func.count()).select_from(receipts).where(which)
            hinted = count.with_hint(receipts, "INDEXED BY ix_receipts_terminal_completed_at", dialect_name="sqlite")
            return int(conn.execute(hinted).scalar_one())

    def _batches(self, which: ColumnElement[bool], pause: float, stop: Callable[[], bool]) -> Iterator[int]:
        """Delete the receipts `which` selects, the oldest first, in batches sized to hold the journal's write lock
        for about BATCH_SECONDS each (on SQLite one writer at a time: the proxies' writes wait for a batch), with
        at least as long a pause after each (a writer waiting on the lock polls it: it must find it free; and the
        proxies get the CPU and the disk half the time); on PostgreSQL larger batches; each batch's count."""
        sqlite = self.db.dialect == "sqlite"
        most, seconds = (BATCH, BATCH_SECONDS) if sqlite else (PG_BATCH, PG_BATCH_SECONDS)
        size = most
        while not stop():
            with self.db.writing() as conn:
                held = time.monotonic()  # the journal's write lock is this batch's from here (SQLite) to its commit
                ids = _oldest_first(select(receipts.c.operation_id).where(which)).limit(size)
                chosen = list(conn.execute(ids).scalars())
                if not chosen:
                    return
                batch = receipts.c.operation_id.in_(chosen)
                record_pruned(conn, batch)
                conn.execute(delete(transitions).where(transitions.c.operation_id.in_(chosen)))
                deleted = conn.execute(delete(receipts).where(batch)).rowcount or 0
                _fold(conn)
            took = time.monotonic() - held  # not the wait for the lock: the writers had it meanwhile
            if sqlite:
                self._checkpoint()
            yield deleted
            size = min(most, max(MIN_BATCH, int(size * seconds / max(took, 1e-3))))
            time.sleep(max(pause, took) if pause else 0)

    def _checkpoint(self) -> None:
        """Copy the batch's pages from SQLite's write-ahead log into the database now, on the prune's own
        connection, without taking the write lock (PASSIVE). Otherwise the log outgrows SQLite's checkpoint
        threshold (1,000 pages) in a few batches, and the commit of whichever writer crosses it next (a proxy's
        write as often as a batch) copies and syncs it before returning."""
        with self.db.storage_errors(), self.db.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            raw.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _prune_by_age(self, table: Table, which: ColumnElement[bool], pause: float, key: Column[Any] | None = None) -> int:
        """Delete the rows of `table` that `which` selects, BATCH at a time by their key; how many."""
        key = table.c.id if key is None else key
        deleted = 0
        while True:
            with self.db.writing() as conn:
                chosen = list(conn.execute(select(key).where(which).limit(BATCH)).scalars())
                if not chosen:
                    return deleted
                deleted += conn.execute(delete(table).where(key.in_(chosen))).rowcount or 0
            time.sleep(pause)

    @staticmethod
    def _old_control_runs(cutoff: datetime) -> ColumnElement[bool]:
        """Control runs checked before `cutoff`, less each rule and control's newest run."""
        key = [_controls.c[name] for name in _CONTROL_KEY]
        newest = select(func.max(_controls.c.id)).group_by(*key)
        return and_(_controls.c.checked_at < cutoff, _controls.c.id.not_in(newest))


def oldest_statement() -> Select[Any]:
    """The creation time of the oldest receipt in each open state, one column per state (NULL: none), in one
    statement: per state, the first entry of ix_receipts_state_seq (the journal's order, `seq`, is the order of
    creation across replicas, whatever their clocks; a `min(created_at)` would read every receipt in the state)."""
    return select(
        *(
            select(receipts.c.created_at)
            .where(receipts.c.state == state.value)
            .order_by(receipts.c.seq)
            .limit(1)
            .scalar_subquery()
            .label(state.value)
            for state in sorted(OPEN_STATES)
        )
    )


def _oldest_of_each(conn: Connection) -> dict[str, datetime]:
    row = conn.execute(oldest_statement()).one()
    return {state: created for state, created in row._mapping.items() if created is not None}


def _old_terminal(cutoff: datetime, hosts: "Hosts" = None) -> ColumnElement[bool]:
    """Terminal receipts completed before `cutoff`: the predicate of ix_receipts_terminal_completed_at word for
    word (a literal list, which SQLite needs to use a partial index), so that a batch starts at that index's
    oldest entry instead of sorting every terminal receipt."""
    old = and_(receipts.c.completed_at < cutoff, text(TERMINAL_PREDICATE))
    if hosts is None:
        return old
    only, names = hosts
    return and_(old, receipts.c.host.in_(names) if only else receipts.c.host.not_in(names))


def _oldest_first(query: Select[Any]) -> Select[Any]:
    """The terminal receipts in order of completion, read from their partial index. SQLite's planner, with no
    statistics (a deployed journal has none), prefers `ix_receipts_state_seq` for the `state IN (...)` term and
    then sorts every terminal receipt per batch (0.5 s a batch at 200,000 receipts, 1.4 s at a million, with the
    journal's write lock held); it is told which index to read."""
    ordered = query.order_by(receipts.c.completed_at)
    return ordered.with_hint(receipts, "INDEXED BY ix_receipts_terminal_completed_at", dialect_name="sqlite")


def prune_by_retention(retention: Retention, settings: RetentionSettings, stop: Callable[[], bool]) -> Pruned:
    """What `retention:` asks for: each host with its own age first, then every other host's receipts and the
    other tables by `terminal`."""
    pruned = Pruned()
    for host, age in settings.hosts.items():
        pruned.add(retention.prune(timedelta(seconds=age), hosts=(True, [host]), stop=stop))
    others = (False, list(settings.hosts)) if settings.hosts else None
    pruned.add(retention.prune(timedelta(seconds=settings.terminal), hosts=others, stop=stop))
    if others is not None and not stop():
        pruned.add(retention.prune_others(timedelta(seconds=settings.terminal)))
    return pruned


def _fold(conn: Connection) -> int:
    """The count rows so far summed into one per host and state (zero sums dropped), in the caller's transaction.
    On PostgreSQL one statement: what it sums is exactly what it deletes, whatever other writers add meanwhile."""
    if conn.dialect.name == "postgresql":
        folded = conn.exec_driver_sql(
            "WITH gone AS (DELETE FROM receipt_counts RETURNING host, state, n), "
            "summed AS (INSERT INTO receipt_counts (host, state, n) "
            "SELECT host, state, SUM(n) FROM gone GROUP BY host, state HAVING SUM(n) <> 0 RETURNING 1) "
            "SELECT (SELECT COUNT(*) FROM gone)"
        )
        return int(folded.scalar_one())
    rows = conn.execute(select(_counts.c.host, _counts.c.state, func.sum(_counts.c.n), func.count()).group_by(_counts.c.host, _counts.c.state)).all()
    conn.execute(delete(_counts))  # SQLite: one writer at a time, so nothing was added since the read above
    summed = [{"host": host, "state": state, "n": int(n)} for host, state, n, _ in rows if n]
    if summed:
        conn.execute(insert(_counts), summed)
    return sum(int(c) for *_, c in rows)

