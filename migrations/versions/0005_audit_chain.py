"""audit chain: receipt_transitions.hash, receipts.history_head, audit_checkpoints, audit_events

Revision ID: 0005
Revises: 0004
Create Date: 2027-02-10

Every history row gets `hash` (audit/chain.py: its content and the previous row's hash for the same
receipt, the first row chained from the receipt's identity) and every receipt its chain's head. The history
already there is chained here, in Python, with the same function the writes use, and one `migrated` audit
event says so: `receipts verify` shows it, and the first `receipts checkpoint` signs it, because what those
rows held before this migration is covered only from now on.

Adding nullable columns rebuilds no table (the views of 0002 stay); the downgrade drops them with SQLite's
own ALTER TABLE DROP COLUMN (3.35+), as 0003 does.
"""
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from proxy_addon.audit.chain import Identity, chained, genesis
from proxy_addon.journal.tables import UTCDateTime

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 500
HASH = sa.String(71)

_receipts = sa.table(
    'receipts', *(sa.column(c) for c in ('operation_id', 'account', 'intent_fingerprint', 'method', 'scheme', 'host', 'port', 'path')),
    sa.column('created_at', UTCDateTime()), sa.column('history_head'),
)
_transitions = sa.table(
    'receipt_transitions', sa.column('id'), sa.column('operation_id'), sa.column('from_state'), sa.column('to_state'),
    sa.column('recorded_at', UTCDateTime()), sa.column('detail', sa.JSON()), sa.column('hash'),
)
_events = sa.table(
    'audit_events', sa.column('operation_id'), sa.column('kind'), sa.column('recorded_at', UTCDateTime()), sa.column('note'),
)


def upgrade() -> None:
    op.add_column('receipts', sa.Column('history_head', HASH, nullable=True))
    op.add_column('receipt_transitions', sa.Column('hash', HASH, nullable=True))
    op.create_table('audit_checkpoints',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.Column('root', HASH, nullable=False),
    sa.Column('heads', sa.JSON(), nullable=False),
    sa.Column('signed', sa.Text(), nullable=False),
    sa.Column('signature', sa.Text(), nullable=False),
    sa.Column('public_key', sa.Text(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_checkpoints'))
    )
    op.create_table('audit_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('head_before', HASH, nullable=True),
    sa.Column('head_after', HASH, nullable=True),
    sa.Column('recorded_at', UTCDateTime(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.CheckConstraint("kind IN ('pruned', 'rechained', 'migrated')", name=op.f('ck_audit_events_kind')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    op.create_index('ix_audit_events_operation_id', 'audit_events', ['operation_id'], unique=False)
    _chain_existing_history(op.get_bind())


def _chain_existing_history(conn: sa.Connection) -> None:
    """Hash every history row already there, receipt by receipt, and note it once if there was any."""
    receipts = rows = 0
    after = ""
    while True:
        batch = conn.execute(
            sa.select(_receipts).where(_receipts.c.operation_id > after).order_by(_receipts.c.operation_id).limit(BATCH)
        ).all()
        if not batch:
            break
        rows += _chain_batch(conn, batch)
        receipts += len(batch)
        after = batch[-1].operation_id
    if receipts:
        note = f"{receipts} receipts with {rows} history rows existed before the audit chain; migration 0005 chained them as they were"
        conn.execute(sa.insert(_events).values(operation_id="*", kind="migrated", recorded_at=datetime.now(UTC), note=note))


def _chain_batch(conn: sa.Connection, batch: Sequence[sa.Row[tuple[object, ...]]]) -> int:
    ids = [r.operation_id for r in batch]
    history: dict[str, list[dict[str, object]]] = {op_id: [] for op_id in ids}
    query = sa.select(_transitions).where(_transitions.c.operation_id.in_(ids)).order_by(_transitions.c.id)
    for row in conn.execute(query):
        history[row.operation_id].append(dict(row._mapping))
    hashes, heads = [], []
    for receipt in batch:
        rows = history[receipt.operation_id]
        chain = chained(genesis(Identity.of(receipt._mapping)), rows)
        hashes += [{"row_id": row["id"], "row_hash": h} for row, h in zip(rows, chain, strict=True)]
        if chain:
            heads.append({"receipt_id": receipt.operation_id, "head": chain[-1]})
    if hashes:
        conn.execute(sa.update(_transitions).where(_transitions.c.id == sa.bindparam("row_id")).values(hash=sa.bindparam("row_hash")), hashes)
    if heads:
        conn.execute(
            sa.update(_receipts).where(_receipts.c.operation_id == sa.bindparam("receipt_id")).values(history_head=sa.bindparam("head")),
            heads,
        )
    return len(hashes)


def downgrade() -> None:
    op.drop_index('ix_audit_events_operation_id', table_name='audit_events')
    op.drop_table('audit_events')
    op.drop_table('audit_checkpoints')
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE receipt_transitions DROP COLUMN hash")
        op.execute("ALTER TABLE receipts DROP COLUMN history_head")
    else:
        op.drop_column('receipt_transitions', 'hash')
        op.drop_column('receipts', 'history_head')
