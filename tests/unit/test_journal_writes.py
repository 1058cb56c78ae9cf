"""The journal's write primitives (journal/writes.py), each on SQLite and on PostgreSQL: `record` (the decision
in each of its cases, the rows and history it writes), `advance` (compare-and-set with its history row, the lease
holder's compare), `blocker` (the decision, read only), and a writer's batch (pipelined on PostgreSQL).

They run here on the journal writer's own driver connection; the store's general path runs the same code under
its SQLAlchemy transaction (tests/unit/test_store*.py). A receipt they read is the very record the store's
SQLAlchemy reads build."""

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.e2e import failing_receipt_writes
from support.store import S, fp, intent

from proxy_addon.db import make_engine
from proxy_addon.exceptions import (
    DuplicateIntentError,
    IllegalTransitionError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    StaleStateError,
)
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.driver import OnDriver
from proxy_addon.journal.messages import Advance, Blocked, Done, Failed, Record
from proxy_addon.journal.rows import NewReceipt, Step
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Blocker, Intent, ReceiptRecord
from proxy_addon.store import ReceiptStore

REPLAY = AfterSuccess(policy="replay", window=3600)
ALLOW = AfterSuccess(policy="allow")
ANSWER = {
    "status_code": 201,
    "external_id": "a-7",
    "response_headers": [["content-type", "application/json"], ["set-cookie", "[REDACTED]"]],
    "response_body": b'{"id": "a-7"}',
    "response_body_truncated": False,
    "response_body_redacted": True,
}
Outcome = tuple[str, ...]


class Journal:
    """The primitives on the writer's own connection, each call in a transaction of its own."""

    def __init__(self, url: str):
        self.connection = DriverConnection(url)
        self.blockers: list[Blocker] = []

    def _in_transaction[T](self, work: Callable[[JournalWrites], T]) -> T:
        with self.connection.transaction() as conn:
            return work(JournalWrites.on(OnDriver(conn), self.connection.statements))

    def record(self, it: Intent, after_success: AfterSuccess = REPLAY, submitted_by: str | None = "me") -> Outcome:
        new = NewReceipt(it, successes_block_for(after_success), submitted_by)
        blocker = self._in_transaction(lambda journal: journal.record(new))
        if isinstance(blocker, str):
            return ("recorded",)
        self.blockers.append(blocker)
        return ("blocked", blocker.kind.value, blocker.receipt.operation_id)

    def advance(self, op: str, to: S, updates: dict[str, Any], frm: S = S.SUBMITTED, owned_by: str | None = None) -> Outcome:
        step = Step(op, frm, to, {"who": "me"}, updates, owned_by)
        try:
            self._in_transaction(lambda journal: journal.advance(step))
        except StaleStateError as e:
            return ("stale", str(e.actual))
        except ReceiptNotFoundError:
            return ("not_found",)
        return ("advanced",)

    def blocker(self, it: Intent, after_success: AfterSuccess) -> Blocker | None:
        return self._in_transaction(lambda journal: journal.blocker(it, successes_block_for(after_success)))


@pytest.fixture
def both(migrated_url: str):
    engine = make_engine(migrated_url)
    journal = Journal(migrated_url)
    try:
        yield ReceiptStore(engine), journal
    finally:
        journal.connection.close()
        engine.dispose()


def history(store: ReceiptStore, op: str) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [(t.from_state, t.to_state, t.detail) for t in store.receipts.history(op)]


def test_record_decides_each_case(both):
    """Every decision `record` makes: new, open, key reused, success replayed, refused or allowed, a success's
    window ended by a later write to its target; a second account sending the same body, the same key and a write
    to the same target, kept apart from the first in each. Interleaved with the advances that make the cases."""
    store, journal = both
    ops: dict[str, str] = {}
    got: list[Outcome] = []
    same, target, second = fp(), fp(), {"account": "acct:second"}

    def new(label: str, fingerprint: str, **kw: Any) -> Intent:
        it = intent(fingerprint, **{"proxy_instance": "me", **kw})
        ops[label] = it.operation_id
        return it

    got.append(journal.record(new("a", same, idempotency_key="k-1")))
    got.append(journal.record(new("a-again", same)))
    got.append(journal.record(new("second-same", same, **second)))  # a's open receipt is not in its way
    got.append(journal.record(new("key-reused", fp(), idempotency_key="k-1")))
    got.append(journal.record(new("second-key", fp(), idempotency_key="k-1", **second)))  # its own key
    got.append(journal.advance(ops["second-same"], S.REJECTED, {"status_code": 422}))
    got.append(journal.advance(ops["a"], S.SUCCEEDED, ANSWER))
    got.append(journal.record(new("second-after-success", same, **second)))  # never a's answer
    got.append(journal.record(new("a-replayed", same)))
    got.append(journal.record(new("a-refused", same), AfterSuccess(policy="refuse", window=60)))
    got.append(journal.record(new("a2", same), ALLOW))
    got.append(journal.record(new("a2-again", same)))  # an open receipt wins over a success
    got.append(journal.advance(ops["a2"], S.OUTCOME_UNKNOWN, {"status_code": 503}))
    got.append(journal.record(new("post", target, path="/t")))
    got.append(journal.advance(ops["post"], S.SUCCEEDED, {"status_code": 201}))
    got.append(journal.record(new("second-put", fp(), method="PUT", path="/t", **second)))
    got.append(journal.advance(ops["second-put"], S.SUCCEEDED, {"status_code": 200}))
    got.append(journal.record(new("post-after-second", target, path="/t")))  # another account's PUT ends nothing
    got.append(journal.record(new("put", fp(), method="PUT", path="/t")))
    got.append(journal.advance(ops["put"], S.SUCCEEDED, {"status_code": 200}))
    got.append(journal.record(new("post-again", target, path="/t")))  # the PUT ended its replay window
    label = {op: name for name, op in ops.items()}
    assert [tuple(label.get(part, part) for part in o) for o in got] == [
        ("recorded",),
        ("blocked", "open", "a"),
        ("recorded",),
        ("blocked", "key_mismatch", "a"),
        ("recorded",),
        ("advanced",),
        ("advanced",),
        ("recorded",),
        ("blocked", "succeeded", "a"),
        ("blocked", "succeeded", "a"),
        ("recorded",),
        ("blocked", "open", "a2"),
        ("advanced",),
        ("recorded",),
        ("advanced",),
        ("recorded",),
        ("advanced",),
        ("blocked", "succeeded", "post"),
        ("recorded",),
        ("advanced",),
        ("recorded",),
    ]
    for name in ("a-again", "key-reused", "a-replayed", "a-refused", "a2-again", "post-after-second"):
        with pytest.raises(ReceiptNotFoundError):  # a refused intent writes nothing
            store.receipts.get(ops[name])


def test_record_writes_the_receipt_and_its_history(both):
    """As `submitted` (the proxy's: both history rows, one time) or `planned` (tools'), every kind of column
    read back through the store as it was given."""
    store, journal = both
    full = intent(
        proxy_instance="me", query="b=2&a=1", idempotency_key="k-full", request_body=b'{"t": "x"}', request_body_size=10,
        request_headers={"content-type": "application/json", "authorization": "[REDACTED]"},
        request_body_truncated=True, body_note="note",
    )
    planned = intent()
    assert journal.record(full) == journal.record(planned, submitted_by=None) == ("recorded",)
    rec = store.receipts.get(full.operation_id)
    assert {name: getattr(rec, name) for name in dataclasses.asdict(full)} == dataclasses.asdict(full)
    assert (rec.state, rec.authentication_recorded, rec.completed_at, rec.reconcile_attempts) == ("submitted", False, None, 0)
    assert rec.created_at == rec.updated_at == rec.submitted_at and rec.created_at.tzinfo is not None
    created = {"who": "me", "fingerprint": full.intent_fingerprint}
    assert history(store, full.operation_id) == [(None, "planned", created), ("planned", "submitted", {"who": "me"})]
    steps = store.receipts.history(full.operation_id)
    assert steps[0].recorded_at == steps[1].recorded_at == rec.created_at and steps[0].id < steps[1].id
    rec = store.receipts.get(planned.operation_id)
    assert (rec.state, rec.submitted_at, rec.proxy_instance) == ("planned", None, None)
    assert history(store, planned.operation_id) == [(None, "planned", {"who": "store", "fingerprint": planned.intent_fingerprint})]


def test_advance_compares_and_sets_with_its_history_row(both):
    store, journal = both
    it = intent(proxy_instance="me")
    journal.record(it)
    assert journal.advance(it.operation_id, S.SUCCEEDED, ANSWER) == ("advanced",)
    rec = store.receipts.get(it.operation_id)
    assert {name: getattr(rec, name) for name in ANSWER} == ANSWER
    assert rec.state == "succeeded" and rec.completed_at == rec.updated_at >= rec.submitted_at  # type: ignore[operator]
    assert history(store, it.operation_id)[-1] == ("submitted", "succeeded", {"who": "me"})
    assert store.receipts.history(it.operation_id)[-1].recorded_at == rec.updated_at
    assert journal.advance(it.operation_id, S.REJECTED, {"error_code": "x"}) == ("stale", "succeeded")
    assert journal.advance("op_missing", S.SUCCEEDED, {}) == ("not_found",)
    assert len(store.receipts.history(it.operation_id)) == 3 and store.receipts.get(it.operation_id) == rec  # nothing written
    with pytest.raises(IllegalTransitionError):
        Step(it.operation_id, S.SUCCEEDED, S.SUBMITTED)
    with pytest.raises(ValueError, match="cannot set intent_fingerprint"):
        Step(it.operation_id, S.SUBMITTED, S.SUCCEEDED, updates={"intent_fingerprint": "x"})


def test_advance_owned_by_compares_the_lease_holder_too(both):
    """A worker whose lease was taken over cannot write a verdict over its successor's."""
    store, journal = both
    it = intent(proxy_instance="me")
    journal.record(it)
    assert journal.advance(it.operation_id, S.OUTCOME_UNKNOWN, {}) == ("advanced",)
    lease = {"lease_owner": "w-2", "lease_expires_at": datetime(2031, 1, 1, tzinfo=UTC)}
    assert journal.advance(it.operation_id, S.RECONCILING, lease, frm=S.OUTCOME_UNKNOWN) == ("advanced",)
    assert journal.advance(it.operation_id, S.SUCCEEDED, {}, frm=S.RECONCILING, owned_by="w-1") == ("stale", "reconciling")
    assert store.receipts.get(it.operation_id).lease_expires_at == lease["lease_expires_at"]
    released = {"lease_owner": None, "lease_expires_at": None}
    assert journal.advance(it.operation_id, S.OUTCOME_UNKNOWN, released, frm=S.RECONCILING, owned_by="w-2") == ("advanced",)
    rec = store.receipts.get(it.operation_id)
    assert (rec.state, rec.lease_owner, rec.lease_expires_at) == ("outcome_unknown", None, None)


def test_blocker_is_the_decision_alone_and_its_record_is_the_one_the_store_reads(both):
    """`blocker` answers what `record` would refuse with, and writes nothing; the receipt it reads equals the
    store's SQLAlchemy read of it, stored answer and times included."""
    store, journal = both
    first = intent(proxy_instance="me")
    assert journal.blocker(first, REPLAY) is None
    journal.record(first)
    journal.advance(first.operation_id, S.SUCCEEDED, ANSWER)
    again = intent(first.intent_fingerprint, proxy_instance="me")
    found = journal.blocker(again, REPLAY)
    assert found is not None and (found.kind.value, found.receipt) == ("succeeded", store.receipts.get(first.operation_id))
    assert journal.blocker(again, ALLOW) is None
    assert found.receipt.response_header_pairs() == [("content-type", "application/json"), ("set-cookie", "[REDACTED]")]
    assert found.receipt.response_body == b'{"id": "a-7"}' and found.receipt.created_at.tzinfo is not None
    with pytest.raises(ReceiptNotFoundError):
        store.receipts.get(again.operation_id)
    assert journal.record(again) == ("blocked", "succeeded", first.operation_id)
    assert isinstance(journal.blockers[0].receipt, ReceiptRecord) and journal.blockers[0] == found
    assert store.receipts.blocker_of(store.receipts.get(first.operation_id), REPLAY) == found  # the general path's


@pytest.mark.parametrize("path", ["general", "writer"])
def test_submitted_is_one_commit_with_both_history_rows(both, migrated_url, path):
    """If the `planned -> submitted` row cannot be written, nothing of the receipt is: no `planned` left behind,
    in the store's transaction as in the writer's."""
    store, journal = both
    it = intent(proxy_instance="me")
    refused = failing_receipt_writes(migrated_url, "INSERT", "NEW.to_state = 'submitted'", table="receipt_transitions")
    with refused, pytest.raises(Exception) as e:
        store.receipts.record_and_submit(it, REPLAY, "me") if path == "general" else journal.record(it)
    assert path == "writer" or isinstance(e.value, JournalUnavailableError)
    with pytest.raises(ReceiptNotFoundError):
        store.receipts.get(it.operation_id)
    assert store.receipts.history(it.operation_id) == []


def test_a_batch_decides_as_its_requests_would_one_by_one(migrated_url):
    """One group commit (pipelined on PostgreSQL): each request sees the ones before it in its batch."""
    writer = JournalWriter(migrated_url, max_batch=64)
    replay, allow = successes_block_for(REPLAY), successes_block_for(ALLOW)
    try:
        same = fp()
        first, again, key_reused, other = intent(same, idempotency_key="k-9"), intent(same), intent(fp(), idempotency_key="k-9"), intent()
        opened = dict(writer.run([
            (1, Record(first, replay, "me")),
            (2, Record(again, replay, "me")),
            (3, Record(key_reused, replay, "me")),
            (4, Record(other, replay, "me")),
            (5, Advance("op_missing", "submitted", "succeeded", {"who": "me"}, {})),
        ]))
        head = opened[1].head  # type: ignore[union-attr]
        closed = dict(writer.run([
            (6, Advance(first.operation_id, "submitted", "succeeded", {"who": "me"}, {"status_code": 201}, head=head)),
            (7, Advance(first.operation_id, "submitted", "rejected", {"who": "me"}, {}, head=head)),
            (8, Record(intent(same), replay, "me")),
        ]))
        allowed = dict(writer.run([(9, Record(intent(same), allow, "me")), (10, Record(intent(same), allow, "me"))]))
    finally:
        writer.close()
    done = [opened[1], opened[4], closed[6], allowed[9]]
    assert all(isinstance(r, Done) and r.head is not None for r in done), done
    assert isinstance(allowed[10], Blocked) and allowed[10].blocker.receipt.operation_id != first.operation_id  # the one just allowed
    blocked = [opened[2], opened[3], closed[8]]
    assert [(r.blocker.kind.value, r.blocker.receipt.operation_id) for r in blocked] == [  # type: ignore[union-attr]
        ("open", first.operation_id), ("key_mismatch", first.operation_id), ("succeeded", first.operation_id)
    ]
    assert isinstance(closed[7], Failed) and (closed[7].reason, closed[7].actual) == ("stale", "succeeded")
    assert isinstance(opened[5], Failed) and opened[5].reason == "not_found"


COMPLETED = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)  # a success's completed_at, whole seconds on both databases
US = timedelta(microseconds=1)  # both databases keep microseconds
WINDOW = timedelta(seconds=REPLAY.window)
AROUND_THE_WINDOW = {  # the clock's time at the repeat -> whether the success still blocks it
    "end": (COMPLETED, True),  # completed this very microsecond
    "start-1us": (COMPLETED + WINDOW - US, True),
    "start": (COMPLETED + WINDOW, True),  # the window's start is in it: completed_at >= now - window
    "start+1us": (COMPLETED + WINDOW + US, False),
}


def test_a_success_blocks_from_the_windows_start_to_its_end(both, monkeypatch):
    """The same repeat at the instants around the window's bounds, with the clock frozen; each instant with a
    success of its own."""
    store, journal = both
    got, expected = {}, {}
    for name, (now, blocked) in AROUND_THE_WINDOW.items():
        monkeypatch.undo()
        first = intent(proxy_instance="me")
        assert journal.record(first) == ("recorded",)
        assert journal.advance(first.operation_id, S.SUCCEEDED, {"status_code": 201, "completed_at": COMPLETED}) == ("advanced",)
        assert store.receipts.get(first.operation_id).completed_at == COMPLETED
        monkeypatch.setattr("proxy_addon.journal.rows.utcnow", lambda now=now: now)
        got[name] = journal.record(intent(first.intent_fingerprint, proxy_instance="me"))
        expected[name] = ("blocked", "succeeded", first.operation_id) if blocked else ("recorded",)
    assert got == expected


LATER_WRITES = [  # a later write to the success's target: its method, the state it is in, whether it ends the window
    ("PUT", S.SUCCEEDED, True), ("PATCH", S.SUCCEEDED, True), ("DELETE", S.SUCCEEDED, True),
    ("POST", S.SUCCEEDED, False),  # a later create undoes nothing
    ("PUT", S.SUBMITTED, True), ("PUT", S.OUTCOME_UNKNOWN, True),  # it may have happened
    ("PUT", S.REJECTED, False), ("PUT", S.SAFE_TO_RETRY, False),  # known not to have happened
]


def test_which_later_writes_to_its_target_end_a_successs_window(both):
    """duplicates.py: a later PUT, PATCH or DELETE by the same account ends it, unless known not to have happened."""
    store, journal = both
    got, expected = [], []
    for i, (method, state, ends) in enumerate(LATER_WRITES):
        target = f"/t/{i}"
        first = intent(path=target, proxy_instance="me")
        assert journal.record(first) == ("recorded",)
        assert journal.advance(first.operation_id, S.SUCCEEDED, {"status_code": 201}) == ("advanced",)
        later = intent(method=method, path=target, proxy_instance="me")
        assert journal.record(later) == ("recorded",)
        steps = {S.SUBMITTED: [], S.SUCCEEDED: [S.SUCCEEDED], S.REJECTED: [S.REJECTED], S.OUTCOME_UNKNOWN: [S.OUTCOME_UNKNOWN],
                 S.SAFE_TO_RETRY: [S.OUTCOME_UNKNOWN, S.SAFE_TO_RETRY]}[state]
        for frm, to in zip([S.SUBMITTED, *steps], steps):
            store.receipts.transition(later.operation_id, frm, to)
        got.append((method, state.value, journal.record(intent(first.intent_fingerprint, path=target, proxy_instance="me"))))
        expected.append((method, state.value, ("recorded",) if ends else ("blocked", "succeeded", first.operation_id)))
    # a PUT's own success, after an earlier PUT to its target: neither it nor the earlier one ends its window
    earlier, put = intent(method="PUT", path="/t/put", proxy_instance="me"), intent(method="PUT", path="/t/put", proxy_instance="me")
    for it in (earlier, put):
        assert journal.record(it) == ("recorded",)
        assert journal.advance(it.operation_id, S.SUCCEEDED, {"status_code": 200}) == ("advanced",)
    got.append(journal.record(intent(put.intent_fingerprint, method="PUT", path="/t/put", proxy_instance="me")))
    expected.append(("blocked", "succeeded", put.operation_id))
    assert got == expected


def test_of_two_successes_the_latest_is_the_one_replayed(both, monkeypatch):
    """Two successes of one intent in the window (the second let through by `allow`): a repeat gets the latest,
    whichever was recorded first."""
    _store, journal = both
    same, ops = fp(), []
    for completed in (COMPLETED + timedelta(seconds=2), COMPLETED + timedelta(seconds=1)):  # the later one recorded first
        it = intent(same, proxy_instance="me")
        assert journal.record(it, ALLOW) == ("recorded",)
        assert journal.advance(it.operation_id, S.SUCCEEDED, {"status_code": 201, "completed_at": completed}) == ("advanced",)
        ops.append(it.operation_id)
    monkeypatch.setattr("proxy_addon.journal.rows.utcnow", lambda: COMPLETED + timedelta(seconds=3))  # both in the window
    assert journal.record(intent(same, proxy_instance="me")) == ("blocked", "succeeded", ops[0])


def test_the_general_path_refuses_as_the_primitive_decides(both):
    """The store raises the blocker `record` answers with (DuplicateIntentError), and writes nothing."""
    store, journal = both
    first = intent(proxy_instance="me")
    store.receipts.record_and_submit(first, REPLAY, "me")
    again = intent(first.intent_fingerprint, proxy_instance="me")
    with pytest.raises(DuplicateIntentError) as e:
        store.receipts.record_and_submit(again, REPLAY, "me")
    assert e.value.blocker == journal.blocker(again, REPLAY)
    with pytest.raises(ReceiptNotFoundError):
        store.receipts.get(again.operation_id)
