"""receipt counts: how many receipts each host has in each state, kept by triggers on `receipts`

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

Also `ix_receipts_terminal_completed_at`, over the terminal receipts alone: prune and retention take the oldest
first, a batch at a time (one probe at the index's start, not a sort of every terminal receipt per batch).

`receipts stats`, the metrics and the review page counted the whole history on every read (seconds at a million
receipts). Now every change of `receipts` (a new receipt, a state changed, a receipt deleted) adds rows to
`receipt_counts` in its own transaction: `+1` for the state entered, `-1` for the one left. Triggers, so that
no writer can forget it (the proxy's journal writer, the store's general path, recovery, `prune`, a person's SQL).
Insert-only on the write path: no counter row that two writers would wait for. The counts are the sums by
(host, state); store/retention.py folds the rows together now and then. The receipts already there are counted
here, once.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "state IN ('rejected', 'safe_to_retry', 'succeeded')"
SQLITE_TRIGGERS = (
    """CREATE TRIGGER receipts_counted_insert AFTER INSERT ON receipts BEGIN
         INSERT INTO receipt_counts (host, state, n) VALUES (NEW.host, NEW.state, 1); END""",
    """CREATE TRIGGER receipts_counted_update AFTER UPDATE OF state ON receipts WHEN OLD.state <> NEW.state BEGIN
         INSERT INTO receipt_counts (host, state, n) VALUES (OLD.host, OLD.state, -1), (NEW.host, NEW.state, 1); END""",
    """CREATE TRIGGER receipts_counted_delete AFTER DELETE ON receipts BEGIN
         INSERT INTO receipt_counts (host, state, n) VALUES (OLD.host, OLD.state, -1); END""",
)
# Statement triggers with transition tables: one insert per statement, summed, however many rows it changed
# (a prune batch deletes thousands with one statement).
_PG_FUNCTION = """CREATE FUNCTION receipts_counted_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO receipt_counts (host, state, n)
  SELECT host, state, SUM(n) FROM ({rows}) AS changed GROUP BY host, state HAVING SUM(n) <> 0;
  RETURN NULL;
END $$"""
_PG_TRIGGER = """CREATE TRIGGER receipts_counted_{name} AFTER {event} ON receipts REFERENCING {tables}
  FOR EACH STATEMENT EXECUTE FUNCTION receipts_counted_{name}()"""
_NEW = "SELECT host, state, 1 AS n FROM new_rows"
_OLD = "SELECT host, state, -1 AS n FROM old_rows"
PG_TRIGGERS = (
    ("insert", "INSERT", "NEW TABLE AS new_rows", _NEW),
    ("update", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows", f"{_OLD} UNION ALL {_NEW}"),
    ("delete", "DELETE", "OLD TABLE AS old_rows", _OLD),
)


def upgrade() -> None:
    op.create_table('receipt_counts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('n', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_receipt_counts'))
    )
    op.execute("INSERT INTO receipt_counts (host, state, n) SELECT host, state, COUNT(*) FROM receipts GROUP BY host, state")
    op.create_index('ix_receipts_terminal_completed_at', 'receipts', ['completed_at'], unique=False,
                    sqlite_where=sa.text(TERMINAL), postgresql_where=sa.text(TERMINAL))
    if op.get_bind().dialect.name == 'postgresql':
        for name, event, tables, rows in PG_TRIGGERS:
            op.execute(_PG_FUNCTION.format(name=name, rows=rows))
            op.execute(_PG_TRIGGER.format(name=name, event=event, tables=tables))
    else:
        for trigger in SQLITE_TRIGGERS:
            op.execute(trigger)


def downgrade() -> None:
    for name, *_ in PG_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS receipts_counted_{name}" + (" ON receipts" if op.get_bind().dialect.name == 'postgresql' else ""))
        if op.get_bind().dialect.name == 'postgresql':
            op.execute(f"DROP FUNCTION IF EXISTS receipts_counted_{name}()")
    op.drop_index('ix_receipts_terminal_completed_at', table_name='receipts')
    op.drop_table('receipt_counts')
