"""The dashboard views of migrations 0002 and 0010 and every query of docs/queries.sql, on SQLite and PostgreSQL."""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text, update
from support.store import intent, recorded, walk

from proxy_addon.db import alembic_config, make_engine
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import RefusalReason, State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts

QUERIES = Path(__file__).resolve().parents[2] / "docs" / "queries.sql"
VIEWS = {"v_open_receipts", "v_unknowns_by_host", "v_daily_counts", "v_duplicates_refused", "v_agent_activity"}


def load_queries() -> dict[str, str]:
    """question (the comment line just above) -> its query; statements end with `;` at the end of a line."""
    queries: dict[str, str] = {}
    question, lines = None, []
    for line in QUERIES.read_text().splitlines():
        if line.startswith("--"):
            if not lines:
                question = line[2:].strip()
            continue
        if line.strip():
            lines.append(line)
        if line.rstrip().endswith(";"):
            assert question and question not in queries, f"each query needs its own question: {lines[0]}"
            queries[question] = "\n".join(lines).rstrip().rstrip(";")
            question, lines = None, []
    assert not lines, "a statement without a closing ;"
    return queries


def made(store: ReceiptStore, target: State, ago: timedelta = timedelta(0), host: str = "api.example.com",
         operation: str = "articles.create", agent: str | None = None, **updates) -> str:
    rec = recorded(store, intent(agent=agent))
    walk(store, rec.operation_id, target, **updates)
    with store.engine.begin() as conn:
        conn.execute(
            update(receipts)
            .where(receipts.c.operation_id == rec.operation_id)
            .values(created_at=utcnow() - ago, host=host, operation=operation)
        )
    return rec.operation_id


@pytest.fixture
def world(store):
    ids = {
        "old_unknown": made(store, State.OUTCOME_UNKNOWN, timedelta(minutes=20)),
        "fresh_unknown": made(store, State.OUTCOME_UNKNOWN, timedelta(seconds=5), agent="billing"),
        "old_review": made(store, State.MANUAL_REVIEW, timedelta(hours=3), host="pay.example.com", operation="pay"),
        "older_review": made(store, State.MANUAL_REVIEW, timedelta(days=2), host="pay.example.com", operation="pay"),
        "done": made(store, State.SUCCEEDED, timedelta(days=3), status_code=201),
        "done2": made(store, State.SUCCEEDED, timedelta(hours=1), agent="billing", status_code=201),
        "refused": made(store, State.REJECTED, timedelta(hours=1), status_code=422),
        "ancient": made(store, State.SUCCEEDED, timedelta(days=10), status_code=201),
        "planned": recorded(store, intent()).operation_id,
    }
    blocker = store.receipts.get(ids["old_unknown"])
    for _ in range(2):
        store.refusals.record(
            RefusalReason.DUPLICATE_OPEN, blocker.operation_id,
            intent(blocker.intent_fingerprint, blocker.account, host=blocker.host, path=blocker.path, agent="billing"),
            "proxy-test",
        )
    return ids


def run(store: ReceiptStore, sql: str) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql))]


def test_every_query_runs_and_answers(store, world):
    queries = load_queries()
    assert len(queries) == 8
    answers = {q: run(store, sql) for q, sql in queries.items()}

    old = answers["Which unknown receipts are older than ten minutes?"]
    assert [r["operation_id"] for r in old] == [world["older_review"], world["old_review"], world["old_unknown"]]
    assert world["fresh_unknown"] not in {r["operation_id"] for r in old}

    per_host = {r["host"]: r for r in answers["How many unknowns does each host have, and how old is its oldest?"]}
    assert per_host["api.example.com"]["unknown_count"] == 2 and per_host["api.example.com"]["manual_review_count"] == 0
    assert 1140 < per_host["api.example.com"]["oldest_age_seconds"] < 1260  # 20 minutes, as each dialect counts it
    assert per_host["pay.example.com"]["manual_review_count"] == 2
    assert abs(per_host["pay.example.com"]["oldest_age_seconds"] - 2 * 86400) < 60

    buckets = {r["age_bucket"]: r["open_receipts"] for r in answers["How many receipts are open, by age bucket?"]}
    assert buckets == {"1: under 1 minute": 2, "3: 10 to 60 minutes": 1, "4: 1 to 24 hours": 1, "5: over a day": 1}

    daily = answers["How many receipts were created each day of the last 7 days, by state and host?"]
    assert sum(r["receipt_count"] for r in daily) == 8  # all but the ten-day-old one
    three_days_ago = (utcnow() - timedelta(days=3)).strftime("%Y-%m-%d")
    assert {"day": three_days_ago, "host": "api.example.com", "state": "succeeded", "receipt_count": 1} in daily

    dups = answers["How many duplicates were refused (or replayed) each day, and which receipt blocked them?"]
    assert len(dups) == 1
    assert dups[0]["blocking_operation_id"] == world["old_unknown"] and dups[0]["refused"] == 2
    assert dups[0]["blocking_state"] == "outcome_unknown" and dups[0]["reason"] == "duplicate_open"
    assert dups[0]["day"] == utcnow().strftime("%Y-%m-%d")

    queue = answers["What is in the manual_review queue, oldest first?"]
    assert [r["operation_id"] for r in queue] == [world["older_review"], world["old_review"]]

    rate = {r["operation"]: r for r in answers["What is the success rate of each operation, among receipts whose outcome is settled?"]}
    assert rate["articles.create"]["settled"] == 4 and rate["articles.create"]["succeeded"] == 3
    assert float(rate["articles.create"]["success_percent"]) == 75.0

    by_agent = answers["What did each agent write in the last 24 hours, by operation and state?"]
    got = {(r["agent"], r["operation"], r["state"]): r["receipts"] for r in by_agent}
    assert got == {
        ("anonymous", "articles.create", "outcome_unknown"): 1,
        ("anonymous", "articles.create", "planned"): 1,
        ("anonymous", "articles.create", "rejected"): 1,
        ("anonymous", "pay", "manual_review"): 1,
        ("billing", "articles.create", "outcome_unknown"): 1,
        ("billing", "articles.create", "succeeded"): 1,
    }


def test_the_views_show_each_receipts_agent(store, world):
    """The open receipts and the refused duplicates name their agent (null: anonymous)."""
    agents = {r["operation_id"]: r["agent"] for r in run(store, "SELECT operation_id, agent FROM v_open_receipts")}
    assert agents[world["fresh_unknown"]] == "billing" and agents[world["old_unknown"]] is None
    refused = run(store, "SELECT agent, blocking_operation_id FROM v_duplicates_refused")
    assert refused and all(r["agent"] == "billing" for r in refused)


def test_open_receipts_view_counts_age_from_utc(store, world):
    rows = {r["operation_id"]: r for r in run(store, "SELECT operation_id, state, age_seconds FROM v_open_receipts")}
    assert set(rows) == {world[k] for k in ("old_unknown", "fresh_unknown", "old_review", "older_review", "planned")}
    assert 0 <= rows[world["planned"]]["age_seconds"] < 30  # no time zone offset between Python and the database
    assert 1140 < rows[world["old_unknown"]]["age_seconds"] < 1260


def test_downgrade_drops_the_views_and_the_table(migrated_url):
    engine = make_engine(migrated_url)
    try:
        assert set(inspect(engine).get_view_names()) >= VIEWS
        command.downgrade(alembic_config(migrated_url), "0001")
        assert not VIEWS & set(inspect(engine).get_view_names())
        assert "duplicate_refusals" not in inspect(engine).get_table_names()
        command.upgrade(alembic_config(migrated_url), "head")
        assert set(inspect(engine).get_view_names()) >= VIEWS
    finally:
        engine.dispose()


def test_the_queries_file_is_what_the_docs_point_to():
    for page in ("README.md", "docs/operations.md"):
        assert re.search(r"docs/queries\.sql", (QUERIES.parents[1] / page).read_text()), page
