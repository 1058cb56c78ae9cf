"""Alembic migrations against the models on both databases, and the schema check (database URLs: test_db.py)."""

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from support.store import intent

from proxy_addon.db import (
    SCHEMA_HEAD,
    alembic_config,
    check_schema,
    head_revision,
    make_engine,
)
from proxy_addon.exceptions import JournalUnavailableError, SchemaNotMigratedError
from proxy_addon.journal.tables import Base
from proxy_addon.store import ReceiptStore

TABLES = {"receipts", "receipt_transitions", "proxy_instances", "duplicate_refusals", "verifier_controls", "audit_checkpoints",
          "audit_events", "approvals", "receipt_counts"}


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
            conn.exec_driver_sql("DROP INDEX ix_receipts_host_seq")
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


def test_the_schema_head_every_command_checks_is_alembics_head():
    assert head_revision() == SCHEMA_HEAD


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


def test_0007_numbers_the_receipts_in_their_creation_rows_order_and_the_rest_after(db_url):
    """receipts.seq for the receipts already there: the order of their creation rows (not of their clocks'
    created_at), then the receipts without one, in created_at order; and a receipt journaled after the upgrade
    comes after all of them (SQLite's max + 1; PostgreSQL's sequence, set past them)."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0006")
    engine = make_engine(db_url)
    try:
        receipt = text(
            "INSERT INTO receipts (operation_id, operation, method, scheme, host, port, path, intent_fingerprint,"
            " account, state, created_at, updated_at)"
            " VALUES (:op, 'x', 'PUT', 'https', 'h', 443, '/', :fp, 'acct', 'submitted', :at, :at)"
        )
        detail = "CAST('{}' AS JSON)" if engine.dialect.name == "postgresql" else "'{}'"
        row = text(f"INSERT INTO receipt_transitions (operation_id, from_state, to_state, recorded_at, detail) VALUES (:op, :frm, :to, :at, {detail})")
        at = {"op_a": "2026-01-01 10:00:05", "op_b": "2026-01-01 10:00:00", "op_z_earlier": "2026-01-01 09:00:00", "op_y_later": "2026-01-01 09:30:00"}
        with engine.begin() as conn:
            for op in ("op_a", "op_b", "op_y_later", "op_z_earlier"):
                conn.execute(receipt, {"op": op, "fp": f"sha256:{op}", "at": at[op]})
            for op in ("op_a", "op_b"):  # op_a journaled first, though its clock said later
                conn.execute(row, {"op": op, "frm": None, "to": "planned", "at": at[op]})
                conn.execute(row, {"op": op, "frm": "planned", "to": "submitted", "at": at[op]})
        command.upgrade(cfg, "head")
        ReceiptStore(engine).receipts.record(new := intent(proxy_instance="me"))
        with engine.connect() as conn:
            seq = dict(conn.exec_driver_sql("SELECT operation_id, seq FROM receipts").all())
    finally:
        engine.dispose()
    assert None not in seq.values(), seq
    assert seq["op_a"] < seq["op_b"] < seq["op_z_earlier"] < seq["op_y_later"] < seq[new.operation_id], seq
