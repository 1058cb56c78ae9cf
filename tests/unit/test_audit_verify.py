"""`check_chain` on histories built in memory: each way a history can be tampered with, named as what it is,
whether or not the intruder computed hashes too."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from proxy_addon.audit.chain import Chain, Identity, chained, genesis, row_hash
from proxy_addon.audit.verify import check_chain

EITHER = " (it, or the row before it, was changed)"
T0 = datetime(2027, 1, 20, 12, 0, 0, 123456, tzinfo=UTC)
IDENTITY = Identity("op_1", "acct:a", "sha256:f", "POST", "https", "api.example.com", 443, "/items", T0)
PATH = [(None, "planned"), ("planned", "submitted"), ("submitted", "outcome_unknown"), ("outcome_unknown", "reconciling"),
        ("reconciling", "succeeded")]


def written() -> Chain:
    """A history as the journal writes it: five rows, ids 10, 20, ..., chained from the identity."""
    rows = [{"id": 10 * (i + 1), "operation_id": "op_1", "from_state": a, "to_state": b,
             "recorded_at": T0 + timedelta(seconds=i), "detail": {"who": "proxy", "i": i}} for i, (a, b) in enumerate(PATH)]
    for row, h in zip(rows, chained(genesis(IDENTITY), rows), strict=True):
        row["hash"] = h
    return Chain(IDENTITY, rows[-1]["hash"], rows)


def rehashed(rows: list[dict], identity: Identity = IDENTITY) -> None:
    """The intruder computes the hashes again for the rows as they are now."""
    for row, h in zip(rows, chained(genesis(identity), rows), strict=True):
        row["hash"] = h


def changed_detail(c: Chain) -> Chain:
    c.rows[2]["detail"] = {"who": "mallory"}
    return c


def changed_time(c: Chain) -> Chain:
    c.rows[1]["recorded_at"] = c.rows[1]["recorded_at"] + timedelta(microseconds=1)
    return c


def changed_identity(c: Chain) -> Chain:
    return dataclasses.replace(c, identity=dataclasses.replace(IDENTITY, account="acct:mallory"))


def changed_and_rehashed_up_to_it(c: Chain) -> Chain:
    c.rows[1]["detail"] = {"who": "mallory"}
    c.rows[1]["hash"] = row_hash(c.rows[0]["hash"], "op_1", "planned", "submitted", c.rows[1]["recorded_at"], c.rows[1]["detail"])
    return c


def removed_middle(c: Chain) -> Chain:
    del c.rows[2]
    return c


def removed_first(c: Chain) -> Chain:
    del c.rows[0]
    return c


def removed_last(c: Chain) -> Chain:
    del c.rows[-1]
    return c


def removed_all(c: Chain) -> Chain:
    c.rows.clear()
    return c


def inserted_without_hash(c: Chain) -> Chain:
    c.rows.insert(2, {**c.rows[2], "id": 25, "hash": None})
    return c


def inserted_chained(c: Chain) -> Chain:
    """A row chained properly from the one before it, put between two rows (the next one no longer follows)."""
    forged = {**c.rows[1], "id": 25, "detail": {"who": "mallory"}}
    forged["hash"] = row_hash(c.rows[1]["hash"], "op_1", forged["from_state"], forged["to_state"], forged["recorded_at"], forged["detail"])
    c.rows.insert(2, forged)
    return c


def appended_chained(c: Chain) -> Chain:
    last = c.rows[-1]
    forged = {**last, "id": 99, "from_state": "succeeded", "to_state": "succeeded", "detail": {"who": "mallory"}}
    forged["hash"] = row_hash(last["hash"], "op_1", "succeeded", "succeeded", last["recorded_at"], forged["detail"])
    c.rows.append(forged)
    return c


def swapped(c: Chain) -> Chain:
    c.rows[1], c.rows[2] = {**c.rows[2], "id": 20}, {**c.rows[1], "id": 30}
    return c


def head_removed(c: Chain) -> Chain:
    return dataclasses.replace(c, head=None)


@pytest.mark.parametrize(
    ("tamper", "how", "says"),
    [
        (changed_detail, "changed", "row 30 (submitted -> outcome_unknown) does not match its hash" + EITHER),
        (changed_time, "changed", "row 20 (planned -> submitted) does not match its hash" + EITHER),
        (changed_identity, "changed", "row 10 (new -> planned) does not match its hash (it, or the receipt's identity, was changed)"),
        (changed_and_rehashed_up_to_it, "changed", "row 30 (submitted -> outcome_unknown) does not match its hash" + EITHER),
        (removed_middle, "removed", "a row before row 40 (outcome_unknown -> reconciling) is missing (after submitted)"),
        (removed_first, "removed", "a row before row 20 (planned -> submitted) is missing (after the start)"),
        (removed_last, "removed", "its last rows are missing: its head is not in its history"),
        (removed_all, "removed", "its whole history is missing"),
        (inserted_without_hash, "inserted", "row 25 (submitted -> outcome_unknown) has no hash: it was not written by the journal"),
        (inserted_chained, "inserted", "rows were inserted between row 20 (planned -> submitted) and row 30 (submitted -> outcome_unknown)"),
        (appended_chained, "inserted", "row 99 (succeeded -> succeeded) and any after it came after its head"),
        (swapped, "reordered", "row 20 (submitted -> outcome_unknown), row 30 (planned -> submitted) are out of order"),
        (head_removed, "changed", "its history head was removed"),
    ],
)
def test_each_tampering_is_named(tamper, how, says):
    assert check_chain(written()) == []
    found = check_chain(tamper(written()))
    assert [(f.operation_id, f.how.value, f.detail) for f in found][:1] == [("op_1", how, says)], found


def test_a_history_rewritten_and_rehashed_whole_holds_without_a_checkpoint():
    """What the chain alone cannot show (the checkpoint is for that): every hash computed again, head too."""
    c = written()
    c.rows[2]["detail"] = {"who": "mallory"}
    rehashed(c.rows)
    assert check_chain(dataclasses.replace(c, head=c.rows[-1]["hash"])) == []


@pytest.mark.parametrize(
    ("field", "value", "how", "says"),
    [
        # the states then skip a step: named as the row that would have made them follow
        ("from_state", "planned", "removed", "a row before row 30 (planned -> outcome_unknown) is missing (after submitted)"),
        ("to_state", "succeeded", "changed", "row 30 (submitted -> succeeded) does not match its hash" + EITHER),
    ],
    ids=["from_state", "to_state"],
)
def test_a_rows_state_changed_alone_is_named(field, value, how, says):
    """Both states of a row are in its hash: a row made to say it came from, or went to, another state, with
    nothing else changed and no hash recomputed, does not verify."""
    c = written()
    c.rows[2][field] = value
    assert [(f.operation_id, f.how.value, f.detail) for f in check_chain(c)] == [("op_1", how, says)]
