"""`receipts verify`: every chain recomputed, and, with the public key, every checkpoint checked and compared
with what is there now.

What each kind of tampering looks like, and how it is named:
- `changed`: a row no longer matches its hash, though the row after it (or the receipt's head) still chains
  from that hash;
- `removed`: a row is missing: the next one chains from a hash that is nowhere, and the states skip a step (or
  the history ends before the receipt's head);
- `inserted`: a row without a hash, a row that chains from nothing there, rows between a row and the one
  that chains from it, or rows after the receipt's head;
- `reordered`: every row is intact and chains from another, but not in the order of their ids;
- `deleted` / `cut short`: a checkpoint's receipt is gone (and `receipts prune` did not record it), or its
  head then is no longer in its history.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from proxy_addon.audit.chain import Chain, genesis, hash_of
from proxy_addon.audit.checkpoint import checkpoint_problem
from proxy_addon.rules.records import AuditEventRecord, CheckpointRecord


class Tampering(StrEnum):
    CHANGED = "changed"
    REMOVED = "removed"
    INSERTED = "inserted"
    REORDERED = "reordered"
    DELETED = "deleted"
    CUT_SHORT = "cut short"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True, slots=True)
class Finding:
    """One receipt (or checkpoint) whose history is not what was written, and how, in one line."""

    operation_id: str
    how: Tampering
    detail: str


@dataclass
class Report:
    receipts: int = 0
    rows: int = 0
    checkpoints: int = 0
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


# -- one chain --------------------------------------------------------------------------------------------------


def _named(row: Mapping[str, Any]) -> str:
    return f"row {row['id']} ({row['from_state'] or 'new'} -> {row['to_state']})"


def check_chain(chain: Chain) -> list[Finding]:
    """What is wrong with this receipt's history, one finding per kind (empty: it holds)."""
    start = genesis(chain.identity)
    findings, end = _walk(chain, start)
    reordered = _reordered(chain.rows, start) if findings else None
    if reordered is not None:
        findings, end = [reordered[0]], reordered[1]
    findings += _head_problem(chain, end)
    seen: dict[Tampering, Finding] = {}
    for finding in findings:
        seen.setdefault(finding.how, finding)
    return [Finding(chain.identity.operation_id, f.how, f.detail) for f in seen.values()]


def _walk(chain: Chain, start: str) -> tuple[list[Finding], str]:
    """Row by row in id order; after a broken link, the walk goes on from the row's own hash, so that one
    change is one finding."""
    rows, findings, previous = chain.rows, [], start
    present = {row["hash"]: i for i, row in enumerate(rows) if row["hash"] is not None}
    for i, row in enumerate(rows):
        if row["hash"] is None:
            findings.append(Finding("", Tampering.INSERTED, f"{_named(row)} has no hash: it was not written by the journal"))
            continue
        if hash_of(row, previous) != row["hash"]:
            findings.append(_broken_link(chain, i, start, present))
        previous = row["hash"]
    return findings, previous


def _broken_link(chain: Chain, i: int, start: str, present: Mapping[str, int]) -> Finding:
    """Why row i does not chain from the row before it."""
    rows, row = chain.rows, chain.rows[i]
    for candidate, j in [(start, -1), *present.items()]:
        if j != i - 1 and j != i and hash_of(row, candidate) == row["hash"]:
            if j > i:
                return Finding("", Tampering.REORDERED, f"{_named(row)} chains from {_named(rows[j])}, which comes after it")
            before = "the start" if j < 0 else _named(rows[j])
            return Finding("", Tampering.INSERTED, f"rows were inserted between {before} and {_named(row)}")
    chained_from = i + 1 < len(rows) and rows[i + 1]["hash"] is not None and hash_of(rows[i + 1], row["hash"]) == rows[i + 1]["hash"]
    if chained_from or (i + 1 == len(rows) and chain.head == row["hash"]):
        expected_from = rows[i - 1]["to_state"] if i > 0 else None
        if row["from_state"] != expected_from:
            return Finding("", Tampering.REMOVED, f"a row before {_named(row)} is missing (after {expected_from or 'the start'})")
        before = "the row before it" if i > 0 else "the receipt's identity"
        return Finding("", Tampering.CHANGED, f"{_named(row)} does not match its hash (it, or {before}, was changed)")
    return Finding("", Tampering.INSERTED, f"{_named(row)} chains from nothing in its history")


def _reordered(rows: Sequence[Mapping[str, Any]], start: str) -> tuple[Finding, str] | None:
    """When every row is intact and each chains from another (or the start), but not in id order: the rows
    out of place, and the hash the chain ends with."""
    if not rows or any(row["hash"] is None for row in rows):
        return None
    previous, order, left = start, [], list(rows)
    while left:
        nxt = next((row for row in left if hash_of(row, previous) == row["hash"]), None)
        if nxt is None:
            return None
        order.append(nxt)
        left.remove(nxt)
        previous = nxt["hash"]
    if [r["id"] for r in order] == [r["id"] for r in rows]:
        return None
    moved = [_named(row) for row, should in zip(rows, order, strict=True) if row["id"] != should["id"]]
    return Finding("", Tampering.REORDERED, f"{', '.join(moved)} are out of order"), previous


def _head_problem(chain: Chain, end: str | None) -> list[Finding]:
    """The receipt's stored head against the hash its history ends with."""
    if not chain.rows:
        return [] if chain.head is None else [Finding("", Tampering.REMOVED, "its whole history is missing")]
    if chain.head == end:
        return []
    if chain.head is None:
        return [Finding("", Tampering.CHANGED, "its history head was removed")]
    hashes = [row["hash"] for row in chain.rows]
    if chain.head in hashes:
        after = chain.rows[hashes.index(chain.head) + 1]
        return [Finding("", Tampering.INSERTED, f"{_named(after)} and any after it came after its head")]
    return [Finding("", Tampering.REMOVED, "its last rows are missing: its head is not in its history")]


# -- the whole journal ------------------------------------------------------------------------------------------


def verify(
    checkpoints: Sequence[CheckpointRecord],
    chains: Iterable[Chain],
    events: Callable[[], Sequence[AuditEventRecord]],
    public_key: Ed25519PublicKey | None,
) -> Report:
    """Every chain; with `public_key`, every checkpoint, and each receipt's head at its latest checkpoint
    against its history now (a receipt `receipts prune` recorded, or `receipts scrub` chained again, is a note).

    Read in this order, so that a journal in use verifies clean: the checkpoints before the chains (a head
    signed later than its chain was read would look cut short), the events after them (a receipt pruned
    while the chains were read is recorded by then)."""
    report = Report()
    expected = _checkpointed_heads(checkpoints, public_key, report)
    moved: dict[str, int] = {}  # operation_id -> the checkpoint whose head is no longer in its history
    for chain in chains:
        report.receipts += 1
        report.rows += len(chain.rows)
        report.findings += check_chain(chain)
        at = expected.pop(chain.identity.operation_id, None)
        if at is not None and at[1] not in {row["hash"] for row in chain.rows}:
            moved[chain.identity.operation_id] = at[0]
    done = events()
    report.notes += [f"{r.recorded_at:%Y-%m-%d %H:%M:%S} UTC: {r.note}" for r in done if r.kind == "migrated" and r.note]
    _cut_short(moved, {r.operation_id for r in done if r.kind == "rechained"}, report)
    _gone(expected, {r.operation_id for r in done if r.kind == "pruned"}, report)
    return report


def _cut_short(moved: Mapping[str, int], rechained: set[str], report: Report) -> None:
    """Receipts whose head at a checkpoint is no longer in their history: cut short, unless scrub said why."""
    for operation_id, checkpoint_id in sorted(moved.items()):
        if operation_id in rechained:
            report.notes.append(f"{operation_id}: chained again by receipts scrub after checkpoint {checkpoint_id}")
            continue
        detail = f"its head at checkpoint {checkpoint_id} is no longer in its history"
        report.findings.append(Finding(operation_id, Tampering.CUT_SHORT, detail))


def _checkpointed_heads(
    checkpoints: Sequence[CheckpointRecord], public_key: Ed25519PublicKey | None, report: Report
) -> dict[str, tuple[int, str]]:
    """operation_id -> (checkpoint id, head) of the latest valid checkpoint naming it; problems as findings."""
    if public_key is None:
        if checkpoints:
            report.notes.append(f"{len(checkpoints)} checkpoints not checked: give --public-key")
        return {}
    expected: dict[str, tuple[int, str]] = {}
    previous: str | None = None
    for checkpoint in checkpoints:
        report.checkpoints += 1
        problem = checkpoint_problem(public_key, checkpoint.signed, checkpoint.signature, checkpoint.heads, previous)
        previous = checkpoint.signed
        if problem is not None:
            report.findings.append(Finding(f"checkpoint {checkpoint.id}", Tampering.CHECKPOINT, problem))
            continue
        expected.update({operation_id: (checkpoint.id, head) for operation_id, head in checkpoint.heads})
    return expected


def _gone(expected: Mapping[str, tuple[int, str]], pruned: set[str], report: Report) -> None:
    """Receipts a checkpoint named that are not there any more."""
    recorded = 0
    for operation_id, (checkpoint_id, _head) in sorted(expected.items()):
        if operation_id in pruned:
            recorded += 1
            continue
        report.findings.append(Finding(operation_id, Tampering.DELETED, f"deleted after checkpoint {checkpoint_id}"))
    if recorded:
        report.notes.append(f"{recorded} checkpointed receipts were pruned since (recorded by receipts prune)")
