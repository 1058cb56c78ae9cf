"""Approvals on the one write path (journal/writes.py, through the store's general path) and a person's decision
(store/approvals.py), on SQLite and on PostgreSQL: a write that needs approval records no receipt until its
intent is approved, then exactly one, linked to the approval, which is used up with it."""

import dataclasses
import queue
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import func, select
from support.e2e import failing_receipt_writes, migrate
from support.pg import libpq_url
from support.store import S, intent

from proxy_addon.db import make_engine
from proxy_addon.exceptions import ApprovalNeededError, ApprovalNotFoundError, DuplicateIntentError, NotDecidableError
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.driver import OnDriver
from proxy_addon.journal.messages import AwaitingApproval, Done, Failed, Record
from proxy_addon.journal.rows import NewReceipt
from proxy_addon.journal.tables import Receipt
from proxy_addon.journal.writer import JournalWriter, _one_statement
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import ApprovalRecord, Blocker, BlockKind, new_operation_id
from proxy_addon.store import ReceiptStore

ASK = ApprovalAsk(expires=3600)
ALLOW = AfterSuccess(policy="allow")


def again(it):
    """The same request sent again: the same intent, a new operation id."""
    return dataclasses.replace(it, operation_id=new_operation_id())


def ask(store, it, approval=ASK, after_success=ALLOW):
    """Record as the proxy does; the approval it waits for, or None once recorded as submitted."""
    try:
        store.receipts.record_and_submit(it, after_success, "proxy-1", approval)
    except ApprovalNeededError as e:
        assert e.approval.intent_fingerprint == it.intent_fingerprint
        return e.approval
    return None


def receipts_of(store, fingerprint):
    with store.db.reading() as conn:
        return conn.execute(select(func.count()).where(Receipt.intent_fingerprint == fingerprint)).scalar_one()


def test_pending_until_approved_then_one_receipt_that_uses_it(store):
    it = intent(request_headers={"authorization": "[REDACTED]"}, request_body=b'{"title": "t"}')
    first = ask(store, it)
    assert first is not None and first.state == "pending" and first.asked == 1
    assert first.request_headers == {"authorization": "[REDACTED]"} and first.request_body == b'{"title": "t"}'
    second = ask(store, again(it))
    assert second.approval_id == first.approval_id and second.asked == 2  # one pending approval per intent
    assert receipts_of(store, it.intent_fingerprint) == 0  # nothing journaled, nothing forwarded

    decided = store.approvals.decide(first.approval_id, "approve", "looks right", "alice")
    assert (decided.state, decided.decided_by, decided.note) == ("approved", "alice", "looks right")

    used_by = again(it)
    assert ask(store, used_by) is None
    assert store.receipts.get(used_by.operation_id).state == S.SUBMITTED.value
    created = store.receipts.history(used_by.operation_id)[0]
    assert created.detail["approval_id"] == first.approval_id  # the receipt records the approval it used
    used = store.approvals.get(first.approval_id)
    assert (used.state, used.operation_id) == ("used", used_by.operation_id)

    # the receipt is open: a repeat is a duplicate, not a second use; once it ended, a new approval is needed
    with pytest.raises(DuplicateIntentError):
        ask(store, again(it))
    store.receipts.transition(used_by.operation_id, S.SUBMITTED, S.SUCCEEDED, {"who": "test"}, status_code=201)
    later = ask(store, again(it))
    assert later.state == "pending" and later.approval_id != first.approval_id


def test_other_arguments_are_another_intent_and_another_approval(store):
    one, other = intent(), intent()
    a = ask(store, one)
    store.approvals.decide(a.approval_id, "approve", "ok", "alice")
    b = ask(store, other)
    assert b.state == "pending" and b.approval_id != a.approval_id
    assert receipts_of(store, other.intent_fingerprint) == 0


def test_denied_answers_the_note_and_is_never_used(store):
    it = intent()
    a = ask(store, it)
    store.approvals.decide(a.approval_id, "deny", "not this customer", "bob")
    denied = ask(store, again(it))
    assert (denied.state, denied.note, denied.decided_by) == ("denied", "not this customer", "bob")
    assert receipts_of(store, it.intent_fingerprint) == 0
    with pytest.raises(NotDecidableError):
        store.approvals.decide(a.approval_id, "approve", "changed my mind", "bob")


def test_a_denial_lapses_at_its_expiry_and_the_next_request_asks_again(store):
    """A denial stands for its `expires` from the decision, not for ever: at its expiry (the clock is given to
    the write, not waited for) the same request asks a person again."""
    it, short = intent(), ApprovalAsk(expires=60)
    a = ask(store, it, short)
    denied = store.approvals.decide(a.approval_id, "deny", "not this customer", "bob")
    assert ask(store, again(it), short).state == "denied"  # while it stands
    at_expiry = NewReceipt(again(it), None, "proxy-1", at=denied.expires_at, approval=short)
    later = store.db.write(lambda conn: store.receipts.writes(conn).record(at_expiry))
    assert isinstance(later, ApprovalRecord), later
    assert later.state == "pending" and later.approval_id != a.approval_id
    assert receipts_of(store, it.intent_fingerprint) == 0


def test_an_approval_lets_through_its_own_account_alone(store):
    """The same request (one fingerprint) from another account is another intent: the approval one account got
    is not used by the other, which asks for its own."""
    alices = intent(account="acct:alice")
    bobs = intent(alices.intent_fingerprint, account="acct:bob")
    a = ask(store, alices)
    store.approvals.decide(a.approval_id, "approve", "alice may", "carol")
    b = ask(store, bobs)
    assert b is not None, "bob's request was recorded with alice's approval"
    assert (b.state, b.account) == ("pending", "acct:bob") and b.approval_id != a.approval_id
    assert store.approvals.get(a.approval_id).state == "approved"  # still alice's to use
    assert ask(store, again(alices)) is None


def test_expired_pending_asks_anew_and_cannot_be_approved(store):
    it = intent()
    a = ask(store, it, ApprovalAsk(expires=60))
    store.approvals.expire_due(a.expires_at)  # at its expiry: the clock is given, not waited for
    assert store.approvals.get(a.approval_id).state == "expired"
    with pytest.raises(NotDecidableError):
        store.approvals.decide(a.approval_id, "approve", "late", "alice")
    b = ask(store, again(it))
    assert b.state == "pending" and b.approval_id != a.approval_id


def test_an_approval_not_used_in_time_expires(store):
    it = intent()
    a = ask(store, it, ApprovalAsk(expires=60))
    decided = store.approvals.decide(a.approval_id, "approve", "ok", "alice")
    assert decided.expires_at > a.expires_at  # counted from the decision
    store.approvals.expire_due(decided.expires_at)  # at its expiry, unused
    assert store.approvals.get(a.approval_id).state == "expired"
    b = ask(store, again(it))
    assert b.state == "pending" and receipts_of(store, it.intent_fingerprint) == 0


def test_decisions_need_a_note_and_a_known_id(store):
    a = ask(store, intent())
    with pytest.raises(NotDecidableError):
        store.approvals.decide(a.approval_id, "approve", "  ", "alice")
    with pytest.raises(ApprovalNotFoundError):
        store.approvals.get("ap_nope")
    assert store.approvals.pending_count() == 1
    assert [x.approval_id for x in store.approvals.list(state="pending")] == [a.approval_id]


def test_the_writer_uses_an_approval_only_together_with_its_receipt(store, migrated_url):
    """Alone in its batch (where PostgreSQL runs a one-statement write in autocommit), a write that uses an
    approval still commits the use and the receipt together: when the receipt cannot be written, the approval
    stays approved for the next request."""
    it = intent()
    a = ask(store, it)
    store.approvals.decide(a.approval_id, "approve", "ok", "alice")
    writer = JournalWriter(migrated_url, max_batch=8)
    try:
        with failing_receipt_writes(migrated_url, "INSERT"):
            [(_, failed)] = writer.run([(1, Record(again(it), None, "proxy-1", approval=ASK))])
        assert isinstance(failed, Failed)
        assert store.approvals.get(a.approval_id).state == "approved"
        [(_, done)] = writer.run([(2, Record(again(it), None, "proxy-1", approval=ASK))])
        assert isinstance(done, Done) and store.approvals.get(a.approval_id).state == "used"
        [(_, waiting)] = writer.run([(3, Record(intent(), None, "proxy-1", approval=ASK))])
        assert isinstance(waiting, AwaitingApproval) and waiting.approval.state == "pending"
    finally:
        writer.close()


class Recording:
    """A writes Connection that keeps the text of every statement it runs."""

    def __init__(self, inner):
        self.inner, self.statements = inner, []

    def execute(self, statement, params):
        self.statements.append(statement)
        return self.inner.execute(statement, params)

    def pipeline(self):
        return self.inner.pipeline()


def test_a_write_without_an_approval_rule_runs_the_statements_it_always_ran(migrated_url):
    """The hot path's cost: no statement on approvals, as many statements as before approvals existed (SQLite:
    the decision, the insert and the two history rows; PostgreSQL: one), and autocommit alone on PostgreSQL."""
    connection = DriverConnection(migrated_url)
    try:
        with connection.transaction() as conn:
            recording = Recording(OnDriver(conn))
            journal = JournalWrites.on(recording, connection.statements)
            assert isinstance(journal.record(NewReceipt(intent(), 900.0, "proxy-1")), str)  # recorded: its history head
    finally:
        connection.close()
    assert not any("approvals" in s for s in recording.statements)
    assert len(recording.statements) == (1 if migrated_url.startswith("postgresql") else 4)
    assert _one_statement(Record(intent(), 900.0, "proxy-1")) and not _one_statement(Record(intent(), 900.0, "p", approval=ASK))


# -- two writers (two replicas) on one PostgreSQL, in an order the test sets --------------------------------------


@pytest.fixture
def pg_store(pg_url: str):
    migrate(pg_url)
    engine = make_engine(pg_url)
    try:
        yield pg_url, ReceiptStore(engine)
    finally:
        engine.dispose()


def _until(condition: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Wait for a state the other connection reaches, looking again until it does (bounded: a hang fails)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.01)


def _used_by_two_writers(url: str, store: ReceiptStore, it) -> tuple[str, str, object]:
    """The intent approved; writer 1 uses the approval (its receipt inserted, not committed); writer 2, the same
    request on another connection, blocks on the approval's row (seen in pg_blocking_pids); then writer 1
    commits. The approval's id, writer 1's operation id, and what writer 2's `record` returned."""
    a = ask(store, it)
    store.approvals.decide(a.approval_id, "approve", "ok", "alice")
    first, second = again(it), again(it)
    one, two = DriverConnection(url), DriverConnection(url)
    pids: queue.Queue[int] = queue.Queue()
    outcome: list[object] = []

    def writer_two() -> None:
        try:
            with two.transaction() as driver:
                pids.put(driver.info.backend_pid)
                outcome.append(
                    JournalWrites.on(OnDriver(driver), two.statements).record(NewReceipt(second, None, "proxy-2", approval=ASK))
                )
        except BaseException as e:  # reported by the test, not lost in the thread
            outcome.append(e)

    thread = threading.Thread(target=writer_two, daemon=True)
    admin = psycopg.connect(libpq_url(url), autocommit=True)
    try:
        with one.transaction() as driver:
            head = JournalWrites.on(OnDriver(driver), one.statements).record(NewReceipt(first, None, "proxy-1", approval=ASK))
            assert isinstance(head, str)  # used, and its receipt inserted: not committed yet
            holder = driver.info.backend_pid
            thread.start()
            waiter = pids.get(timeout=30)

            def blocked() -> bool:
                assert thread.is_alive(), f"writer 2 did not wait for writer 1: {outcome}"
                row = admin.execute("SELECT %s = ANY(pg_blocking_pids(%s))", (holder, waiter)).fetchone()
                return bool(row and row[0])

            _until(blocked, "blocked on writer 1's row")
        thread.join(30)  # writer 1 committed on leaving the block
        assert not thread.is_alive(), "writer 2 never finished"
    finally:
        admin.close()
        one.close()
        two.close()
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return a.approval_id, first.operation_id, result


def test_an_approval_used_by_a_writer_that_commits_while_another_waits_on_it_stays_used(pg_store):
    """The compare-and-set that uses an approval re-checks its state on the row the first writer changed: the
    second writer, blocked on that row until the first commits, must not take it too (it would find the first's
    receipt in its way, give the approval back, and leave it `approved` for a second use)."""
    url, store = pg_store
    it = intent()
    approval_id, first, _ = _used_by_two_writers(url, store, it)
    used = store.approvals.get(approval_id)
    assert (used.state, used.operation_id) == ("used", first)
    store.receipts.transition(first, S.SUBMITTED, S.SUCCEEDED, {"who": "test"}, status_code=201)
    later = ask(store, again(it))  # once the receipt ended, the next request needs a new approval
    assert later is not None and later.state == "pending" and later.approval_id != approval_id
    assert receipts_of(store, it.intent_fingerprint) == 1


def test_a_writer_that_lost_the_approval_to_a_concurrent_one_gets_its_receipt_as_a_duplicate(pg_store):
    """When the approval was used meanwhile (by the writer whose commit it waited for), what stands in the way is
    that writer's open receipt: the request is its duplicate, not a new request for a person's approval."""
    url, store = pg_store
    it = intent()
    _, first, outcome = _used_by_two_writers(url, store, it)
    assert isinstance(outcome, Blocker), outcome
    assert (outcome.kind, outcome.receipt.operation_id) == (BlockKind.OPEN, first)
    assert store.approvals.pending_count() == 0
    assert store.receipts.get(first).state == S.SUBMITTED.value
    assert receipts_of(store, it.intent_fingerprint) == 1
