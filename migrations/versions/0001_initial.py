"""initial schema: receipts, receipt_transitions, proxy_instances

Revision ID: 0001
Revises: 
Create Date: 2026-12-02
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('proxy_instances',
    sa.Column('instance_id', sa.String(length=64), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('recovered_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('instance_id', name=op.f('pk_proxy_instances'))
    )
    op.create_table('receipts',
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('operation', sa.Text(), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('scheme', sa.String(length=8), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('query', sa.Text(), nullable=True),
    sa.Column('intent_fingerprint', sa.String(length=80), nullable=False),
    sa.Column('account', sa.String(length=80), nullable=False),
    sa.Column('idempotency_key', sa.String(length=255), nullable=True),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('external_id', sa.Text(), nullable=True),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('authentication_recorded', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('proxy_instance', sa.String(length=64), nullable=True),
    sa.Column('request_headers', sa.JSON(), nullable=True),
    sa.Column('request_body', sa.LargeBinary(), nullable=True),
    sa.Column('request_body_size', sa.Integer(), server_default='0', nullable=False),
    sa.Column('request_body_truncated', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('body_note', sa.Text(), nullable=True),
    sa.Column('response_headers', sa.JSON(), nullable=True),
    sa.Column('response_body', sa.LargeBinary(), nullable=True),
    sa.Column('response_body_truncated', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('reconcile_attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('planned', 'submitted', 'succeeded', 'rejected', 'outcome_unknown', 'reconciling', 'safe_to_retry', 'manual_review')", name=op.f('ck_receipts_state')),
    sa.CheckConstraint('authentication_recorded = false', name=op.f('ck_receipts_no_authentication')),
    sa.PrimaryKeyConstraint('operation_id', name=op.f('pk_receipts'))
    )
    with op.batch_alter_table('receipts', schema=None) as batch_op:
        batch_op.create_index('ix_receipts_account_fingerprint_completed', ['account', 'intent_fingerprint', 'completed_at'], unique=False)
        batch_op.create_index('ix_receipts_account_idempotency_key', ['account', 'idempotency_key'], unique=False)
        batch_op.create_index('ix_receipts_created_at', ['created_at'], unique=False)
        batch_op.create_index('ix_receipts_host', ['host'], unique=False)
        batch_op.create_index('ix_receipts_proxy_instance_state', ['proxy_instance', 'state'], unique=False)
        batch_op.create_index('ix_receipts_state', ['state'], unique=False)
        batch_op.create_index('ix_receipts_state_next_attempt', ['state', 'next_attempt_at'], unique=False)
        batch_op.create_index('uq_receipts_open_intent', ['account', 'intent_fingerprint'], unique=True, sqlite_where=sa.text("state IN ('manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted')"), postgresql_where=sa.text("state IN ('manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted')"))

    op.create_table('receipt_transitions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('from_state', sa.String(length=20), nullable=True),
    sa.Column('to_state', sa.String(length=20), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['operation_id'], ['receipts.operation_id'], name=op.f('fk_receipt_transitions_operation_id_receipts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_receipt_transitions'))
    )
    with op.batch_alter_table('receipt_transitions', schema=None) as batch_op:
        batch_op.create_index('ix_receipt_transitions_operation_id', ['operation_id', 'id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('receipt_transitions', schema=None) as batch_op:
        batch_op.drop_index('ix_receipt_transitions_operation_id')

    op.drop_table('receipt_transitions')
    with op.batch_alter_table('receipts', schema=None) as batch_op:
        batch_op.drop_index('uq_receipts_open_intent', sqlite_where=sa.text("state IN ('manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted')"), postgresql_where=sa.text("state IN ('manual_review', 'outcome_unknown', 'planned', 'reconciling', 'submitted')"))
        batch_op.drop_index('ix_receipts_state_next_attempt')
        batch_op.drop_index('ix_receipts_state')
        batch_op.drop_index('ix_receipts_proxy_instance_state')
        batch_op.drop_index('ix_receipts_host')
        batch_op.drop_index('ix_receipts_created_at')
        batch_op.drop_index('ix_receipts_account_idempotency_key')
        batch_op.drop_index('ix_receipts_account_fingerprint_completed')

    op.drop_table('receipts')
    op.drop_table('proxy_instances')
