"""The write path's statements on a journal seeded with a skewed history (one account writing to one target, as
an agent posting to one endpoint does): each statement the journal writes run on every branch (a new intent, its
verdict, a repeat of a recent success, an open duplicate, a reused Idempotency-Key) is read for its plan, and
none may scan the history or cost what PostgreSQL compiles with JIT. On SQLite, where a plan's "SEARCH" can still
walk every row an index matches, the work each statement does is counted too (SQLite's virtual machine steps,
through the progress handler) and must not grow with the history.

Run through the very code the writer runs (journal/writes.py over a connection that explains each statement
before it runs it), so a statement added later is checked without being listed here."""

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, text
from support.store import fp, intent

from proxy_addon.db import make_engine
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.rows import NewReceipt, Step
from proxy_addon.journal.tables import Receipt, ReceiptTransition
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import utcnow
from proxy_addon.store import ReceiptStore

HISTORY = 20_000  # receipts of one account on one target
ACCOUNT, HOST, PATH = "acct:skewed", "api.example.com", "/doc"
REPLAY = successes_block_for(AfterSuccess())
JIT_ABOVE_COST = 100_000  # PostgreSQL's default jit_above_cost
SQLITE_STEPS = 20_000  # VM steps per statement: a probe takes hundreds; reading the history, millions
PG_BLOCKS = 200  # buffer blocks per statement (hit or read): a probe touches tens; reading the history, hundreds
TABLES = {"receipts", "receipt_transitions", "approvals", "receipt_counts"}


def seed(url: str) -> dict[str, str]:
    """HISTORY receipts of ACCOUNT on HOST PATH, nine PUTs to one POST, then as many newer ones of other accounts
    on other targets, all succeeded within the replay window, each with its creation row; analysed as autovacuum
    would. The skewed account's newest receipt's fingerprint and key (its repeat asks whether a later write on
    its target invalidated it: none did, the case that read every earlier one)."""
    engine = make_engine(url)
    now = utcnow()
    rows, history = [], []
    for i in range(2 * HISTORY):
        at = now - timedelta(milliseconds=10 * (2 * HISTORY - i))  # all within the replay window (15 min)
        op = f"op_seed{i:08d}"
        skewed = i < HISTORY
        rows.append({
            "operation_id": op, "operation": "docs.put", "method": "POST" if i % 10 == 0 else "PUT", "scheme": "https",
            "host": HOST, "port": 443, "path": PATH if skewed else f"/other/{i}",
            "intent_fingerprint": "sha256:" + hashlib.sha256(b"%d" % i).hexdigest(),
            "account": ACCOUNT if skewed else f"acct:other-{i % 500}", "idempotency_key": f"key-{i}", "state": "succeeded",
            "created_at": at, "updated_at": at, "submitted_at": at, "completed_at": at, "status_code": 200, "seq": i + 1,
            "agent": "billing" if i % 2 else None,
        })  # fmt: skip
        history.append({"operation_id": op, "from_state": None, "to_state": "planned", "recorded_at": at, "detail": {}})
    try:
        with engine.begin() as conn:
            conn.execute(insert(Receipt.__table__), rows)
            conn.execute(insert(ReceiptTransition.__table__), history)
            if engine.dialect.name == "postgresql":
                conn.execute(text(f"SELECT setval('receipts_seq', {2 * HISTORY + 1})"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    newest = rows[HISTORY - 1]
    return {"fingerprint": newest["intent_fingerprint"], "key": newest["idempotency_key"]}


class Explaining:
    """A Connection (journal/writes.py) that reads each statement's plan and counts its work (SQLite's VM steps,
    PostgreSQL's buffer blocks, from EXPLAIN ANALYZE under a savepoint rolled back) as it runs it."""

    def __init__(self, driver: Any, dialect: str):
        self.driver, self.dialect = driver, dialect
        self.plans: list[tuple[str, Any, int]] = []  # statement, plan, its work (VM steps or buffer blocks)

    def execute(self, statement: str, params: dict[str, Any]) -> Any:
        cursor = self.driver.cursor()
        if self.dialect == "postgresql":  # run, measured, then undone; then run for real
            cursor.execute("SAVEPOINT explained")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
            plan = cursor.fetchone()[0][0]["Plan"]
            cursor.execute("ROLLBACK TO SAVEPOINT explained")
            self.plans.append((statement, plan, plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)))
            cursor.execute(statement, params)
            return cursor
        plan = cursor.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
        steps = [0]

        def counted() -> int:
            steps[0] += 100
            return 0

        self.driver.set_progress_handler(counted, 100)
        try:
            cursor.execute(statement, params)
            rows = cursor.fetchall() if cursor.description else []  # the steps are taken as the rows are read
        finally:
            self.driver.set_progress_handler(None, 0)
        self.plans.append((statement, plan, steps[0]))
        return _Read(cursor.rowcount, rows)

    def pipeline(self) -> AbstractContextManager[Any]:
        return nullcontext()  # one by one: each is explained before it runs


class _Read:
    """A SQLite cursor's result read whole (its steps counted), as journal/writes.py reads a cursor."""

    def __init__(self, rowcount: int, rows: list[Any]):
        self.rowcount, self._rows = rowcount, iter(rows)

    def fetchone(self) -> Any:
        return next(self._rows, None)


def pg_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from pg_nodes(child)


def plan_text(plan: dict[str, Any]) -> str:
    return "; ".join(f"{n['Node Type']} {n.get('Index Name') or n.get('Relation Name') or ''}".strip() for n in pg_nodes(plan))


def problems(dialect: str, statement: str, plan: Any, steps: int) -> list[str]:
    """What is wrong with one statement's plan: a scan of a journal table, a cost past JIT's threshold, work that
    reads the history."""
    short = " ".join(statement.split())[:140]
    if dialect == "postgresql":
        found = [f"{n['Node Type']} on {n['Relation Name']}" for n in pg_nodes(plan) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in TABLES]
        if plan["Total Cost"] > JIT_ABOVE_COST:
            found.append(f"total cost {plan['Total Cost']} > jit_above_cost")
        if steps > PG_BLOCKS:
            found.append(f"{steps} buffer blocks")
        return [f"{short}: {f} ({plan_text(plan)})" for f in found]
    found = [row[-1] for row in plan if str(row[-1]).startswith("SCAN") and "CONSTANT ROW" not in str(row[-1])]
    if steps > SQLITE_STEPS:
        found.append(f"{steps} VM steps")
    return [f"{short}: {f} ({json.dumps([r[-1] for r in plan])})" for f in found]


@pytest.fixture(scope="module")
def skewed(module_db_url: str) -> tuple[str, dict[str, str]]:
    """Seeded once per database for the module (the tests after the hot path's see its few receipts too; the
    prune's, last, deletes two batches of the oldest)."""
    return module_db_url, seed(module_db_url)


def test_no_write_of_the_hot_path_reads_the_history(skewed):
    url, newest = skewed
    connection = DriverConnection(url)
    try:
        with connection.transaction() as driver:
            explaining = Explaining(driver, connection.dialect)
            journal = JournalWrites.on(explaining, connection.statements)
            new = intent(fp(), account=ACCOUNT, method="PUT", host=HOST, path=PATH, proxy_instance="me")
            head = journal.record(NewReceipt(new, REPLAY, "me"))  # a new intent on the skewed target
            assert isinstance(head, str)
            blocked = journal.record(NewReceipt(intent(new.intent_fingerprint, account=ACCOUNT, method="PUT", host=HOST, path=PATH), REPLAY, "me"))
            assert not isinstance(blocked, str)  # an open duplicate
            journal.advance(Step(new.operation_id, "submitted", "succeeded", {"who": "me"}, {"status_code": 200}, head=head))
            repeat = intent(newest["fingerprint"], account=ACCOUNT, method="PUT", host=HOST, path=PATH)
            journal.record(NewReceipt(repeat, REPLAY, "me"))  # a repeat of a recent success: the replay decision
            reused = intent(fp(), account=ACCOUNT, method="PUT", host=HOST, path=PATH, idempotency_key=newest["key"])
            journal.record(NewReceipt(reused, REPLAY, "me"))  # a reused Idempotency-Key
            journal.record(NewReceipt(intent(fp(), account=ACCOUNT, method="POST", host=HOST, path=PATH), None, "me"))  # allow
    finally:
        connection.engine.dispose()
    assert len(explaining.plans) >= 6
    found = [p for statement, plan, steps in explaining.plans for p in problems(connection.dialect, statement, plan, steps)]
    assert not found, "\n".join(found)



def explained_reads(engine: Any, run: Any) -> list[tuple[str, Any]]:
    """Each SELECT on `receipts` that `run(store)` makes, with its plan (read just before it runs)."""
    explained: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def explain(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM receipts" in statement:
            prefix = "EXPLAIN (FORMAT JSON) " if engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
            cursor.execute(prefix + statement, parameters)
            explained.append((statement, cursor.fetchall()))

    try:
        run(ReceiptStore(engine))
    finally:
        engine.dispose()
    return explained


def sorts_or_scans(dialect: str, explained: list[tuple[str, Any]], in_order_index: str = "") -> list[str]:
    """The plans that sort, or scan a table (on SQLite, reading `in_order_index` backwards for a statement with no
    WHERE is allowed: a page of the newest, in order, stops after its rows)."""
    found = []
    for statement, rows in explained:
        if dialect == "postgresql":
            plan = rows[0][0][0]["Plan"]
            found += [f"{n['Node Type']}: {plan_text(plan)}" for n in pg_nodes(plan) if n["Node Type"] in ("Seq Scan", "Sort")]
            continue
        in_order = bool(in_order_index) and "WHERE" not in statement
        found += [f"{r[-1]}: {statement[-160:]}" for r in rows if "TEMP B-TREE" in str(r[-1])
                  or (str(r[-1]).startswith("SCAN") and not (in_order and f"USING INDEX {in_order_index}" in str(r[-1])))]
    return found


def test_a_list_page_reads_its_index_from_the_cursor_on(skewed):
    """`ls`, the review page and the admin API: a page of the newest receipts of a state, a host or an agent (or
    the anonymous ones), and the page after a given receipt, read their index in journal order and stop at the
    page's end; neither a scan nor a sort of every receipt of that state, host or agent (40,000 `succeeded`
    here, 20,000 of one agent)."""
    engine = make_engine(skewed[0])

    def pages(store: ReceiptStore) -> None:
        after = store.receipts.list(limit=50)[-1].operation_id
        for query in ({}, {"states": ["succeeded"]}, {"host": HOST}, {"states": ["succeeded"], "after": after},
                      {"host": HOST, "after": after}, {"after": after}, {"agent": "billing"}, {"agent": None},
                      {"agent": "billing", "after": after}, {"agent": None, "after": after}):
            assert len(store.receipts.list(limit=50, **query)) == 50

    explained = explained_reads(engine, pages)
    assert len(explained) >= 13
    found = sorts_or_scans(engine.dialect.name, explained, in_order_index="ix_receipts_seq")
    assert not found, "\n".join(found)


def test_a_prune_batch_reads_the_oldest_terminal_receipts_from_their_index(skewed):
    """Each prune batch holds the journal's write lock (SQLite): it must read the oldest terminal receipts from
    their partial index, not sort every terminal receipt (SQLite's planner, without statistics, preferred
    ix_receipts_state_seq for `state IN (...)`: 1.4 s a batch at a million receipts)."""
    engine = make_engine(skewed[0])
    batches = iter(range(2))

    def prune(store: ReceiptStore) -> None:
        pruned = store.retention.prune(timedelta(0), stop=lambda: next(batches, None) is None, pause=0)
        assert pruned.receipts > 0

    explained = explained_reads(engine, prune)
    assert len(explained) >= 2  # each batch's choice
    found = sorts_or_scans(engine.dialect.name, explained)
    assert not found, "\n".join(found)
