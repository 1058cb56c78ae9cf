"""Alembic migrations against the models on both databases, the schema check, and database URL handling."""

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from proxy_addon.db import (
    DATABASE_URL_ENV,
    DEFAULT_DATABASE_URL,
    alembic_config,
    check_schema,
    head_revision,
    make_engine,
    parse_database_url,
    resolve_database_url,
)
from proxy_addon.exceptions import DatabaseURLError, JournalUnavailableError, SchemaNotMigratedError
from proxy_addon.store.tables import Base

TABLES = {"receipts", "receipt_transitions", "proxy_instances", "duplicate_refusals"}


def schema_diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_migrations_match_the_models(migrated_url):
    assert tables(migrated_url) == TABLES
    assert schema_diff(migrated_url) == []


def test_the_diff_check_can_see_a_difference(migrated_url):
    engine = make_engine(migrated_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP INDEX ix_receipts_host")
    finally:
        engine.dispose()
    assert [d[0] for d in schema_diff(migrated_url)] == ["add_index"]


def test_downgrade_to_base_then_upgrade_again(migrated_url):
    cfg = alembic_config(migrated_url)
    command.downgrade(cfg, "base")
    assert tables(migrated_url) == set()
    command.upgrade(cfg, "head")
    command.upgrade(cfg, "head")  # already at head: nothing to do
    assert tables(migrated_url) == TABLES
    assert schema_diff(migrated_url) == []


def test_check_schema_refuses_an_unmigrated_database(db_url):
    engine = make_engine(db_url)
    try:
        with pytest.raises(SchemaNotMigratedError) as err:
            check_schema(engine)
        assert "\n" not in str(err.value) and "receipts db upgrade" in str(err.value)
        assert "none" in str(err.value) and head_revision() in str(err.value)
        command.upgrade(alembic_config(db_url), "head")
        check_schema(engine)
        with engine.begin() as conn:  # at some other revision (older, or from a newer release): refused too
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'ffff'")
        with pytest.raises(SchemaNotMigratedError, match="ffff"):
            check_schema(engine)
        command.stamp(alembic_config(db_url), "head", purge=True)
        check_schema(engine)
        command.downgrade(alembic_config(db_url), "base")
        with pytest.raises(SchemaNotMigratedError):
            check_schema(engine)
    finally:
        engine.dispose()


def test_check_schema_on_an_unreachable_database(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'receipts.db'}")
    try:
        with pytest.raises(JournalUnavailableError) as err:
            check_schema(engine)
        assert "\n" not in str(err.value)
    finally:
        engine.dispose()


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


def test_0003_marks_answers_stored_before_it_as_not_replayable(db_url):
    """Answers stored before byte-exact replays may have been re-serialised or redacted: never replayed."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0002")
    engine = make_engine(db_url)
    try:
        json_value = "CAST(:headers AS JSON)" if engine.dialect.name == "postgresql" else ":headers"
        insert = text(
            "INSERT INTO receipts (operation_id, operation, method, scheme, host, port, path, intent_fingerprint,"
            " account, state, created_at, updated_at, response_headers)"
            f" VALUES (:op, 'x', 'POST', 'http', 'h', 80, '/', 'sha256:0', 'acct', 'succeeded',"
            f" CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, {json_value})"
        )
        with engine.begin() as conn:
            for op, headers in (("op_with_answer", '{"content-type": "application/json"}'), ("op_without", None)):
                conn.execute(insert, {"op": op, "headers": headers})
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            marked = dict(conn.exec_driver_sql("SELECT operation_id, response_body_redacted FROM receipts").all())
    finally:
        engine.dispose()
    assert {op: bool(v) for op, v in marked.items()} == {"op_with_answer": True, "op_without": False}
