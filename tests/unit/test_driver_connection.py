"""The writer's connection on SQLite: it waits for the write lock by polling it (journal/connection.py)."""

import sqlite3
import threading
from pathlib import Path

import pytest

from proxy_addon.journal import connection as connection_module
from proxy_addon.journal.connection import LOCK_POLL, DriverConnection


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "lock.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (n INTEGER)")
    return path


class LockHolder:
    """Another writer: holds SQLite's write lock from `hold()` until `release()`."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def hold(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


def test_a_writer_waiting_for_the_lock_polls_it_and_takes_it_once_free(db_path, monkeypatch):
    holder = LockHolder(db_path)
    holder.hold()
    polls: list[float] = []
    polled = threading.Event()
    real_sleep = connection_module.time.sleep

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        polled.set()
        real_sleep(seconds)

    monkeypatch.setattr(connection_module.time, "sleep", sleep)
    connection = DriverConnection(f"sqlite:///{db_path}", wait=30)
    done = threading.Event()

    def write() -> None:
        with connection.transaction() as driver:
            driver.execute("INSERT INTO t VALUES (1)")
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert polled.wait(10), "the writer did not poll for the lock while another writer held it"
    assert not done.is_set()
    holder.release()
    writer.join(10)
    assert done.is_set()
    assert set(polls) == {LOCK_POLL}
    with sqlite3.connect(db_path) as check:
        assert check.execute("SELECT n FROM t").fetchall() == [(1,)]
    busy_ms = connection._driver().execute("PRAGMA busy_timeout").fetchone()[0]
    assert busy_ms == 30_000, "every other lock the connection meets waits its bound, as before"
    connection.close()


def test_a_writer_gives_up_waiting_at_its_bound(db_path):
    holder = LockHolder(db_path)
    holder.hold()
    connection = DriverConnection(f"sqlite:///{db_path}", wait=30)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"), connection.transaction(within=0.05):
            pass
    finally:
        holder.release()
    with connection.transaction() as driver:  # a fresh connection, the lock free
        driver.execute("INSERT INTO t VALUES (2)")
    connection.close()
