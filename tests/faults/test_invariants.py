"""The invariant checker itself, on journals built by hand: it finds each kind of violation it promises to
find, so that a green fault suite means something."""

from datetime import UTC, datetime, timedelta

import pytest

from faults.invariants import Journal, find_violations
from faults.recording_upstream import Reception

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def receipt(op: str, tag: str, path: list[str], created: float = 0.0, completed: float | None = None) -> tuple[dict, list[dict]]:
    steps, previous = [], None
    for i, to in enumerate(path):
        at = T0 + timedelta(seconds=created + i)
        steps.append({"operation_id": op, "from_state": previous, "to_state": to, "recorded_at": at})
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
    }
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
    ],
    ids=["unknown-operation", "no-receipt-by-tag", "never-submitted", "answered-missing", "same-receipt-twice",
         "again-while-unknown", "again-before-terminal", "left-submitted", "skipped-a-state", "no-creation", "no-completed-at"],
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
