"""What must hold after every fault scenario, read from the database and the recording upstream.

1. Nothing lost: every write the upstream received was sent under a receipt that exists and reached
   `submitted` (matched by the operation id the proxy injects as Idempotency-Key, else by the body's tag),
   and every receipt id an agent was answered with exists.
2. Nothing left `submitted` (or `planned`) once recovery ran.
3. No intent forwarded twice while its receipt was open: the upstream saw one tag again only after the
   receipt of the earlier send had ended terminal-and-retryable (`rejected`, `safe_to_retry`) before the
   next receipt was created; and the receipts of one intent (account, fingerprint) never were open at once.
   "Before" is the database's order of the history rows (`Journal.opened`, `Journal.closed`), never the
   receipts' timestamps: see `Journal.closed` for why that order is sound and the timestamps are not.
4. No half-written state: every receipt's history starts with its creation (-> planned), each step is one
   the contract allows (`states.is_allowed`) and starts where the previous one ended, and the last step's
   `to_state` is the receipt's state; terminal receipts have `completed_at`; no history row without its receipt.
5. Every history's audit chain holds (audit/verify.py, `check_chain`): whatever crashed, stalled or raced,
   every row was hashed and chained by the one write path, and each receipt's head is its last row's hash.
7. The counts the database keeps (`receipt_counts`, summed by host and state) are the receipts' own counts.
6. The journal never contradicts what an agent was told (`Told`: an answer's own X-Receipt-Id and
   X-Receipt-State, not a refusal naming another receipt): told `succeeded` or `rejected`, the receipt ends in
   that state (never `safe_to_retry`, `manual_review` or `outcome_unknown` for a told success); told
   `outcome_unknown`, its history went there from `submitted` (what came after is a reconcile verdict or a
   person's). A verdict that committed late (answer first) still ends there, across a crash.

`check_scenario` records the counts in SUMMARY (printed by conftest.py at the end of the run), then fails
the test with every violation found.
"""

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from sqlalchemy import func, select
from support.e2e import VERDICT_WAIT, read_until
from support.recording_upstream import Reception

from proxy_addon.audit.chain import Chain, Identity
from proxy_addon.audit.verify import check_chain
from proxy_addon.db import make_engine
from proxy_addon.journal.tables import Receipt, ReceiptCount, ReceiptTransition
from proxy_addon.rules.states import TERMINAL_STATES, State, is_allowed

RETRYABLE_TERMINAL = frozenset({State.REJECTED.value, State.SAFE_TO_RETRY.value})
UNSETTLED = frozenset({State.PLANNED.value, State.SUBMITTED.value})


@dataclass
class ScenarioRow:
    scenario: str
    sent: int = 0
    received: int = 0
    receipts: int = 0
    duplicates: int = 0
    lost: int = 0
    ok: bool = True


@dataclass
class Summary:
    """Counters the scenarios add to; conftest.py prints them as a table at the end of the pytest run."""

    rows: list[ScenarioRow] = field(default_factory=list)

    def add(self, row: ScenarioRow) -> None:
        self.rows.append(row)

    def totals(self) -> ScenarioRow:
        total = ScenarioRow("total")
        for r in self.rows:
            total.sent += r.sent
            total.received += r.received
            total.receipts += r.receipts
            total.duplicates += r.duplicates
            total.lost += r.lost
            total.ok = total.ok and r.ok
        return total


SUMMARY = Summary()


@dataclass(frozen=True)
class Journal:
    """Every receipt and every history row of one database, as plain dicts."""

    receipts: dict[str, dict[str, Any]]
    history: dict[str, list[dict[str, Any]]]
    counts: dict[tuple[str, str], int] | None = None  # receipt_counts summed, zeros left out (None: not read)

    def tag_of(self, operation_id: str) -> str | None:
        return _tag(self.receipts[operation_id].get("request_body"))

    def reached_submitted(self, operation_id: str) -> bool:
        return any(t["to_state"] == State.SUBMITTED.value for t in self.history.get(operation_id, []))

    def opened(self, operation_id: str) -> int | None:
        """The id of the history row that created the receipt (-> planned)."""
        return next((t["id"] for t in self.history.get(operation_id, []) if t["from_state"] is None), None)

    def closed(self, operation_id: str) -> int | None:
        """The id of the history row that ended the receipt (the first into a terminal state), None while open.

        Why history ids and not `created_at`/`completed_at`: those are the writer's clock read before its
        transaction began (docs/architecture.md, "Which time is which"), so a receipt created just after another one
        closed can carry the earlier timestamp, both transactions correct (a fault run has seen it).
        The ids are drawn inside the writing transactions, and they grow in the order they are drawn (a
        PostgreSQL sequence; SQLite's rowid, under its one write lock). A correct proxy creates B only after
        its decision saw A closed, that is after A's closing transaction committed, and that transaction drew
        A's closing id before its commit; B's creation id is drawn after B's decision. So a closing id larger
        than the next creation id proves that B was created while A was still open: a real violation, never
        a false alarm. (What id order cannot show, ids drawn in one order and committed in the other, cannot
        happen on SQLite, and on PostgreSQL the open-intent unique index makes B's insert wait for the
        transaction that is closing A.)"""
        terminal = {s.value for s in TERMINAL_STATES}
        return next((t["id"] for t in self.history.get(operation_id, []) if t["to_state"] in terminal), None)

    def closed_before_opened(self, earlier: str, later: str) -> bool:
        """Whether `earlier` ended before `later` was created, in the database's order."""
        closed, opened = self.closed(earlier), self.opened(later)
        return closed is not None and opened is not None and closed < opened


def read_journal(database_url: str) -> Journal:
    """One consistent snapshot (REPEATABLE READ on PostgreSQL, a read transaction on SQLite's WAL), so that
    a worker still running cannot move a receipt between reading it and reading its history."""
    engine = make_engine(database_url)
    options = {"sqlite_begin": "DEFERRED"} if engine.dialect.name == "sqlite" else {"isolation_level": "REPEATABLE READ"}
    try:
        with engine.connect().execution_options(**options) as conn, conn.begin():
            receipts = {r.operation_id: dict(r._mapping) for r in conn.execute(select(Receipt.__table__))}
            history: dict[str, list[dict[str, Any]]] = defaultdict(list)
            t = ReceiptTransition.__table__
            for row in conn.execute(select(t).order_by(t.c.id)):
                history[row.operation_id].append(dict(row._mapping))
            c = ReceiptCount.__table__
            summed = conn.execute(select(c.c.host, c.c.state, func.sum(c.c.n)).group_by(c.c.host, c.c.state))
            counts = {(host, state): int(n) for host, state, n in summed if n}
    finally:
        engine.dispose()
    return Journal(receipts, dict(history), counts)


def _tag(body: bytes | None) -> str | None:
    try:
        document = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None
    tag = document.get("tag") if isinstance(document, dict) else None
    return None if tag is None else str(tag)


@dataclass(frozen=True)
class Told:
    """What one answer told its agent of its own receipt (X-Receipt-Id, X-Receipt-State)."""

    receipt_id: str
    state: str | None


def contradiction(journal: "Journal", told: Told) -> str | None:
    """6. How the journal contradicts what the agent was told, or None."""
    receipt = journal.receipts.get(told.receipt_id)
    if receipt is None or told.state is None:
        return None  # a missing receipt is `lost` (1.)
    steps = [t["to_state"] for t in journal.history.get(told.receipt_id, [])]
    if told.state in (State.SUCCEEDED.value, State.REJECTED.value) and receipt["state"] != told.state:
        rows = "; ".join(f"{t['to_state']} at {t['recorded_at']:%H:%M:%S.%f} {t['detail']}" for t in journal.history.get(told.receipt_id, []))
        return f"{told.receipt_id}: the agent was told {told.state}, the journal says {receipt['state']} ({rows})"
    if told.state == State.OUTCOME_UNKNOWN.value and State.OUTCOME_UNKNOWN.value not in steps:
        return f"{told.receipt_id}: the agent was told outcome_unknown, its history never was ({' -> '.join(steps)})"
    return None


@dataclass
class Findings:
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    half_written: list[str] = field(default_factory=list)
    broken_chains: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    miscounted: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return (
            [f"lost: {x}" for x in self.lost]
            + [f"duplicate forward: {x}" for x in self.duplicates]
            + [f"left unsettled: {x}" for x in self.unsettled]
            + [f"half-written: {x}" for x in self.half_written]
            + [f"audit chain: {x}" for x in self.broken_chains]
            + [f"contradicts its answer: {x}" for x in self.contradictions]
            + [f"counts: {x}" for x in self.miscounted]
        )


def find_violations(
    journal: Journal,
    receptions: Iterable[Reception],
    answered_ids: Iterable[str | Told] = (),
    unjournaled_sends: Iterable[str] = (),
) -> Findings:
    """The invariants over one database. `answered_ids`: the receipt ids agents were answered with (a Told
    also says what its own answer told: 6.). `unjournaled_sends`: X-Fault-Send ids that were knowingly
    forwarded without a receipt (fail open); they are left out of 1 and 3."""
    found = Findings()
    told = [a for a in answered_ids if isinstance(a, Told)]
    answered_ids = [a.receipt_id if isinstance(a, Told) else a for a in answered_ids]
    skip = set(unjournaled_sends)
    writes = [r for r in receptions if r.send_id not in skip or r.send_id is None]
    receipts, history = journal.receipts, journal.history

    # 1. every upstream write has its receipt; every answered receipt id exists
    submitted_by_tag: dict[str, list[str]] = defaultdict(list)
    for op in receipts:
        tag = journal.tag_of(op)
        if tag is not None and journal.reached_submitted(op):
            submitted_by_tag[tag].append(op)
    for r in writes:
        if r.operation_id is not None:
            if r.operation_id not in receipts:
                found.lost.append(f"upstream received tag {r.tag} under {r.operation_id}, which has no receipt")
            elif journal.tag_of(r.operation_id) != r.tag:
                other = journal.tag_of(r.operation_id)
                found.lost.append(f"upstream received tag {r.tag} under {r.operation_id}, a receipt for {other}")
            elif not journal.reached_submitted(r.operation_id):
                found.lost.append(f"{r.operation_id} was forwarded but its receipt never was submitted")
        elif not submitted_by_tag.get(r.tag or ""):
            found.lost.append(f"upstream received tag {r.tag} (send {r.send_id}) and no submitted receipt has it")
    for op in set(answered_ids):
        if op not in receipts:
            found.lost.append(f"an agent was answered with receipt {op}, which is not in the database")

    # 2. nothing left planned or submitted
    for op, rec in receipts.items():
        if rec["state"] in UNSETTLED:
            found.unsettled.append(f"{op} is {rec['state']} (instance {rec['proxy_instance']})")

    # 3. no second forward while the earlier receipt was open
    by_tag: dict[str | None, list[Reception]] = defaultdict(list)
    for r in writes:
        by_tag[r.tag].append(r)
    for tag, seen in by_tag.items():
        seen.sort(key=lambda r: r.at)
        if all(r.operation_id is not None for r in seen):
            for earlier, later in pairwise(seen):
                if earlier.operation_id == later.operation_id:
                    found.duplicates.append(f"tag {tag}: receipt {earlier.operation_id} was forwarded twice")
                    continue
                a, b = receipts.get(earlier.operation_id), receipts.get(later.operation_id)
                if a is None or b is None:
                    continue  # already reported as lost
                if a["state"] not in RETRYABLE_TERMINAL or not journal.closed_before_opened(a["operation_id"], b["operation_id"]):
                    found.duplicates.append(
                        f"tag {tag}: forwarded under {later.operation_id} while {earlier.operation_id} was "
                        f"{a['state']} (closed by history row {journal.closed(a['operation_id'])}, "
                        f"next created by row {journal.opened(b['operation_id'])})"
                    )
        else:
            allowed = 1 + sum(1 for op in submitted_by_tag.get(tag or "", []) if receipts[op]["state"] in RETRYABLE_TERMINAL)
            if len(seen) > allowed:
                found.duplicates.append(f"tag {tag}: forwarded {len(seen)} times, at most {allowed} allowed")
    by_intent: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in receipts.values():
        by_intent[(rec["account"], rec["intent_fingerprint"])].append(rec)
    for intent, recs in by_intent.items():
        recs.sort(key=lambda r: journal.opened(r["operation_id"]) or 0)
        for a, b in pairwise(recs):
            if not journal.closed_before_opened(a["operation_id"], b["operation_id"]):
                found.duplicates.append(
                    f"intent {intent[1][:20]}: {b['operation_id']} was created while {a['operation_id']} was open"
                )

    # 4. each history is a whole, allowed path ending in the receipt's state
    for op, rec in receipts.items():
        steps = history.get(op, [])
        if not steps:
            found.half_written.append(f"{op} has no history")
            continue
        previous: str | None = None
        for step in steps:
            frm, to = step["from_state"], step["to_state"]
            if frm != previous or not is_allowed(None if frm is None else State(frm), State(to)):
                found.half_written.append(f"{op}: step {frm} -> {to} after {previous}")
            previous = to
        if previous != rec["state"]:
            found.half_written.append(f"{op} is {rec['state']} but its last transition went to {previous}")
        if State(rec["state"]) in TERMINAL_STATES and rec["completed_at"] is None:
            found.half_written.append(f"{op} is {rec['state']} without completed_at")
    for op in set(history) - set(receipts):
        found.half_written.append(f"history rows for {op}, which has no receipt")
    found.broken_chains += chains_broken(journal)
    found.contradictions += [c for c in (contradiction(journal, t) for t in told) if c is not None]
    found.miscounted += miscounted(journal)
    return found


def miscounted(journal: Journal) -> list[str]:
    """7. Where the kept counts differ from count(*) by host and state."""
    if journal.counts is None:
        return []
    kept = journal.counts
    actual: dict[tuple[str, str], int] = defaultdict(int)
    for receipt in journal.receipts.values():
        actual[(receipt["host"], receipt["state"])] += 1
    return [
        f"{host} {state}: kept {kept.get((host, state), 0)}, counted {actual.get((host, state), 0)}"
        for host, state in sorted(set(actual) | set(kept))
        if kept.get((host, state), 0) != actual.get((host, state), 0)
    ]


def chains_broken(journal: Journal) -> list[str]:
    """5. What `receipts verify` would name, receipt by receipt."""
    out = []
    for op, rec in journal.receipts.items():
        chain = Chain(Identity.of(rec), rec["history_head"], journal.history.get(op, []))
        out += [f"{f.operation_id}: {f.how.value}: {f.detail}" for f in check_chain(chain)]
    return out


def settled_journal(database_url: str, timeout: float = VERDICT_WAIT) -> Journal:
    """`read_journal` once nothing is left planned or submitted, or as it is after `timeout`: a live proxy
    commits a verdict while its answer travels, so the last answers of a scenario may be ahead of their verdicts."""
    return read_until(
        lambda: read_journal(database_url),
        lambda journal: all(r["state"] not in UNSETTLED for r in journal.receipts.values()),
        timeout,
        interval=0.05,
    )


def check_scenario(
    scenario: str,
    database_url: str,
    receptions: Iterable[Reception],
    sent: int,
    answered_ids: Iterable[str | Told] = (),
    unjournaled_sends: Iterable[str] = (),
) -> Journal:
    """Check the invariants, record the scenario's counts in SUMMARY, and fail with every violation."""
    receptions = list(receptions)
    journal = settled_journal(database_url)
    found = find_violations(journal, receptions, answered_ids, unjournaled_sends)
    SUMMARY.add(
        ScenarioRow(
            scenario,
            sent=sent,
            received=len(receptions),
            receipts=len(journal.receipts),
            duplicates=len(found.duplicates),
            lost=len(found.lost),
            ok=not found.problems,
        )
    )
    assert not found.problems, f"{scenario}: invariants violated:\n" + "\n".join(found.problems[:40])
    return journal
