"""list pages: the filters of `ls`, the review page and the admin API in journal order

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

Every list is newest first by `seq` and pages by it (`after`: the receipts journaled before a given one). A
filter by state or host reads its index in that order and stops at the page's end, where the single-column
indexes it replaces found every receipt of that state or host and sorted them (a million `succeeded` receipts
for a page of 50). The single-column indexes were prefixes of these, so nothing else loses an index.
"""
from collections.abc import Sequence

from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.create_index('ix_receipts_state_seq', ['state', 'seq'], unique=False)
        batch_op.create_index('ix_receipts_host_seq', ['host', 'seq'], unique=False)
        batch_op.drop_index('ix_receipts_state')
        batch_op.drop_index('ix_receipts_host')


def downgrade() -> None:
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.create_index('ix_receipts_host', ['host'], unique=False)
        batch_op.create_index('ix_receipts_state', ['state'], unique=False)
        batch_op.drop_index('ix_receipts_host_seq')
        batch_op.drop_index('ix_receipts_state_seq')
