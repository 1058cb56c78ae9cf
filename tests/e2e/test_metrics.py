"""Metrics and refused duplicates: counted where they happen, through a real proxy, and kept without secrets."""

import re
import time
from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from support.proxy import start_inprocess_proxy
from support.store import intent, recorded, walk
from support.upstream import start_upstream

from proxy_addon import metrics
from proxy_addon.admin.app import create_app
from proxy_addon.config import parse_config
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import RefusalReason, State
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate

SECRET = "Bearer agent-secret-4f1c"


def samples(store: ReceiptStore | None = None) -> dict[tuple[str, tuple], float]:
    body, _ = metrics.exposition(metrics.registry_for(store.retention.stats if store else None))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def wait_for(predicate, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail("condition not met within the time limit")


def test_record_and_list_refusals(store):
    blocker = recorded(store, intent())
    for reason in (RefusalReason.DUPLICATE_OPEN, RefusalReason.IDEMPOTENCY_KEY_MISMATCH):
        store.refusals.record(reason, blocker.operation_id, intent(blocker.intent_fingerprint, blocker.account))
    rows = store.refusals.list()
    assert [r.reason for r in rows] == ["idempotency_key_mismatch", "duplicate_open"]  # newest first
    assert rows[0].refused_at.tzinfo is not None and abs((utcnow() - rows[0].refused_at).total_seconds()) < 30
    assert [r.reason for r in store.refusals.list(reason="duplicate_open")] == ["duplicate_open"]
    assert store.refusals.list(since=utcnow() + timedelta(minutes=1)) == []
    assert len(store.refusals.list(blocking_operation_id=blocker.operation_id)) == 2
    with pytest.raises(ValueError):
        store.refusals.record("because", blocker.operation_id, intent("f", "a", host="h", path="/"))


def test_the_store_collector_reads_the_database_at_scrape_time(store):
    before = samples(store)
    assert before[("receipts_by_state", (("state", "outcome_unknown"),))] == 0
    assert before[("receipts_oldest_open_age_seconds", ())] == 0
    rec = recorded(store, intent())
    walk(store, rec.operation_id, State.OUTCOME_UNKNOWN)
    after = samples(store)
    assert after[("receipts_by_state", (("state", "outcome_unknown"),))] == 1
    assert after[("receipts_store_up", ())] == 1
    key = ("receipts_transitions_total", (("to_state", "outcome_unknown"),))
    assert after[key] == before[key] + 1  # counted by the store where it committed
    with store.engine.begin() as conn:  # the store cannot answer: the scrape still works, and says so
        conn.execute(text("DROP TABLE receipt_transitions"))
        conn.execute(text("DROP TABLE receipts" + (" CASCADE" if store.db.dialect == "postgresql" else "")))
    down = samples(store)
    assert down[("receipts_store_up", ())] == 0 and ("receipts_by_state", (("state", "outcome_unknown"),)) not in down
    assert down[key] == after[key]  # this process's counters are still served


@pytest.fixture
def running_proxy(sqlite_url, tmp_path):
    migrate(sqlite_url)
    upstream = start_upstream()
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    proxy = start_inprocess_proxy(config, sqlite_url, tmp_path / "confdir")
    try:
        with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as client:
            yield proxy, upstream, client
    finally:
        proxy.stop()
        upstream.stop()


def test_a_refused_duplicate_is_counted_and_recorded_without_secrets(running_proxy, sqlite_url, tmp_path):
    proxy, upstream, client = running_proxy
    store = proxy.addon.store
    before = samples()
    url = f"{upstream.base}/status/503/charge"
    body = {"amount": 10, "password": "hunter2"}
    headers = {"Authorization": SECRET, "Cookie": "session=cookie-secret"}
    first = client.post(url, json=body, headers=headers)
    assert first.status_code == 504
    op = first.headers["X-Receipt-Id"]
    again = client.post(url, json=body, headers=headers)
    assert again.status_code == 409 and again.headers["X-Receipt-Id"] == op

    refusal = wait_for(lambda: store.refusals.list(blocking_operation_id=op))[0]
    receipt = store.receipts.get(op)
    assert refusal.reason == "duplicate_open" and refusal.host == "127.0.0.1" and refusal.path == "/status/503/charge"
    assert (refusal.account, refusal.intent_fingerprint) == (receipt.account, receipt.intent_fingerprint)
    assert refusal.proxy_instance == proxy.addon.instance_id
    with store.engine.connect() as conn:
        row = " ".join(map(str, conn.execute(text("SELECT * FROM duplicate_refusals")).one()))
    for secret in ("agent-secret", "cookie-secret", "hunter2"):
        assert secret not in row

    after = samples(store)
    assert after[("receipts_duplicates_total", (("reason", "duplicate_open"),))] == \
        before[("receipts_duplicates_total", (("reason", "duplicate_open"),))] + 1
    assert after[("receipts_journal_seconds_count", ())] == before[("receipts_journal_seconds_count", ())] + 1
    assert after[("receipts_journal_seconds_sum", ())] > before[("receipts_journal_seconds_sum", ())]
    for state in ("planned", "submitted", "outcome_unknown"):
        key = ("receipts_transitions_total", (("to_state", state),))
        assert after[key] == before[key] + 1, state
    assert after[("receipts_by_state", (("state", "outcome_unknown"),))] == 1

    proof = create_app(parse_config(f"secret_file: {tmp_path / 's'}"), store).test_client().get(f"/receipts/{op}/proof")
    assert proof.get_json()["duplicates_refused"] == 1 and proof.get_json()["retry"]["decision"] == "refused"


def test_a_refusal_that_cannot_be_written_still_refuses(running_proxy):
    proxy, upstream, client = running_proxy
    store = proxy.addon.store
    path = f"/status/503/{time.monotonic_ns()}"
    url = upstream.base + path
    assert client.post(url, json={"n": 1}).status_code == 504
    with store.engine.begin() as conn:
        conn.execute(text("DROP VIEW v_duplicates_refused"))
        conn.execute(text("DROP TABLE duplicate_refusals"))
    for _ in range(3):
        r = client.post(url, json={"n": 1})
        assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json"
    assert upstream.count("POST", path) == 1
    assert re.match(r"op_[0-9a-f]{32}$", r.headers["X-Receipt-Id"])
