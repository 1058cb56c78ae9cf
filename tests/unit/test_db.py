"""Where the database is and how it is opened (db.py): URLs checked before connecting, with no password echoed; a
relative SQLite path anchored at its config; the waits in whole milliseconds; and the connections as set up, on a
SQLite file and on the PostgreSQL server. Migrations and the schema check: test_migrations.py."""

from pathlib import Path

import pytest
from sqlalchemy import event, text

from proxy_addon.db import (
    DATABASE_URL_ENV,
    DEFAULT_DATABASE_URL,
    PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    anchor_sqlite_url,
    database_wait,
    make_engine,
    milliseconds,
    parse_database_url,
    resolve_database_url,
)
from proxy_addon.exceptions import DatabaseURLError


@pytest.mark.parametrize("raw, problem", [
    ("mysql://user:hunter2@db.example.com/receipts", "only sqlite and postgresql"),
    ("mongodb://db.example.com/receipts", "only sqlite and postgresql"),
    ("sqlite://", "must name a SQLite file"),
    ("sqlite:///:memory:", "must name a SQLite file"),
    ("postgresql://user:hunter2@db.example.com", "names no database"),
    ("garbage", "not a valid URL"),
    ("user:hunter2@db.example.com/receipts", "not a valid URL"),
    ("", "not a valid URL"),
])
def test_bad_database_urls_are_one_line(raw, problem):
    with pytest.raises(DatabaseURLError) as err:
        parse_database_url(raw)
    message = str(err.value)
    assert "\n" not in message and problem in message
    assert "hunter2" not in message  # a password is never echoed


def test_make_engine_refuses_a_bad_url_before_connecting():
    with pytest.raises(DatabaseURLError):
        make_engine("mysql://localhost/receipts")


@pytest.mark.parametrize("raw, driver, database", [
    ("postgresql://u@h/db", "postgresql+psycopg", "db"),
    ("postgresql+psycopg2://u@h/db", "postgresql+psycopg", "db"),
    ("postgresql+psycopg://u@h:5433/db", "postgresql+psycopg", "db"),
    ("sqlite:///receipts.db", "sqlite", "receipts.db"),
    ("sqlite:////var/lib/receipts/receipts.db", "sqlite", "/var/lib/receipts/receipts.db"),
])
def test_good_database_urls(raw, driver, database):
    url = parse_database_url(raw)
    assert (url.drivername, url.database) == (driver, database)


@pytest.mark.parametrize("env, configured, expected", [
    ("postgresql://env@h/db", "sqlite:///configured.db", "postgresql://env@h/db"),
    ("postgresql://env@h/db", None, "postgresql://env@h/db"),
    (None, "sqlite:///configured.db", "sqlite:///configured.db"),
    ("", "sqlite:///configured.db", "sqlite:///configured.db"),
    (None, None, DEFAULT_DATABASE_URL),
])
def test_resolve_database_url_precedence(monkeypatch, env, configured, expected):
    if env is None:
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, env)
    assert resolve_database_url(configured) == expected
    assert DEFAULT_DATABASE_URL == "sqlite:///receipts.db"


@pytest.mark.parametrize(("seconds", "ms"), [(10.0, 10_000), (0.0015, 1), (0.0019, 1), (0.0, 1), (0.0001, 1), (2.9999, 2999)])
def test_a_wait_in_whole_milliseconds_rounded_down_and_one_at_least(seconds, ms):
    assert milliseconds(seconds) == ms


def test_the_database_waits_leave_a_third_of_the_journal_timeout_to_answer():
    assert database_wait(15.0) == pytest.approx(10.0) and database_wait(0.3) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("raw", "anchored"),
    [
        ("sqlite:///receipts.db", "sqlite:////etc/receipts/receipts.db"),
        ("sqlite:///data/r.db", "sqlite:////etc/receipts/data/r.db"),
        ("sqlite:////var/lib/r.db", "sqlite:////var/lib/r.db"),  # absolute: as given
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite://", "sqlite://"),
        ("sqlite:///file:r.db?mode=ro&uri=true", "sqlite:///file:r.db?mode=ro&uri=true"),
        ("postgresql://u:p@h/receipts.db", "postgresql://u:p@h/receipts.db"),
        ("not a url", "not a url"),  # reported by parse_database_url, later
    ],
)
def test_a_relative_sqlite_path_is_anchored_at_the_configs_directory(raw, anchored):
    assert anchor_sqlite_url(raw, Path("/etc/receipts")) == anchored


def test_a_sqlite_connection_is_durable_and_every_transaction_takes_the_write_lock_first(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}", lock_wait=2.5)
    begun: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cur, statement, *a: begun.append(statement))
    try:
        with engine.begin() as conn:
            pragmas = {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                       for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")}
        assert pragmas == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1, "busy_timeout": 2500}
        assert begun[0] == "BEGIN IMMEDIATE"
        with engine.connect().execution_options(sqlite_begin="DEFERRED") as conn, conn.begin():
            conn.execute(text("SELECT 1"))
        assert "BEGIN DEFERRED" in begun
    finally:
        engine.dispose()


def test_a_sqlite_connection_waits_ten_seconds_for_the_lock_unless_told(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_postgres_session_gets_the_waits_and_the_urls_own_options_win(pg_server):
    def settings(url: str, **kwargs) -> tuple[str, str, str]:
        engine = make_engine(url, pool_size=1, **kwargs)
        try:
            with engine.connect() as conn:
                return tuple(conn.exec_driver_sql(f"SHOW {name}").scalar()
                             for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"))
        finally:
            engine.dispose()

    assert settings(pg_server, lock_wait=2.5, statement_wait=0.0004) == ("2500ms", "1ms", f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s")
    assert settings(pg_server) == ("0", "0", f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s")  # no wait of ours given
    own = pg_server + ("&" if "?" in pg_server else "?") + "options=-c%20lock_timeout%3D7s"
    assert settings(own, lock_wait=2.5)[0] == "7s"


@pytest.mark.postgres
def test_a_postgres_session_runs_without_jit_unless_the_url_says(pg_server):
    """The journal's statements are short index lookups, whose plans JIT would compile on every execution once a
    cost estimate passes jit_above_cost: every session has it off; the URL's own `options` still win."""

    def jit(url: str) -> str:
        engine = make_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                return conn.exec_driver_sql("SHOW jit").scalar()
        finally:
            engine.dispose()

    assert jit(pg_server) == "off"
    assert jit(pg_server + ("&" if "?" in pg_server else "?") + "options=-c%20jit%3Don") == "on"
