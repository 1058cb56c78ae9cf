"""dashboard: duplicate_refusals, and the SQL views an ops dashboard reads

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Views are not models (autogenerate compares tables only). Each is written once, with the few expressions that
differ per dialect filled in: an age in seconds, a UTC day as 'YYYY-MM-DD' text, and whole days ago, so that
docs/queries.sql runs unchanged on SQLite and PostgreSQL. SQLite keeps the UTC datetimes as naive
'YYYY-MM-DD HH:MM:SS.ffffff' text, which julianday() and date() read.

A later migration that rebuilds `receipts` or `duplicate_refusals` with SQLite batch mode must drop these
views first and create them again after (SQLite checks views when the rebuilt table is renamed into place).
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_STATES = "'manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted'"
UNKNOWN_STATES = "'outcome_unknown', 'reconciling', 'manual_review'"

# per dialect: {c} is a UTC timestamp column
EXPRESSIONS = {
    "postgresql": {
        "age": "CAST(EXTRACT(EPOCH FROM (now() - {c})) AS DOUBLE PRECISION)",
        "day": "to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
        "days_ago": "(CAST(now() AT TIME ZONE 'UTC' AS DATE) - CAST({c} AT TIME ZONE 'UTC' AS DATE))",
    },
    "sqlite": {
        "age": "((julianday('now') - julianday({c})) * 86400.0)",
        "day": "date({c})",
        "days_ago": "CAST(julianday(date('now')) - julianday(date({c})) AS INTEGER)",
    },
}

VIEWS = {
    # every open receipt, with how long ago it was created
    "v_open_receipts": """
        SELECT operation_id, operation, method, scheme, host, port, path, state, created_at, updated_at,
               submitted_at, status_code, error_code, error_message, external_id, reconcile_attempts,
               next_attempt_at, proxy_instance, {age:created_at} AS age_seconds
        FROM receipts
        WHERE state IN ({open_states})""",
    # receipts whose outcome nobody knows yet, per host
    "v_unknowns_by_host": """
        SELECT host,
               COUNT(*) AS unknown_count,
               SUM(CASE WHEN state = 'manual_review' THEN 1 ELSE 0 END) AS manual_review_count,
               MAX(age_seconds) AS oldest_age_seconds
        FROM v_open_receipts
        WHERE state IN ({unknown_states})
        GROUP BY host""",
    # receipts created per UTC day, by host and current state
    "v_daily_counts": """
        SELECT day, days_ago, host, state, COUNT(*) AS receipt_count
        FROM (SELECT {day:created_at} AS day, {days_ago:created_at} AS days_ago, host, state FROM receipts) AS r
        GROUP BY day, days_ago, host, state""",
    # every refused or replayed duplicate, with the receipt that blocked it (gone if pruned since)
    "v_duplicates_refused": """
        SELECT d.id, d.refused_at, {day:d.refused_at} AS day, {days_ago:d.refused_at} AS days_ago,
               {age:d.refused_at} AS age_seconds, d.reason, d.method, d.host, d.path, d.account,
               d.intent_fingerprint, d.proxy_instance, d.blocking_operation_id,
               b.operation AS blocking_operation, b.state AS blocking_state, b.external_id AS blocking_external_id
        FROM duplicate_refusals AS d
        LEFT JOIN receipts AS b ON b.operation_id = d.blocking_operation_id""",
}


def view_sql(name: str, dialect: str) -> str:
    sql = VIEWS[name].replace("{open_states}", OPEN_STATES).replace("{unknown_states}", UNKNOWN_STATES)
    for key, template in EXPRESSIONS[dialect].items():
        for column in ("created_at", "d.refused_at"):
            sql = sql.replace("{" + key + ":" + column + "}", template.format(c=column))
    return f"CREATE VIEW {name} AS {sql.strip()}"


def upgrade() -> None:
    op.create_table('duplicate_refusals',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('refused_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reason', sa.String(length=40), nullable=False),
    sa.Column('blocking_operation_id', sa.String(length=64), nullable=False),
    sa.Column('account', sa.String(length=80), nullable=False),
    sa.Column('intent_fingerprint', sa.String(length=80), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('proxy_instance', sa.String(length=64), nullable=True),
    sa.CheckConstraint("reason IN ('duplicate_open', 'duplicate_succeeded_replay', 'duplicate_succeeded_refuse', 'idempotency_key_mismatch')", name=op.f('ck_duplicate_refusals_reason')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_duplicate_refusals'))
    )
    with op.batch_alter_table('duplicate_refusals', schema=None) as batch_op:
        batch_op.create_index('ix_duplicate_refusals_blocking_operation_id', ['blocking_operation_id'], unique=False)
        batch_op.create_index('ix_duplicate_refusals_refused_at', ['refused_at'], unique=False)

    dialect = op.get_bind().dialect.name
    for name in VIEWS:  # in order: v_unknowns_by_host reads v_open_receipts
        op.execute(view_sql(name, dialect))


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")

    with op.batch_alter_table('duplicate_refusals', schema=None) as batch_op:
        batch_op.drop_index('ix_duplicate_refusals_refused_at')
        batch_op.drop_index('ix_duplicate_refusals_blocking_operation_id')

    op.drop_table('duplicate_refusals')
