"""The writer's hot path (journal/statements.py, plain SQL over the driver) is equal in effect to the store's
general path (store/receipts.py, SQLAlchemy): the same scenario through each, on SQLite and PostgreSQL, gives
the same decisions, the same rows and the same history; and a receipt the hot path reads is the very record
the store reads."""

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.e2e import failing_receipt_writes
from support.store import S, fp, intent

from proxy_addon.config import AfterSuccess
from proxy_addon.db import make_engine
from proxy_addon.exceptions import DuplicateIntentError, JournalUnavailableError, ReceiptNotFoundError, StaleStateError
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.writes import JournalWrites, NewReceipt, OnDriver, Step
from proxy_addon.duplicates import successes_block_for
from proxy_addon.journal.messages import Advance, Record
from proxy_addon.records import Blocker, Intent, ReceiptRecord
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


class General:
    """The store's general path."""

    def __init__(self, store: ReceiptStore):
        self.store = store

    def record(self, it: Intent, after_success: AfterSuccess) -> Outcome:
        try:
            self.store.receipts.record_and_submit(it, after_success, "me")
        except DuplicateIntentError as e:
            return ("blocked", e.blocker.kind.value, e.blocker.receipt.operation_id)
        return ("recorded",)

    def advance(self, op: str, to: S, updates: dict[str, Any]) -> Outcome:
        try:
            self.store.receipts.transition(op, S.SUBMITTED, to, {"who": "me"}, **updates)
        except StaleStateError as e:
            return ("stale", str(e.actual))
        except ReceiptNotFoundError:
            return ("not_found",)
        return ("advanced",)


class Hot:
    """The writer's hot path, each call in a transaction of its own."""

    def __init__(self, url: str):
        self.connection = DriverConnection(url)
        self.blockers: list[Blocker] = []

    def _in_transaction[T](self, work: Callable[[JournalWrites], T]) -> T:
        with self.connection.transaction() as conn:
            return work(JournalWrites.on(OnDriver(conn), self.connection.statements))

    def record(self, it: Intent, after_success: AfterSuccess) -> Outcome:
        blocker = self._in_transaction(lambda hot: hot.record(NewReceipt(it, successes_block_for(after_success), "me")))
        if blocker is None:
            return ("recorded",)
        self.blockers.append(blocker)
        return ("blocked", blocker.kind.value, blocker.receipt.operation_id)

    def advance(self, op: str, to: S, updates: dict[str, Any]) -> Outcome:
        try:
            self._in_transaction(lambda hot: hot.advance(Step(op, S.SUBMITTED.value, to.value, {"who": "me"}, updates)))
        except StaleStateError as e:
            return ("stale", str(e.actual))
        except ReceiptNotFoundError:
            return ("not_found",)
        return ("advanced",)


def scenario(path: General | Hot, account: str) -> tuple[list[Outcome], dict[str, str]]:
    """Every decision the hot path makes: new, open, key reused, success replayed or allowed, invalidated by a
    later write to the target; a second account sending the same body, the same key and a write to the same
    target, kept apart from the first in each; every kind of column a receipt holds. Returns the outcomes, op ids
    by label."""
    ops: dict[str, str] = {}
    out: list[Outcome] = []
    same, other = fp(), fp()

    def new(label: str, fingerprint: str, **kw: Any) -> Intent:
        it = intent(fingerprint, **{"account": account, "proxy_instance": "me", **kw})
        ops[label] = it.operation_id
        return it

    second = {"account": account + ":second"}  # another agent's credentials
    full = {"query": "b=2&a=1", "request_headers": {"content-type": "application/json", "authorization": "[REDACTED]"},
            "request_body": b'{"t": "x"}', "request_body_size": 10, "request_body_truncated": True, "body_note": "note"}
    out.append(path.record(new("a", same, idempotency_key="k-1", **full), REPLAY))
    out.append(path.record(new("a-again", same), REPLAY))
    out.append(path.record(new("second-same", same, **second), REPLAY))  # a's open receipt is not in its way
    out.append(path.record(new("key-reused", other, idempotency_key="k-1"), REPLAY))
    out.append(path.record(new("second-key", fp(), idempotency_key="k-1", **second), REPLAY))  # its own key
    out.append(path.advance(ops["second-same"], S.REJECTED, {"status_code": 422, "error_code": "upstream_status"}))
    out.append(path.advance(ops["a"], S.SUCCEEDED, ANSWER))
    out.append(path.advance(ops["a"], S.REJECTED, {"error_code": "x"}))
    out.append(path.advance("op_missing", S.SUCCEEDED, {}))
    out.append(path.record(new("second-after-success", same, **second), REPLAY))  # never a's answer
    out.append(path.record(new("a-replayed", same), REPLAY))
    out.append(path.record(new("a-refused", same), AfterSuccess(policy="refuse", window=60)))
    out.append(path.record(new("a2", same), ALLOW))
    out.append(path.record(new("a2-again", same), REPLAY))
    out.append(path.advance(ops["a2"], S.OUTCOME_UNKNOWN, {"status_code": 503, "error_code": "upstream_5xx", "error_message": "m"}))
    target = fp()
    out.append(path.record(new("post", target, path="/t"), REPLAY))
    out.append(path.advance(ops["post"], S.SUCCEEDED, {"status_code": 201}))
    out.append(path.record(new("second-put", fp(), method="PUT", path="/t", **second), REPLAY))
    out.append(path.advance(ops["second-put"], S.SUCCEEDED, {"status_code": 200}))
    out.append(path.record(new("post-after-second", target, path="/t"), REPLAY))  # another account's PUT ends nothing
    out.append(path.record(new("put", fp(), method="PUT", path="/t"), REPLAY))
    out.append(path.advance(ops["put"], S.SUCCEEDED, {"status_code": 200}))
    out.append(path.record(new("post-again", target, path="/t"), REPLAY))  # the PUT ended its replay window
    return out, ops


def labelled(outcomes: list[Outcome], ops: dict[str, str]) -> list[Outcome]:
    label = {op: name for name, op in ops.items()}
    return [tuple(label.get(part, part) for part in o) for o in outcomes]


def decisions(outcomes: list[Outcome], ops: dict[str, str]) -> dict[str, Outcome]:
    """Each record's outcome by its label (the scenario labels each intent it records, in order)."""
    records = [o for o in labelled(outcomes, ops) if o[0] in ("recorded", "blocked")]
    return dict(zip(ops, records, strict=True))


def stored(store: ReceiptStore, ops: dict[str, str]) -> dict[str, Any]:
    """What the journal holds for these receipts, with what differs by nature (ids, times, account) normalised."""
    label = {op: name for name, op in ops.items()}
    out: dict[str, Any] = {}
    for name, op in ops.items():
        try:
            receipt = store.receipts.get(op)
        except ReceiptNotFoundError:
            out[name] = None
            continue
        row = dataclasses.asdict(receipt)
        for key, value in row.items():
            if key.endswith("_at") and key != "lease_expires_at":
                row[key] = value is not None
        row.update(operation_id=name, account=None, intent_fingerprint=None,
                   idempotency_key=label.get(row["idempotency_key"], row["idempotency_key"]))
        history = [(t.from_state, t.to_state, {k: v for k, v in t.detail.items() if k != "fingerprint"})
                   for t in store.receipts.history(op)]
        ordered = [t.id for t in store.receipts.history(op)] == sorted(t.id for t in store.receipts.history(op))
        out[name] = (row, history, ordered)
    return out


@pytest.fixture
def both(migrated_url: str):
    engine = make_engine(migrated_url)
    hot = Hot(migrated_url)
    try:
        yield ReceiptStore(engine), hot
    finally:
        hot.connection.close()
        engine.dispose()


def test_the_hot_path_decides_and_writes_as_the_general_path(both):
    store, hot = both
    general_outcomes, general_ops = scenario(General(store), "acct:general")
    hot_outcomes, hot_ops = scenario(hot, "acct:hot")
    assert labelled(hot_outcomes, hot_ops) == labelled(general_outcomes, general_ops)
    assert ("blocked", "key_mismatch", "a") in labelled(hot_outcomes, hot_ops)  # the scenario covers each decision
    assert {o[1] for o in hot_outcomes if o[0] == "blocked"} == {"open", "succeeded", "key_mismatch"}
    assert labelled(general_outcomes, general_ops)[-1] == ("recorded",)
    # each path on its own, not only equal to the other: a decision that ignored the account would be the same on both
    for outcomes, ops in ((hot_outcomes, hot_ops), (general_outcomes, general_ops)):
        decided = decisions(outcomes, ops)
        assert decided["second-same"] == decided["second-key"] == decided["second-after-success"] == ("recorded",)
        assert decided["post-after-second"] == ("blocked", "succeeded", "post")
    assert stored(store, hot_ops) == stored(store, general_ops)


def test_a_blocker_read_by_the_hot_path_is_the_record_the_store_reads(both):
    store, hot = both
    scenario(hot, "acct:hot")
    assert len(hot.blockers) >= 5
    for blocker in hot.blockers:
        assert isinstance(blocker.receipt, ReceiptRecord)
        assert blocker.receipt == store.receipts.get(blocker.receipt.operation_id) or blocker.receipt.state != "succeeded"
    replayed = [b.receipt for b in hot.blockers if b.receipt.state == "succeeded"]
    assert replayed and replayed[0] == store.receipts.get(replayed[0].operation_id)
    assert replayed[0].response_header_pairs() == [("content-type", "application/json"), ("set-cookie", "[REDACTED]")]
    assert replayed[0].response_body == b'{"id": "a-7"}' and replayed[0].created_at.tzinfo is not None


@pytest.mark.parametrize("path", ["general", "hot"])
def test_submitted_is_one_commit_with_both_history_rows(both, migrated_url, path):
    """If the `planned -> submitted` row cannot be written, nothing of the receipt is: no `planned` left behind."""
    store, hot = both
    it = intent(proxy_instance="me")
    refused = failing_receipt_writes(migrated_url, "INSERT", "NEW.to_state = 'submitted'", table="receipt_transitions")
    with refused, pytest.raises(Exception) as e:
        General(store).record(it, REPLAY) if path == "general" else hot.record(it, REPLAY)
    assert path == "hot" or isinstance(e.value, JournalUnavailableError)
    with pytest.raises(ReceiptNotFoundError):
        store.receipts.get(it.operation_id)
    assert store.receipts.history(it.operation_id) == []


def test_a_batch_decides_as_its_requests_would_one_by_one(migrated_url):
    """One group commit (pipelined on PostgreSQL): each request sees the ones before it in its batch."""
    from proxy_addon.journal.messages import Done, Failed
    from proxy_addon.journal.writer import JournalWriter

    writer = JournalWriter(migrated_url, max_batch=64)
    try:
        same = fp()
        first, again, key_reused, other = intent(same, idempotency_key="k-9"), intent(same), intent(fp(), idempotency_key="k-9"), intent()
        opened = dict(writer.run([
            (1, Record(first, 3600, "me")),
            (2, Record(again, 3600, "me")),
            (3, Record(key_reused, 3600, "me")),
            (4, Record(other, 3600, "me")),
            (5, Advance("op_missing", "submitted", "succeeded", {"who": "me"}, {})),
        ]))
        closed = dict(writer.run([
            (6, Advance(first.operation_id, "submitted", "succeeded", {"who": "me"}, {"status_code": 201})),
            (7, Advance(first.operation_id, "submitted", "rejected", {"who": "me"}, {})),
            (8, Record(intent(same), 3600, "me")),
        ]))
        allowed = dict(writer.run([(9, Record(intent(same), None, "me")), (10, Record(intent(same), None, "me"))]))
    finally:
        writer.close()
    assert opened[1] == opened[4] == closed[6] == allowed[9] == Done()
    assert allowed[10].blocker.receipt.operation_id != first.operation_id  # type: ignore[union-attr] # the one just allowed
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


@pytest.mark.parametrize("path", ["general", "hot"])
def test_a_success_blocks_from_the_windows_start_to_its_end(both, monkeypatch, path):
    """The same repeat at the instants around the window's bounds, with the clock frozen (both paths read it
    through records.utcnow); each instant with a success of its own."""
    store, hot = both
    run = General(store) if path == "general" else hot
    got, expected = {}, {}
    for name, (now, blocked) in AROUND_THE_WINDOW.items():
        monkeypatch.undo()
        first = intent(proxy_instance="me")
        assert run.record(first, REPLAY) == ("recorded",)
        assert run.advance(first.operation_id, S.SUCCEEDED, {"status_code": 201, "completed_at": COMPLETED}) == ("advanced",)
        assert store.receipts.get(first.operation_id).completed_at == COMPLETED
        for module in ("proxy_addon.journal.writes",):
            monkeypatch.setattr(f"{module}.utcnow", lambda now=now: now)
        got[name] = run.record(intent(first.intent_fingerprint, proxy_instance="me"), REPLAY)
        expected[name] = ("blocked", "succeeded", first.operation_id) if blocked else ("recorded",)
    assert got == expected


LATER_WRITES = [  # a later write to the success's target: its method, the state it is in, whether it ends the window
    ("PUT", S.SUCCEEDED, True), ("PATCH", S.SUCCEEDED, True), ("DELETE", S.SUCCEEDED, True),
    ("POST", S.SUCCEEDED, False),  # a later create undoes nothing
    ("PUT", S.SUBMITTED, True), ("PUT", S.OUTCOME_UNKNOWN, True),  # it may have happened
    ("PUT", S.REJECTED, False), ("PUT", S.SAFE_TO_RETRY, False),  # known not to have happened
]


@pytest.mark.parametrize("path", ["general", "hot"])
def test_which_later_writes_to_its_target_end_a_successs_window(both, path):
    """duplicates.py: a later PUT, PATCH or DELETE by the same account ends it, unless known not to have happened."""
    store, hot = both
    run = General(store) if path == "general" else hot
    got, expected = [], []
    for i, (method, state, ends) in enumerate(LATER_WRITES):
        target = f"/t/{i}"
        first = intent(path=target, proxy_instance="me")
        assert run.record(first, REPLAY) == ("recorded",)
        assert run.advance(first.operation_id, S.SUCCEEDED, {"status_code": 201}) == ("advanced",)
        later = intent(method=method, path=target, proxy_instance="me")
        assert run.record(later, REPLAY) == ("recorded",)
        steps = {S.SUBMITTED: [], S.SUCCEEDED: [S.SUCCEEDED], S.REJECTED: [S.REJECTED], S.OUTCOME_UNKNOWN: [S.OUTCOME_UNKNOWN],
                 S.SAFE_TO_RETRY: [S.OUTCOME_UNKNOWN, S.SAFE_TO_RETRY]}[state]
        for frm, to in zip([S.SUBMITTED, *steps], steps):
            store.receipts.transition(later.operation_id, frm, to)
        got.append((method, state.value, run.record(intent(first.intent_fingerprint, path=target, proxy_instance="me"), REPLAY)))
        expected.append((method, state.value, ("recorded",) if ends else ("blocked", "succeeded", first.operation_id)))
    # a PUT's own success, after an earlier PUT to its target: neither it nor the earlier one ends its window
    earlier, put = intent(method="PUT", path="/t/put", proxy_instance="me"), intent(method="PUT", path="/t/put", proxy_instance="me")
    for it in (earlier, put):
        assert run.record(it, REPLAY) == ("recorded",)
        assert run.advance(it.operation_id, S.SUCCEEDED, {"status_code": 200}) == ("advanced",)
    got.append(run.record(intent(put.intent_fingerprint, method="PUT", path="/t/put", proxy_instance="me"), REPLAY))
    expected.append(("blocked", "succeeded", put.operation_id))
    assert got == expected


@pytest.mark.parametrize("path", ["general", "hot"])
def test_of_two_successes_the_latest_is_the_one_replayed(both, monkeypatch, path):
    """Two successes of one intent in the window (the second let through by `allow`): a repeat gets the latest,
    whichever was recorded first."""
    store, hot = both
    run = General(store) if path == "general" else hot
    same, ops = fp(), []
    for completed in (COMPLETED + timedelta(seconds=2), COMPLETED + timedelta(seconds=1)):  # the later one recorded first
        it = intent(same, proxy_instance="me")
        assert run.record(it, ALLOW) == ("recorded",)
        assert run.advance(it.operation_id, S.SUCCEEDED, {"status_code": 201, "completed_at": completed}) == ("advanced",)
        ops.append(it.operation_id)
    for module in ("proxy_addon.journal.writes",):  # both in the window
        monkeypatch.setattr(f"{module}.utcnow", lambda: COMPLETED + timedelta(seconds=3))
    assert run.record(intent(same, proxy_instance="me"), REPLAY) == ("blocked", "succeeded", ops[0])
