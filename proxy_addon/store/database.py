"""The storage layer's plumbing: transactions, the database's clock, and storage errors wrapped at the boundary.

Every part of the store (receipts, instances, the reconcile queue, refusals, retention) writes through one
`Database`, so that the retry of a dropped connection and the error wrapping are the same everywhere. Callers
see one exception type for a storage failure: JournalUnavailableError.

There is no group commit here: the proxy's hot-path writes, the many concurrent ones, are committed by its
journal writer process in batches (journal/writer.py); what the proxy's process still writes itself (the
fallbacks when its writer is lost, recovery, the reconciler, refusals, heartbeats) is rare enough to commit
one transaction at a time.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.rules.records import utcnow


class Database:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name

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

    def write[T](self, work: Callable[[Connection], T], conn: Connection | None = None) -> T:
        """Run `work` in one committed transaction on `conn` (or on a fresh checkout)."""
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
