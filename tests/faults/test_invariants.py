"""The invariant checker itself, on journals built by hand: it finds each kind of violation it promises to
find, so that a green fault suite means something."""

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text
from support.recording_upstream import Reception
from support.store import intent, raw_row

from faults.invariants import Journal, find_violations, read_journal
from proxy_addon.audit.chain import Identity, chained, genesis
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import State
from proxy_addon.store.receipts import receipts, transitions

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def receipt(op: str, tag: str, path: list[str], created: float = 0.0, completed: float | None = None) -> tuple[dict, list[dict]]:
    """A receipt and its history; step i happens at `created + i`, the last one at `completed` when given.
    A step's history id is its time in milliseconds: the database's order follows the times here."""
    steps, previous = [], None
    for i, to in enumerate(path):
        seconds = completed if completed is not None and i == len(path) - 1 else created + i
        at = T0 + timedelta(seconds=seconds)
        steps.append({"id": round(seconds * 1000), "operation_id": op, "from_state": previous, "to_state": to,
                      "recorded_at": at, "detail": {}})
        previous = to
    row = {
        "operation_id": op,
        "state": path[-1],
        "request_body": f'{{"tag":"{tag}"}}'.encode(),
        "account": "acct",
        "intent_fingerprint": f"sha256:{tag}",
        "created_at": T0 + timedelta(seconds=created),
        "completed_at": None if completed is None else T0 + timedelta(seconds=completed),
        "proxy_instance": "p",
        "method": "POST", "scheme": "https", "host": "api.example.com", "port": 443, "path": "/items",
    }
    hashes = chained(genesis(Identity.of(row)), steps)  # as the journal chains them
    for step, row_hash in zip(steps, hashes, strict=True):
        step["hash"] = row_hash
    row["history_head"] = hashes[-1] if hashes else None
    return row, steps


def tampered(made: tuple[dict, list[dict]]) -> tuple[dict, list[dict]]:
    """The receipt with its last history row's detail changed after it was hashed."""
    row, steps = made
    steps[-1]["detail"] = {"who": "mallory"}
    return row, steps


def journal(*receipts: tuple[dict, list[dict]]) -> Journal:
    return Journal({r["operation_id"]: r for r, _ in receipts}, {r["operation_id"]: h for r, h in receipts})


def got(tag: str, op: str | None, at: float, send: str = "s") -> Reception:
    return Reception("POST", "/items", tag, "success", f"{send}-{at}", op, at)


OK = ["planned", "submitted", "succeeded"]


def test_a_clean_run_has_no_finding():
    j = journal(receipt("op1", "a", OK, 0, 2), receipt("op2", "b", ["planned", "submitted", "rejected"], 0, 1),
                receipt("op3", "b", OK, 3, 4))
    found = find_violations(j, [got("a", "op1", 1), got("b", "op2", 1), got("b", "op3", 3.5)], ["op1", "op2"])
    assert found.problems == []


@pytest.mark.parametrize(
    ("receipts", "receptions", "answered", "kind"),
    [
        ([receipt("op1", "a", OK, 0, 2)], [got("a", "op9", 1)], [], "lost"),
        ([receipt("op1", "a", OK, 0, 2)], [got("a", None, 1), got("b", None, 1)], [], "lost"),
        ([receipt("op1", "a", ["planned", "rejected"], 0, 1)], [got("a", "op1", 1)], [], "lost"),
        ([receipt("op1", "a", OK, 0, 2)], [], ["op7"], "lost"),
        ([receipt("op1", "a", OK, 0, 2)], [got("a", "op1", 1), got("a", "op1", 1.5)], [], "duplicates"),
        ([receipt("op1", "a", ["planned", "submitted", "outcome_unknown"], 0), receipt("op2", "a", OK, 3, 4)],
         [got("a", "op1", 1), got("a", "op2", 3.5)], [], "duplicates"),
        ([receipt("op1", "a", ["planned", "submitted", "rejected"], 0, 5), receipt("op2", "a", OK, 3, 6)],
         [got("a", "op1", 1), got("a", "op2", 3.5)], [], "duplicates"),
        ([receipt("op1", "a", ["planned", "submitted"], 0)], [got("a", "op1", 1)], [], "unsettled"),
        ([receipt("op1", "a", ["planned", "succeeded"], 0, 1)], [], [], "half_written"),
        ([receipt("op1", "a", ["submitted", "succeeded"], 0, 1)], [], [], "half_written"),
        ([receipt("op1", "a", OK, 0, None)], [], [], "half_written"),
        ([tampered(receipt("op1", "a", OK, 0, 2))], [got("a", "op1", 1)], ["op1"], "broken_chains"),
    ],
    ids=["unknown-operation", "no-receipt-by-tag", "never-submitted", "answered-missing", "same-receipt-twice",
         "again-while-unknown", "again-before-terminal", "left-submitted", "skipped-a-state", "no-creation", "no-completed-at",
         "audit-chain-broken"],
)
def test_each_violation_is_found(receipts, receptions, answered, kind):
    found = find_violations(journal(*receipts), receptions, answered)
    assert getattr(found, kind), found.problems


def test_a_receipt_whose_state_is_not_its_last_transition_is_half_written():
    row, steps = receipt("op1", "a", OK, 0, 2)
    row["state"] = "outcome_unknown"
    assert find_violations(journal((row, steps)), []).half_written


def test_history_without_its_receipt_is_half_written():
    _, steps = receipt("op1", "a", OK, 0, 2)
    assert find_violations(Journal({}, {"op1": steps}), []).half_written


def test_knowingly_unjournaled_sends_are_not_lost():
    r = got("a", None, 1, send="open")
    assert find_violations(journal(), [r], unjournaled_sends=[r.send_id]).problems == []


# -- the checker on real databases: timestamps out of order with the commits, and a real overlap -------------


def _journal_of(store) -> Journal:
    return read_journal(store.engine.url.render_as_string(hide_password=False))


def test_a_receipt_created_just_after_another_closed_is_no_violation(store):
    """An interleaving a fault run met, made deterministic: B's writer reads its clock (created_at), then A is closed
    (completed_at, later by that clock) and committed, then B decides, sees A closed, and is created. The
    proxy did right; a checker ordering by the timestamps called it a duplicate forward."""
    a = intent(fingerprint="sha256:" + "a" * 64, request_body=b'{"tag": "a"}')
    store.receipts.record_and_submit(a, None, "proxy-1")
    b = replace(a, operation_id="op_b_" + uuid.uuid4().hex[:8])
    b_waiting, a_closed = threading.Event(), threading.Event()
    plain_write = store.db.write

    def write(work, conn=None):
        if threading.current_thread().name.startswith("creating-b"):  # B's clock was read before this call
            b_waiting.set()
            assert a_closed.wait(10)
        return plain_write(work, conn)

    store.db.write = write
    with ThreadPoolExecutor(1, thread_name_prefix="creating-b") as pool:
        creating_b = pool.submit(store.receipts.record_and_submit, b, None, "proxy-1")
        assert b_waiting.wait(10)
        store.receipts.transition(a.operation_id, State.SUBMITTED, State.REJECTED, {"who": "proxy-1"}, status_code=422)
        a_closed.set()
        creating_b.result(10)
    store.receipts.transition(b.operation_id, State.SUBMITTED, State.REJECTED, {"who": "proxy-1"}, status_code=422)

    journal = _journal_of(store)
    ra, rb = journal.receipts[a.operation_id], journal.receipts[b.operation_id]
    assert rb["created_at"] < ra["completed_at"], "the interleaving did not happen"
    sent = [got("a", a.operation_id, 1), got("a", b.operation_id, 2)]
    assert find_violations(journal, sent).problems == []


def test_a_receipt_created_while_another_was_open_is_found(store):
    """The same two receipts, but B written while A is still open, past the decision and the open-intent
    index (dropped here): the checker must call it a duplicate forward, although B's timestamps are later."""
    a = intent(fingerprint="sha256:" + "b" * 64, request_body=b'{"tag": "a"}')
    store.receipts.record_and_submit(a, None, "proxy-1")
    b = replace(a, operation_id="op_b_" + uuid.uuid4().hex[:8])
    with store.engine.begin() as conn:
        conn.execute(text("DROP INDEX uq_receipts_open_intent"))
        now = utcnow()
        conn.execute(insert(receipts), {**raw_row(b.intent_fingerprint, b.account), "operation_id": b.operation_id,
                                        "request_body": b'{"tag": "a"}', "state": "planned"})
        conn.execute(insert(transitions), {"operation_id": b.operation_id, "from_state": None, "to_state": "planned",
                                           "recorded_at": now, "detail": {}})
    store.receipts.transition(a.operation_id, State.SUBMITTED, State.REJECTED, {"who": "proxy-1"}, status_code=422)
    store.receipts.transition(b.operation_id, State.PLANNED, State.SUBMITTED, {"who": "proxy-1"})
    store.receipts.transition(b.operation_id, State.SUBMITTED, State.REJECTED, {"who": "proxy-1"}, status_code=422)

    journal = _journal_of(store)
    sent = [got("a", a.operation_id, 1), got("a", b.operation_id, 2)]
    found = find_violations(journal, sent)
    assert any(b.operation_id in p and "forwarded under" in p for p in found.duplicates), found.problems
    assert any("was created while" in p for p in found.duplicates), found.problems
