"""The writer's one database connection: opened through the project's engine, used below SQLAlchemy."""

import math
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import event

from proxy_addon.db import SQLITE_BUSY_TIMEOUT_MS, make_engine, milliseconds, parse_database_url
from proxy_addon.journal.statements import DriverStatements

LOCK_POLL = 0.001  # seconds between two tries for SQLite's write lock (see _begin_immediate)


class DriverConnection:
    """A driver connection (sqlite3 or psycopg) set up as every other connection of the project (db.py: SQLite in
    WAL mode with synchronous=FULL and a busy timeout; PostgreSQL with its idle-in-transaction timeout), and
    its transactions. Its waits are bounded by `wait` (seconds): a lock (SQLite's busy timeout, PostgreSQL's
    lock_timeout) and, on PostgreSQL, a statement (statement_timeout); and PostgreSQL checks every second that
    the writer is still there while a statement runs, so that a writer killed by its proxy (client.py) does not
    leave a statement behind that would commit later.

    After a failed transaction the connection is closed and the next one opens a fresh one (a SQLite connection
    opened while the file was read-only stays read-only; a PostgreSQL one may be broken). `usable` then says
    whether the failure may be retried request by request: not when connecting failed, nor when COMMIT did
    (it may have happened), nor when the server is gone.
    """

    def __init__(self, database_url: str, wait: float | None = None):
        url = parse_database_url(database_url)
        pool = {"pool_size": 1, "max_overflow": 0} if url.get_backend_name() == "postgresql" else {}
        self.engine = make_engine(database_url, pool_pre_ping=False, lock_wait=wait, statement_wait=wait, **pool)
        if url.get_backend_name() == "postgresql":
            event.listen(self.engine, "connect", _check_client_while_running)
        self.dialect = self.engine.dialect.name
        self.statements = DriverStatements(self.engine.dialect)
        self.usable = True
        self._pooled: Any = None  # SQLAlchemy's PoolProxiedConnection around the driver's connection
        self._wait_ms = None if wait is None else milliseconds(wait)  # what a new connection is set to
        self._bound_ms = self._wait_ms  # what the open connection is set to

    @contextmanager
    def transaction(self, alone: bool = False, within: float | None = None) -> Iterator[Any]:
        """The driver connection in a write transaction, committed on leaving without an exception.

        `alone`: the work writes with at most one statement (one request of the hot path on PostgreSQL, where
        each request's rows are one statement): then it runs in autocommit, the statement its own transaction,
        and no BEGIN or COMMIT round trip is spent on it. `within` (seconds): the work's waits end by then even
        when that is sooner than the connection's own bound (the earliest deadline of its requests)."""
        self.usable = False
        driver = self._driver()
        self.usable = True
        autocommit = alone and self.dialect == "postgresql"
        try:
            if self.dialect == "postgresql" and driver.autocommit != autocommit:
                driver.autocommit = autocommit
            if within is not None:
                self._bound(driver, within)
            if self.dialect == "sqlite":
                self._begin_immediate(driver)
            yield driver
        except BaseException:
            self._discard(driver)
            raise
        try:
            if self.dialect == "sqlite":
                driver.execute("COMMIT")
            elif not autocommit:
                driver.commit()
        except BaseException:
            self.usable = False
            self._discard(driver)
            raise

    def _bound(self, driver: Any, seconds: float) -> None:
        """Bound this connection's waits (a lock; on PostgreSQL, a statement) to `seconds`, or to its own bound
        if that is sooner. Set only when it changes: a SET costs a round trip when it is alone. On PostgreSQL
        the SET is part of the transaction: if that fails, the connection is discarded, and the next one is set
        up afresh."""
        ms = milliseconds(seconds) if math.isfinite(seconds) else self._wait_ms  # no deadline: its own bound
        if ms is not None and self._wait_ms is not None:
            ms = min(ms, self._wait_ms)
        if ms is None or ms == self._bound_ms:
            return
        if self.dialect == "postgresql":  # SQLite's one wait, for the write lock, is _begin_immediate's
            driver.execute(f"SET statement_timeout = {ms}")
            driver.execute(f"SET lock_timeout = {ms}")
        self._bound_ms = ms

    def _begin_immediate(self, driver: Any) -> None:
        """BEGIN IMMEDIATE (the write lock now: no deadlock on a later upgrade), waiting for the lock by polling
        it every LOCK_POLL seconds until the connection's bound.

        SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between its
        tries: a writer that waited through one batch of `receipts prune` (which holds the lock ~25 ms and then
        leaves it as long) slept through the gap after it and the next batch, and lost 100-300 ms where a batch
        took 25 (docs/performance.md, "Prune"). Polled every millisecond it takes the lock in the gap after the
        batch it waited for. The connection's busy timeout stays in force for every other lock it may meet."""
        deadline = time.monotonic() + (self._bound_ms or SQLITE_BUSY_TIMEOUT_MS) / 1000
        driver.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    driver.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as e:
                    if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                        raise
                time.sleep(LOCK_POLL)
        finally:
            driver.execute(f"PRAGMA busy_timeout = {self._bound_ms or SQLITE_BUSY_TIMEOUT_MS}")

    def _driver(self) -> Any:
        if self._pooled is None:
            self._pooled = self.engine.raw_connection()
            self._bound_ms = self._wait_ms
        return self._pooled.driver_connection

    def _discard(self, driver: Any) -> None:
        if getattr(driver, "broken", False):  # psycopg: the server or the socket is gone
            self.usable = False
        with suppress(Exception):
            driver.rollback()
        if self._pooled is not None:
            with suppress(Exception):
                self._pooled.invalidate()  # closes the driver's connection for good
            self._pooled = None

    def close(self) -> None:
        if self._pooled is not None:
            with suppress(Exception):
                self._pooled.close()
            self._pooled = None
        self.engine.dispose()


def _check_client_while_running(dbapi_conn: Any, _record: Any) -> None:
    if dbapi_conn.info.server_version < 140000:  # PostgreSQL 14 has it
        return
    with dbapi_conn.cursor() as cur:
        cur.execute("SET client_connection_check_interval = 1000")
    dbapi_conn.commit()
