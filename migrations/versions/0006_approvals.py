"""approvals: a person's approval of one intent before a write that needs one is forwarded

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

One row per approval asked for (account + fingerprint), with the request as journaled (redacted) for the
person who decides. At most one pending approval per intent (a partial unique index), so that replicas
asking at once share it. A new table only: no existing table or view is rebuilt.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = "state = 'pending'"


def upgrade() -> None:
    op.create_table('approvals',
    sa.Column('approval_id', sa.String(length=64), nullable=False),
    sa.Column('account', sa.String(length=80), nullable=False),
    sa.Column('intent_fingerprint', sa.String(length=80), nullable=False),
    sa.Column('operation', sa.Text(), nullable=False),
    sa.Column('method', sa.String(length=16), nullable=False),
    sa.Column('scheme', sa.String(length=8), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('query', sa.Text(), nullable=True),
    sa.Column('request_headers', sa.JSON(), nullable=True),
    sa.Column('request_body', sa.LargeBinary(), nullable=True),
    sa.Column('request_body_size', sa.Integer(), server_default='0', nullable=False),
    sa.Column('request_body_truncated', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('body_note', sa.Text(), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_seconds', sa.Float(), nullable=False),
    sa.Column('asked', sa.Integer(), server_default='0', nullable=False),
    sa.Column('last_asked_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('decided_by', sa.Text(), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('operation_id', sa.String(length=64), nullable=True),
    sa.Column('proxy_instance', sa.String(length=64), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'approved', 'denied', 'used', 'expired')",
                       name=op.f('ck_approvals_state')),
    sa.PrimaryKeyConstraint('approval_id', name=op.f('pk_approvals'))
    )
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.create_index('ix_approvals_state_requested_at', ['state', 'requested_at'], unique=False)
        batch_op.create_index('ix_approvals_account_fingerprint_state',
                              ['account', 'intent_fingerprint', 'state'], unique=False)
        batch_op.create_index('uq_approvals_pending_intent', ['account', 'intent_fingerprint'], unique=True,
                              sqlite_where=sa.text(PENDING), postgresql_where=sa.text(PENDING))


def downgrade() -> None:
    with op.batch_alter_table('approvals', schema=None) as batch_op:
        batch_op.drop_index('uq_approvals_pending_intent', sqlite_where=sa.text(PENDING), postgresql_where=sa.text(PENDING))
        batch_op.drop_index('ix_approvals_account_fingerprint_state')
        batch_op.drop_index('ix_approvals_state_requested_at')
    op.drop_table('approvals')
