"""The audit chain on SQLite and PostgreSQL: every write path chains its history rows (the writer's batch,
pipelined on PostgreSQL, and the store's general path: record, advance, the reconcile claim, recovery, a
person's resolve, prune, scrub), the hashes reproduce from the values read back, and each way of tampering
with the tables is named by `verify` (checkpoints checked with the public key alone)."""

from datetime import timedelta

import pytest
from alembic import command
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import JSON, column, delete, insert, select, table, update
from support.store import S, fp, intent, raw_row, recorded, walk

from proxy_addon.audit.chain import Identity, chained, genesis
from proxy_addon.audit.checkpoint import make_checkpoint
from proxy_addon.audit.verify import Report, Tampering, verify
from proxy_addon.db import alembic_config, make_engine
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.driver import OnDriver
from proxy_addon.journal.messages import Advance, Done, Record
from proxy_addon.journal.rows import NewReceipt, Step
from proxy_addon.journal.tables import UTCDateTime
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.rules.records import utcnow
from proxy_addon.store import ReceiptStore
from proxy_addon.store.audit import checkpoints
from proxy_addon.store.receipts import receipts, transitions
from proxy_addon.views.review import resolve

ODD_DETAIL = {"note": "é ✓ \"quoted\"", "elapsed_ms": 12.3, "big": 2**53 + 1, "nested": {"b": 1, "a": [1, 2.5, None, True]}}
KEY = Ed25519PrivateKey.generate()


def audited(store: ReceiptStore, public: bool = True) -> Report:
    audit = store.audit
    return verify(audit.checkpoints(), audit.chains(), audit.events, KEY.public_key() if public else None)


def named(report: Report) -> dict[str, str]:
    return {f.operation_id: f.how.value for f in report.findings}


def checkpoint(store: ReceiptStore) -> None:
    store.audit.add_checkpoint(lambda heads, previous, note: make_checkpoint(KEY, heads, utcnow(), previous, note))


def rows_of(store: ReceiptStore, op: str) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(transitions).where(transitions.c.operation_id == op).order_by(transitions.c.id))]


def test_every_write_path_chains_its_rows(store, migrated_url):
    """The writer's batch (pipelined on PostgreSQL, a head given as the proxy gives it, and one not), the
    general path, the reconcile claim, recovery and a person's resolve: every row has its hash, and each hash
    is what the chain computes from the row as read back (the same bytes from both databases)."""
    writer = JournalWriter(migrated_url, max_batch=64)
    try:
        a, b, c = intent(proxy_instance="dead"), intent(proxy_instance="me"), intent(proxy_instance="me")
        first = dict(writer.run([(1, Record(a, None, "dead")), (2, Record(b, None, "me")), (3, Record(c, None, "me"))]))
        assert all(isinstance(r, Done) and r.head for r in first.values())
        b_head = first[2].head  # type: ignore[union-attr]
        second = dict(writer.run([  # on PostgreSQL the first two pipelined, the last (no head given) after them
            (4, Advance(b.operation_id, "submitted", "outcome_unknown", ODD_DETAIL, {}, head=b_head)),
            (5, Record(intent(proxy_instance="me"), None, "me")),
            (6, Advance(c.operation_id, "submitted", "succeeded", {"who": "me"}, {"status_code": 201})),  # head read
        ]))
        assert all(isinstance(r, Done) and r.head for r in second.values())
    finally:
        writer.close()
    store.instances.register("dead", "elsewhere", 1)
    store.instances.recover("dead", by="test")  # a: submitted -> outcome_unknown
    assert len(store.queue.claim("w-1", 30, 10)) == 2  # a and b: outcome_unknown -> reconciling
    store.receipts.transition(a.operation_id, S.RECONCILING, S.MANUAL_REVIEW, {"who": "w-1"}, owned_by="w-1")
    resolve(store, a.operation_id, "succeeded", "checked by hand")
    general = recorded(store, intent())
    walk(store, general.operation_id, S.SUCCEEDED, status_code=201)

    report = audited(store)
    assert report.ok, report.findings
    assert (report.receipts, report.rows) == (5, 6 + 4 + 3 + 2 + 3)
    for op in (a.operation_id, b.operation_id, c.operation_id, general.operation_id):
        rows = rows_of(store, op)
        identity = Identity.of(store.receipts.get(op).__dict__)
        assert [r["hash"] for r in rows] == chained(genesis(identity), rows)
        assert all(r["hash"].startswith("sha256:") and len(r["hash"]) == 71 for r in rows)
    assert rows_of(store, b.operation_id)[2]["detail"] == ODD_DETAIL


def test_each_way_of_tampering_is_named(store):
    """Changed, removed, inserted and reordered rows, a receipt deleted and a history cut short after a
    checkpoint: each named, and only with the public key the last two; a pruned receipt is not tampering."""
    ops = {}
    for name in ("changed", "removed", "inserted", "reordered", "deleted", "cut", "pruned", "clean"):
        ops[name] = recorded(store, intent()).operation_id
        walk(store, ops[name], S.SUCCEEDED if name != "clean" else S.OUTCOME_UNKNOWN)  # planned, submitted, succeeded
    with store.engine.begin() as conn:
        conn.execute(update(receipts).where(receipts.c.operation_id == ops["pruned"]).values(completed_at=utcnow() - timedelta(days=9)))
    checkpoint(store)
    assert audited(store).ok
    assert store.retention.prune(timedelta(days=1)).receipts == 1
    tamper(store, ops)

    assert named(audited(store)) == {
        ops["changed"]: "changed", ops["removed"]: "removed", ops["inserted"]: "inserted",
        ops["reordered"]: "reordered", ops["deleted"]: "deleted", ops["cut"]: "cut short",
    }
    without_key = audited(store, public=False)
    assert named(without_key) == {ops[n]: n for n in ("changed", "removed", "inserted", "reordered")}
    assert any("not checked" in note for note in without_key.notes)


def tamper(store: ReceiptStore, ops: dict[str, str]) -> None:
    """One receipt each: what an intruder with the database could do, in plain SQL."""
    rows = {name: rows_of(store, op) for name, op in ops.items()}
    with store.engine.begin() as conn:
        conn.execute(update(transitions).where(transitions.c.id == rows["changed"][1]["id"]).values(detail={"who": "mallory"}))
        conn.execute(delete(transitions).where(transitions.c.id == rows["removed"][1]["id"]))
        forged = {k: v for k, v in rows["inserted"][2].items() if k != "id"} | {"detail": {"who": "mallory"}, "hash": None}
        conn.execute(insert(transitions).values(**forged))
        second, third = rows["reordered"][1]["id"], rows["reordered"][2]["id"]
        for old, new in ((second, -1), (third, second), (-1, third)):
            conn.execute(update(transitions).where(transitions.c.id == old).values(id=new))
        conn.execute(delete(receipts).where(receipts.c.operation_id == ops["deleted"]))
        conn.execute(delete(transitions).where(transitions.c.id == rows["cut"][2]["id"]))
        conn.execute(update(receipts).where(receipts.c.operation_id == ops["cut"]).values(history_head=rows["cut"][1]["hash"]))


def test_a_checkpoint_changed_or_removed_is_named(store):
    recorded(store, intent())
    checkpoint(store)
    recorded(store, intent())
    checkpoint(store)
    checkpoint(store)
    assert audited(store).ok and audited(store).checkpoints == 3
    with store.engine.begin() as conn:
        first, second, _third = conn.execute(select(checkpoints.c.id).order_by(checkpoints.c.id)).scalars()
        conn.execute(update(checkpoints).where(checkpoints.c.id == first).values(heads=[]))
        conn.execute(delete(checkpoints).where(checkpoints.c.id == second))
    report = audited(store)
    assert [(f.operation_id, f.how) for f in report.findings] == [
        (f"checkpoint {first}", Tampering.CHECKPOINT), (f"checkpoint {_third}", Tampering.CHECKPOINT)
    ]
    other = Ed25519PrivateKey.generate().public_key()
    assert {f.detail for f in verify(store.audit.checkpoints(), [], list, other).findings} == {
        "its signature does not verify with this public key"
    }


def test_the_oldest_checkpoint_removed_is_named(store):
    """Only the first checkpoint names none before it: once the oldest is deleted, the one after it names a
    checkpoint that is not there, and that is a finding, not a new first checkpoint."""
    recorded(store, intent())
    checkpoint(store)
    recorded(store, intent())
    checkpoint(store)
    assert audited(store).ok and audited(store).checkpoints == 2
    with store.engine.begin() as conn:
        oldest, second = conn.execute(select(checkpoints.c.id).order_by(checkpoints.c.id)).scalars()
        conn.execute(delete(checkpoints).where(checkpoints.c.id == oldest))
    found = [(f.operation_id, f.how, f.detail) for f in audited(store).findings]
    assert found == [(f"checkpoint {second}", Tampering.CHECKPOINT, "the checkpoint before it is missing or was changed")]


def test_scrub_chains_again_what_it_rewrote(store):
    """`receipts scrub` rewrites a detail that holds a secret: the chain is computed again and verify says so
    in a note, not as tampering, even against a checkpoint taken before."""
    op = recorded(store, intent()).operation_id
    store.receipts.transition(op, S.PLANNED, S.SUBMITTED, {"who": "old", "api_key": "sk-live-123"})
    checkpoint(store)
    counts = store.scrub.run(lambda host, port: (frozenset(), frozenset()))
    assert counts.transitions_changed == 1
    report = audited(store)
    assert report.ok, report.findings
    assert any(op in note and "scrub" in note for note in report.notes)
    assert rows_of(store, op)[1]["detail"]["api_key"] == "[REDACTED]"


@pytest.mark.parametrize("head_given", [True, False])
def test_a_step_whose_head_moved_on_in_the_same_state_reads_it_again(store, head_given):
    """A head that changed while the state stayed (scrub chained it again) is read again, not refused."""
    op = recorded(store, intent()).operation_id
    store.receipts.transition(op, S.PLANNED, S.SUBMITTED, {"who": "old", "api_key": "sk-live-123"})
    before = rows_of(store, op)[-1]["hash"]
    store.scrub.run(lambda host, port: (frozenset(), frozenset()))
    assert rows_of(store, op)[-1]["hash"] != before
    step = Step(op, S.SUBMITTED, S.SUCCEEDED, {"who": "me"}, head=before if head_given else None)
    store.db.write(lambda conn: store.receipts.writes(conn).advance(step))
    assert audited(store).ok


def test_the_migration_chains_the_history_already_there(db_url):
    """A journal from before the chain: migration 0005 chains its rows as they are, says so once, and the
    first checkpoint signs that note."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0004")
    engine = make_engine(db_url)
    old = raw_row(fp(), state="succeeded")
    at = utcnow()
    steps = [(None, "planned"), ("planned", "submitted"), ("submitted", "succeeded")]
    with engine.begin() as conn:
        conn.execute(insert(_OLD_RECEIPTS).values(**old))
        for frm, to in steps:
            values = {"operation_id": old["operation_id"], "from_state": frm, "to_state": to, "recorded_at": at, "detail": ODD_DETAIL}
            conn.execute(insert(_OLD_TRANSITIONS).values(**values))
    command.upgrade(cfg, "head")
    try:
        store = ReceiptStore(engine)
        report = audited(store)
        assert report.ok and (report.receipts, report.rows) == (1, 3)
        assert ["1 receipts with 3 history rows" in note for note in report.notes] == [True]
        checkpoint(store)
        assert "migration 0005" in (store.audit.checkpoints()[0].note or "")
    finally:
        engine.dispose()


_OLD_RECEIPTS = table(
    "receipts", *(column(c) for c in ("operation_id", "operation", "method", "scheme", "host", "port", "path",
                                      "intent_fingerprint", "account", "state")),
    column("created_at", UTCDateTime()), column("updated_at", UTCDateTime()),
)
_OLD_TRANSITIONS = table(
    "receipt_transitions", column("operation_id"), column("from_state"), column("to_state"),
    column("recorded_at", UTCDateTime()), column("detail", JSON()),
)


class _Counting:
    """The writes' Connection, noting each statement it runs."""

    def __init__(self, inner: OnDriver):
        self.inner, self.statements = inner, []

    def execute(self, statement: str, params: dict):
        self.statements.append(statement)
        return self.inner.execute(statement, params)

    def pipeline(self):
        return self.inner.pipeline()


def test_a_step_with_its_head_given_reads_nothing_first(migrated_url):
    """The proxy passes the head its record returned: the verdict is the compare-and-set and its history row
    alone (on PostgreSQL one statement), no read of the head."""
    connection = DriverConnection(migrated_url)
    try:
        with connection.transaction() as driver:
            counting = _Counting(OnDriver(driver))
            journal = JournalWrites.on(counting, connection.statements)
            it = intent(proxy_instance="me")
            head = journal.record(NewReceipt(it, None, "me"))
            assert isinstance(head, str)
            counting.statements.clear()
            journal.advance(Step(it.operation_id, S.SUBMITTED, S.SUCCEEDED, {"who": "me"}, head=head))
    finally:
        connection.close()
    assert not any(s.lstrip().upper().startswith("SELECT") for s in counting.statements), counting.statements
    assert len(counting.statements) == (1 if connection.dialect == "postgresql" else 2)


def test_a_step_committed_while_verify_reads_a_batch_is_not_tampering(store, monkeypatch):
    """A journal in use: a step commits between verify's read of the receipts and its read of their history
    (made to happen here, deterministically); the batch is one snapshot, so the chain still holds."""
    op = recorded(store, intent()).operation_id
    walk(store, op, S.OUTCOME_UNKNOWN)
    opened = store.audit._snapshot
    stepped: list[str] = []

    def snapshot():
        conn = opened()
        execute = conn.execute

        def execute_then_step(statement, *args, **kwargs):
            result = execute(statement, *args, **kwargs)
            if not stepped:
                stepped.append(op)
                store.receipts.transition(op, S.OUTCOME_UNKNOWN, S.RECONCILING, {"who": "w-1"})  # another connection
            return result

        monkeypatch.setattr(conn, "execute", execute_then_step)
        return conn

    monkeypatch.setattr(store.audit, "_snapshot", snapshot)
    report = audited(store)
    assert stepped == [op] and report.ok, report.findings
    monkeypatch.undo()
    assert audited(store).ok and store.receipts.get(op).state == "reconciling"


def test_scrub_does_not_hide_tampering(store):
    """A history changed by hand, then scrubbed: its chain is not computed again, so verify still names it."""
    op = recorded(store, intent()).operation_id
    store.receipts.transition(op, S.PLANNED, S.SUBMITTED, {"who": "old", "api_key": "sk-live-123"})
    first = rows_of(store, op)[0]
    with store.engine.begin() as conn:
        conn.execute(update(transitions).where(transitions.c.id == first["id"]).values(detail={"who": "mallory"}))
    store.scrub.run(lambda host, port: (frozenset(), frozenset()))
    assert rows_of(store, op)[1]["detail"]["api_key"] == "[REDACTED]"
    assert named(audited(store)) == {op: "changed"}
