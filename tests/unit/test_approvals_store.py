"""Approvals on the one write path (journal/writes.py, through the store's general path) and a person's decision
(store/approvals.py), on SQLite and on PostgreSQL: a write that needs approval records no receipt until its
intent is approved, then exactly one, linked to the approval, which is used up with it."""

import dataclasses

import pytest
from sqlalchemy import func, select
from support.e2e import failing_receipt_writes
from support.store import S, intent

from proxy_addon.config import AfterSuccess
from proxy_addon.exceptions import ApprovalNeededError, ApprovalNotFoundError, DuplicateIntentError, NotDecidableError
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.messages import AwaitingApproval, Done, Failed, Record
from proxy_addon.journal.writer import JournalWriter, _one_statement
from proxy_addon.journal.writes import JournalWrites, NewReceipt, OnDriver
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.records import new_operation_id
from proxy_addon.store.tables import Receipt

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
