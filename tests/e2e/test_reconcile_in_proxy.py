"""`reconcile.in_proxy: true`: the proxy process runs the reconciliation worker itself."""

import time

import httpx
from conftest import migrate
from support.proxy import start_inprocess_proxy
from support.upstream import start_upstream

from proxy_addon.db import make_engine
from proxy_addon.store import ReceiptStore


def test_the_proxy_reconciles_its_unknowns_when_asked_to(sqlite_url, tmp_path):
    migrate(sqlite_url)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"secret_file: {tmp_path / 'secret'}\n"
        "reconcile: {in_proxy: true, interval: 200ms}\n"
    )
    upstream = start_upstream()
    proxy = start_inprocess_proxy(config, sqlite_url, tmp_path / "confdir")
    engine = make_engine(sqlite_url)
    try:
        with httpx.Client(proxy=proxy.url, timeout=10) as client:
            answer = client.post(upstream.base + "/status/503", json={"unruled": True})
        assert answer.status_code == 504
        operation_id = answer.json()["operation_id"]
        store = ReceiptStore(engine)
        deadline = time.monotonic() + 15
        while store.receipts.get(operation_id).state != "manual_review" and time.monotonic() < deadline:
            time.sleep(0.1)
        receipt = store.receipts.get(operation_id)
        assert receipt.state == "manual_review"
        steps = [(t.from_state, t.to_state) for t in store.receipts.history(operation_id)]
        assert steps[-2:] == [("outcome_unknown", "reconciling"), ("reconciling", "manual_review")]
        assert "no reconcile rule" in store.receipts.history(operation_id)[-1].detail["reason"]
        assert store.receipts.history(operation_id)[-1].detail["who"].endswith("-reconcile")
    finally:
        engine.dispose()
        proxy.stop()
        upstream.stop()
