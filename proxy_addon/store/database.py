"""The storage layer's plumbing: transactions, the database's clock, and storage errors wrapped at the boundary.

Every part of the store (receipts, instances, the reconcile queue, refusals, retention) writes through one
`Database`, so that the group committer, the retry of a dropped connection and the error wrapping are the
same everywhere. Callers see one exception type for a storage failure: JournalUnavailableError.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.rules.records import utcnow
from proxy_addon.store.group_commit import GroupCommitter


class Database:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self._committer: GroupCommitter | None = None

    @contextmanager
    def storage_errors(self) -> Iterator[None]:
        """Turn any storage failure into JournalUnavailableError, naming the cause in one line."""
        try:
            yield
        except SQLAlchemyError as e:
            cause = str(getattr(e, "orig", None) or e).strip().splitlines()
            raise JournalUnavailableError(f"cannot write the journal: {cause[0] if cause else type(e).__name__}") from e

    def clock(self, conn: Connection) -> datetime:
        """The reference clock: the database's on PostgreSQL (replicas' clocks may disagree), this process's on
        SQLite (one machine)."""
        if self.dialect == "postgresql":
            return conn.execute(select(func.now())).scalar_one().astimezone(UTC)
        return utcnow()

    def now(self) -> datetime:
        """`clock` in a transaction of its own: what leases, due times and heartbeats are compared with."""
        with self.storage_errors(), self.reading() as conn:
            return self.clock(conn)

    def reading(self) -> Connection:
        """A connection for reads (a deferred transaction on SQLite: it takes no write lock)."""
        conn = self.engine.connect()
        return conn.execution_options(sqlite_begin="DEFERRED") if self.dialect == "sqlite" else conn

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """One write transaction of its own, committed on leaving (for the parts off the hot path)."""
        with self.storage_errors(), self.engine.begin() as conn:
            yield conn

    # -- the hot path's transactions ------------------------------------------------------------------------

    def enable_group_commit(self, max_batch: int = 64) -> None:
        """Send every `write` through one writer thread that commits what is queued together (SQLite: one
        writer at a time anyway, one fsync per batch)."""
        if self._committer is None:
            self._committer = GroupCommitter(self.engine, max_batch)

    def close(self) -> None:
        if self._committer is not None:
            self._committer.stop()
            self._committer = None

    @contextmanager
    def hot_connection(self) -> Iterator[Connection | None]:
        """The connection that one request's transactions share; none under group commit (the writer has its own)."""
        if self._committer is not None:
            yield None
            return
        with self.engine.connect() as conn:
            yield conn

    def write[T](self, work: Callable[[Connection], T], conn: Connection | None = None) -> T:
        """Run `work` in one committed transaction: the group committer's, or one on `conn` (or a fresh checkout)."""
        if self._committer is not None:
            return self._committer.run(work)
        if conn is not None:
            return in_transaction(conn, work)
        with self.engine.connect() as fresh:
            return in_transaction(fresh, work)


def in_transaction[T](conn: Connection, work: Callable[[Connection], T]) -> T:
    """Run `work` in one transaction on `conn` and commit it.

    There is no pool_pre_ping (it cost a round trip per checkout). A pooled connection that the database
    dropped while idle (a restarted PostgreSQL) fails at the transaction's first statement; SQLAlchemy then
    invalidates it and the pool's older connections. Such an attempt committed nothing, so it runs once more,
    on a fresh connection. A failure at COMMIT is never retried: the commit may have happened.
    """
    for attempt in (1, 2):
        trans = conn.begin()
        try:
            out = work(conn)
        except DBAPIError as e:
            trans.rollback()
            if attempt == 1 and e.connection_invalidated:
                continue
            raise
        except BaseException:
            trans.rollback()
            raise
        trans.commit()
        return out
    raise AssertionError("unreachable")
