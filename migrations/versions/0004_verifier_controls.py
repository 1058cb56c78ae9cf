"""verifier controls: the runs of each read rule's positive and negative controls, with their history

Revision ID: 0004
Revises: 0003
Create Date: 2027-02-01

A reconcile verdict trusts a read rule only while its controls passed on the live upstream within
`controls.max_age`; `receipts rules check` and the reconciler record each run here. A new table only: no
existing table or view is rebuilt.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('verifier_controls',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('checked_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('operation', sa.Text(), nullable=False),
    sa.Column('account', sa.String(length=80), nullable=False),
    sa.Column('rule', sa.String(length=80), nullable=False),
    sa.Column('control', sa.String(length=16), nullable=False),
    sa.Column('result', sa.String(length=24), nullable=False),
    sa.Column('known_operation_id', sa.String(length=64), nullable=True),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.CheckConstraint("control IN ('positive', 'negative')", name=op.f('ck_verifier_controls_control')),
    sa.CheckConstraint("result IN ('passed', 'failed', 'read_failed', 'no_known_success')",
                       name=op.f('ck_verifier_controls_result')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_verifier_controls'))
    )
    with op.batch_alter_table('verifier_controls', schema=None) as batch_op:
        batch_op.create_index('ix_verifier_controls_checked_at', ['checked_at'], unique=False)
        batch_op.create_index('ix_verifier_controls_rule',
                              ['host', 'port', 'operation', 'account', 'rule', 'control', 'checked_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('verifier_controls', schema=None) as batch_op:
        batch_op.drop_index('ix_verifier_controls_rule')
        batch_op.drop_index('ix_verifier_controls_checked_at')
    op.drop_table('verifier_controls')
