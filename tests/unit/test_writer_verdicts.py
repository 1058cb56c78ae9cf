"""The journal writer never drops a verdict (journal/writer.py): an orphaned writer commits the verdicts it holds
and drops only its records; a verdict whose receipt a recovery guessed `outcome_unknown` first replaces that guess
when its agent was told it. On SQLite and PostgreSQL, through the writer's own `run`."""

import time

import pytest
from support.store import intent

from proxy_addon.db import make_engine
from proxy_addon.exceptions import ReceiptNotFoundError
from proxy_addon.journal.messages import Advance, Done, Failed, Record
from proxy_addon.journal.writer import EXPIRED, JournalWriter
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.store import ReceiptStore

REPLAY = successes_block_for(AfterSuccess())


@pytest.fixture
def writer(migrated_url: str):
    w = JournalWriter(migrated_url, max_batch=64)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def store(migrated_url: str):
    engine = make_engine(migrated_url)
    try:
        yield ReceiptStore(engine)
    finally:
        engine.dispose()


def submitted(writer: JournalWriter) -> tuple[str, str]:
    it = intent(proxy_instance="me")
    [(_, done)] = writer.run([(1, Record(it, REPLAY, "me"))])
    assert isinstance(done, Done) and done.head is not None
    return it.operation_id, done.head


@pytest.mark.parametrize("dies", ["before its batch", "while its batch runs"])
def test_an_orphaned_writer_commits_the_verdicts_it_holds_and_drops_its_records(writer, store, monkeypatch, dies):
    """Its proxy died: nobody will send what a record records, so none is committed; a verdict is what the
    upstream answered (its agent may have been told it), so it is. Whether the proxy died before the batch was
    read, or after it began: then the batch is not committed as it is, and runs again without its records."""
    op, head = submitted(writer)
    new = intent(proxy_instance="me")
    if dies == "before its batch":
        writer.proxy_pid = -1  # as if the proxy that started it had died (its parent is someone else now)
    else:
        looks = iter([False])  # alive at the batch's start; dead from its first look inside the transaction on
        monkeypatch.setattr(writer, "_orphaned", lambda: next(looks, True))
    replies = writer.run([
        (2, Record(new, REPLAY, "me")),
        (3, Advance(op, "submitted", "succeeded", {"who": "me"}, {"status_code": 201}, head=head, answered=True)),
    ])
    assert [request_id for request_id, _ in replies] == [3] and isinstance(replies[0][1], Done)
    assert store.receipts.get(op).state == "succeeded"
    with pytest.raises(ReceiptNotFoundError):
        store.receipts.get(new.operation_id)


def test_a_verdict_is_never_expired_only_a_record_past_its_deadline_is(writer, store):
    op, head = submitted(writer)
    late = intent(proxy_instance="me")
    past = time.monotonic() - 1
    replies = dict(writer.run([
        (2, Record(late, REPLAY, "me", deadline=past)),
        (3, Advance(op, "submitted", "succeeded", {"who": "me"}, {"status_code": 201}, head=head)),
    ]))
    assert isinstance(replies[2], Failed) and replies[2].message == EXPIRED
    assert isinstance(replies[3], Done) and store.receipts.get(op).state == "succeeded"


@pytest.mark.parametrize(("answered", "state"), [(True, "succeeded"), (False, "outcome_unknown")])
def test_a_told_verdict_replaces_a_recoverys_guess_and_an_untold_one_does_not(writer, store, answered, state):
    """A recovery took the proxy for dead (its writer was stopped) and made the receipt `outcome_unknown`; then
    the verdict the agent was given (201) commits: the journal ends in what the agent was told, with the guess
    kept in the history. A verdict nobody was told leaves the guess to the reconciler."""
    op, head = submitted(writer)
    store.receipts.transition(op, "submitted", "outcome_unknown", {"who": "recovery", "error": "proxy_interrupted"},
                              error_code="proxy_interrupted")
    [(_, reply)] = writer.run([
        (2, Advance(op, "submitted", "succeeded", {"who": "me"}, {"status_code": 201, "external_id": "7"}, head=head, answered=answered)),
    ])
    receipt = store.receipts.get(op)
    assert receipt.state == state
    history = store.receipts.history(op)
    if answered:
        assert isinstance(reply, Done)
        assert [t.to_state for t in history] == ["planned", "submitted", "outcome_unknown", "succeeded"]
        assert (receipt.status_code, receipt.external_id, receipt.error_code) == (201, "7", None)
        assert "replaces" in history[-1].detail
    else:
        assert isinstance(reply, Failed) and reply.actual == "outcome_unknown"


def test_a_told_outcome_unknown_verdict_that_finds_a_recoverys_outcome_unknown_is_done_with_nothing_written(writer, store):
    """The agent was told outcome_unknown (a failure after the send) and a recovery guessed the same first: the
    journal already says what the agent was told, so the verdict is answered as written, and adds no row."""
    op, head = submitted(writer)
    store.receipts.transition(op, "submitted", "outcome_unknown", {"who": "recovery", "error": "proxy_interrupted"},
                              error_code="proxy_interrupted")  # fmt: skip
    [(_, reply)] = writer.run([
        (2, Advance(op, "submitted", "outcome_unknown", {"who": "me"}, {"error_code": "proxy_error"}, head=head, answered=True)),
    ])
    assert isinstance(reply, Done), reply
    assert [t.to_state for t in store.receipts.history(op)] == ["planned", "submitted", "outcome_unknown"]
    assert store.receipts.get(op).error_code == "proxy_interrupted"
