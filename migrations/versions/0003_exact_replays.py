"""exact replays: receipts.response_body_redacted, and the index of writes per target

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-10

Replays are now the upstream's answer byte for byte as first delivered; an answer whose body was stored
redacted is kept for people but never replayed (`response_body_redacted`). Answers stored before this
revision may have been re-serialised or redacted without saying so: they are marked redacted, so that a
repeat within their window is refused (409 duplicate-succeeded) rather than answered with altered bytes.

`ix_receipts_account_target` serves the invalidation rule: a later PUT, PATCH or DELETE to the same target
by the same account ends the replay window of earlier successes there.

Adding a column and an index rebuilds no table, so the views of 0002 stay as they are; the downgrade drops
the column with SQLite's own ALTER TABLE DROP COLUMN (3.35+), which rebuilds nothing either.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('receipts', sa.Column('response_body_redacted', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_index('ix_receipts_account_target', 'receipts', ['account', 'host', 'port', 'path'], unique=False)
    op.execute("UPDATE receipts SET response_body_redacted = true WHERE response_headers IS NOT NULL")


def downgrade() -> None:
    op.drop_index('ix_receipts_account_target', table_name='receipts')
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE receipts DROP COLUMN response_body_redacted")
    else:
        op.drop_column('receipts', 'response_body_redacted')
