"""journal order: receipts.seq, and an index of the writes that may end a replay window

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

`seq` is the order receipts were journaled in (a PostgreSQL sequence, `receipts_seq`; SQLite's max + 1 under
its write lock). The receipts already there get the order of their creation rows in the history, the order
the duplicate decision used until now. The invalidation question ("did a later PUT, PATCH or DELETE of this
account reach this target?") is then one probe of a partial index holding those writes alone
(`ix_receipts_invalidating`), where it read every earlier write of the account to the target
(`ix_receipts_account_target`, dropped).

Adding a nullable column rebuilds no table (the views of 0002 stay).
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INVALIDATING = "method IN ('DELETE', 'PATCH', 'PUT') AND state NOT IN ('rejected', 'safe_to_retry')"


def upgrade() -> None:
    op.add_column('receipts', sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True))
    op.execute(
        "UPDATE receipts SET seq = (SELECT t.id FROM receipt_transitions t "
        "WHERE t.operation_id = receipts.operation_id AND t.from_state IS NULL)"
    )
    _number_the_rest(op.get_bind())
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("CREATE SEQUENCE receipts_seq")
        op.execute("SELECT setval('receipts_seq', GREATEST((SELECT COALESCE(MAX(seq), 0) FROM receipts), 1))")
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.create_index('ix_receipts_seq', ['seq'], unique=True)
        batch_op.create_index(
            'ix_receipts_invalidating', ['account', 'host', 'path', 'port', 'scheme', 'seq'], unique=False,
            sqlite_where=sa.text(INVALIDATING), postgresql_where=sa.text(INVALIDATING),
        )
        batch_op.drop_index('ix_receipts_account_target')


def _number_the_rest(conn: sa.Connection) -> None:
    """A receipt without a creation row (none is written so; written by hand) goes after the others, in the
    order of its creation time."""
    after = conn.execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM receipt_transitions")).scalar_one()
    rest = conn.execute(sa.text("SELECT operation_id FROM receipts WHERE seq IS NULL ORDER BY created_at, operation_id")).scalars()
    for n, operation_id in enumerate(list(rest), start=after + 1):
        conn.execute(sa.text("UPDATE receipts SET seq = :n WHERE operation_id = :op"), {"n": n, "op": operation_id})


def downgrade() -> None:
    with op.batch_alter_table('receipts', schema=None, recreate='never') as batch_op:
        batch_op.create_index('ix_receipts_account_target', ['account', 'host', 'port', 'path'], unique=False)
        batch_op.drop_index('ix_receipts_invalidating')
        batch_op.drop_index('ix_receipts_seq')
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("DROP SEQUENCE receipts_seq")
    op.drop_column('receipts', 'seq')
