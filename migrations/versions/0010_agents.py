"""agents: which agent made each write (`receipts.agent`, `duplicate_refusals.agent`), and the views that show it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

An agent names itself with proxy authentication (`HTTPS_PROXY=http://NAME:TOKEN@host:port`); its name is kept on
its receipts and on the duplicates refused to it, null for an anonymous agent. `ix_receipts_agent_seq` pages one
agent's receipts newest first (keyset, as the other lists: migration 0009), the anonymous ones (`agent IS NULL`)
included.

The dashboard views that list receipt columns (migration 0002) are made again with `agent`, and one is new:
`v_agent_activity`, every receipt with its agent and its age, for "what did the billing agent do last night?".
The views' text is written out here, not imported from 0002: a migration says what the schema was at its
revision, whatever later ones change.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_STATES = "'manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted'"
UNKNOWN_STATES = "'outcome_unknown', 'reconciling', 'manual_review'"
EXPRESSIONS = {  # as in 0002: per dialect, {c} a UTC timestamp column
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

_OPEN_RECEIPTS = """
        SELECT operation_id, operation, method, scheme, host, port, path, state, created_at, updated_at,
               submitted_at, status_code, error_code, error_message, external_id, reconcile_attempts,
               next_attempt_at, proxy_instance, {agent}{age:created_at} AS age_seconds
        FROM receipts
        WHERE state IN ({open_states})"""
_UNKNOWNS_BY_HOST = """
        SELECT host,
               COUNT(*) AS unknown_count,
               SUM(CASE WHEN state = 'manual_review' THEN 1 ELSE 0 END) AS manual_review_count,
               MAX(age_seconds) AS oldest_age_seconds
        FROM v_open_receipts
        WHERE state IN ({unknown_states})
        GROUP BY host"""
_DUPLICATES_REFUSED = """
        SELECT d.id, d.refused_at, {day:d.refused_at} AS day, {days_ago:d.refused_at} AS days_ago,
               {age:d.refused_at} AS age_seconds, d.reason, d.method, d.host, d.path, d.account,
               d.intent_fingerprint, d.proxy_instance, d.blocking_operation_id,
               b.operation AS blocking_operation, b.state AS blocking_state, b.external_id AS blocking_external_id{d_agent}
        FROM duplicate_refusals AS d
        LEFT JOIN receipts AS b ON b.operation_id = d.blocking_operation_id"""
# every receipt with its agent (null: anonymous), its UTC day and its age
_AGENT_ACTIVITY = """
        SELECT operation_id, agent, operation, method, host, path, state, status_code, error_code, external_id,
               created_at, {day:created_at} AS day, {days_ago:created_at} AS days_ago, {age:created_at} AS age_seconds
        FROM receipts"""

# the views this revision makes again or adds, in the order they are created (v_unknowns_by_host reads v_open_receipts)
VIEWS = {
    "v_open_receipts": _OPEN_RECEIPTS,
    "v_unknowns_by_host": _UNKNOWNS_BY_HOST,
    "v_duplicates_refused": _DUPLICATES_REFUSED,
    "v_agent_activity": _AGENT_ACTIVITY,
}
BEFORE = ("v_open_receipts", "v_unknowns_by_host", "v_duplicates_refused")  # 0002's, without agent


def view_sql(name: str, dialect: str, with_agent: bool) -> str:
    sql = VIEWS[name].replace("{open_states}", OPEN_STATES).replace("{unknown_states}", UNKNOWN_STATES)
    sql = sql.replace("{agent}", "agent, " if with_agent else "").replace("{d_agent}", ", d.agent" if with_agent else "")
    for key, template in EXPRESSIONS[dialect].items():
        for column in ("created_at", "d.refused_at"):
            sql = sql.replace("{" + key + ":" + column + "}", template.format(c=column))
    return f"CREATE VIEW {name} AS {sql.strip()}"


def _drop_views() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('agent', sa.String(length=255), nullable=True))
        batch_op.create_index('ix_receipts_agent_seq', ['agent', 'seq'], unique=False)
    with op.batch_alter_table('duplicate_refusals', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('agent', sa.String(length=255), nullable=True))
    dialect = op.get_bind().dialect.name
    for name in VIEWS:
        op.execute(view_sql(name, dialect, with_agent=True))


def downgrade() -> None:
    _drop_views()
    with op.batch_alter_table('duplicate_refusals', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('agent')
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.drop_index('ix_receipts_agent_seq')
        batch_op.drop_column('agent')
    dialect = op.get_bind().dialect.name
    for name in BEFORE:
        op.execute(view_sql(name, dialect, with_agent=False))
