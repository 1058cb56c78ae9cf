"""Approvals across replicas and restarts, on one PostgreSQL: an in-process proxy and a `receipts proxy` process
share the database. Two replicas asking at once share one pending approval; after it is approved, a burst of the
same request to both replicas at the same moment (agents behind a barrier) is forwarded exactly once: the
approval is used up with that one receipt's creation, and every other agent is answered from that receipt. A
pending approval outlives a restart of the proxy that asked for it.

Nothing sleeps: the agents start together on a barrier; the process proxy is waited for by its port."""

import threading
from pathlib import Path

import httpx
import pytest
from support.e2e import open_store, proxy_client, stop_process, tag
from support.pg import fresh_database
from support.proxy import start_inprocess_proxy, start_proxy_process
from support.upstream import start_upstream

from tests.conftest import migrate

PER_PROXY = 4


@pytest.fixture(scope="module")
def replicas(pg_server, tmp_path_factory):
    """Two replicas on one PostgreSQL for the whole module: the in-process proxy (`replicas["inprocess"]`, which
    a test may replace) and a `receipts proxy` process."""
    tmp_path = tmp_path_factory.mktemp("approval_replicas")
    with fresh_database(pg_server, prefix="receipts_appr") as pg_url:
        migrate(pg_url)
        up = start_upstream()
        config = tmp_path / "config.yaml"
        config.write_text(f"secret_file: {tmp_path / 'secret'}\nhosts:\n  \"127.0.0.1:{up.port}\": {{approval: required}}\n")
        proc, port = start_proxy_process(config, pg_url, tmp_path / "confdir", tmp_path / "proxy.log")
        env = {"up": up, "tmp": tmp_path, "config": config, "db": pg_url,
               "inprocess": start_inprocess_proxy(config, pg_url, tmp_path / "confdir")}
        env["urls"] = [env["inprocess"].url, f"http://127.0.0.1:{port}"]
        try:
            with open_store(pg_url) as store:
                env["store"] = store
                yield env
        finally:
            env["inprocess"].stop()
            stop_process(proc)
            up.stop()


def burst(proxies: list[str], url: str, body: dict, per_proxy: int) -> list[httpx.Response]:
    """`per_proxy` agents on each proxy send the same request at the same moment."""
    agents = [p for p in proxies for _ in range(per_proxy)]
    barrier, answers = threading.Barrier(len(agents)), [None] * len(agents)
    clients = [proxy_client(p) for p in agents]

    def agent(i: int) -> None:
        barrier.wait(10)
        answers[i] = clients[i].post(url, json=body, headers={"Authorization": "Bearer agent"})

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in clients:
        c.close()
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


def test_after_approval_a_burst_to_both_replicas_is_forwarded_once(replicas):
    url, body = f"{replicas['up'].base}/payouts", {"payout": tag()}
    asked = burst(replicas["urls"], url, body, 2)  # both replicas ask at once: one pending approval between them
    assert {a.status_code for a in asked} == {403}
    assert len({a.json()["approval_id"] for a in asked}) == 1
    approval_id = asked[0].json()["approval_id"]
    assert replicas["store"].approvals.get(approval_id).asked == 4
    replicas["store"].approvals.decide(approval_id, "approve", "payout checked", "alice")

    answers = burst(replicas["urls"], url, body, PER_PROXY)
    assert replicas["up"].count("POST", "/payouts") == 1  # executed once
    forwarded = [a for a in answers if a.status_code == 201 and a.headers.get("x-receipt-replayed") != "true"]
    assert len(forwarded) == 1, [(a.status_code, a.text) for a in answers]
    operation_id = forwarded[0].headers["x-receipt-id"]
    others = [a for a in answers if a is not forwarded[0]]
    assert all(a.status_code == 409 or a.headers.get("x-receipt-replayed") == "true" for a in others), [(a.status_code, a.text[:200]) for a in others if a.status_code != 409]
    assert {a.headers["x-receipt-id"] for a in answers} == {operation_id}  # every answer names the one receipt
    used = replicas["store"].approvals.get(approval_id)
    assert (used.state, used.operation_id) == ("used", operation_id)


def test_a_pending_approval_outlives_a_restart_of_the_proxy_that_asked(replicas):
    url, body = f"{replicas['up'].base}/refunds", {"refund": tag()}
    with proxy_client(replicas["inprocess"].url) as agent:
        asked = agent.post(url, json=body)
    assert asked.status_code == 403
    approval_id = asked.json()["approval_id"]
    replicas["inprocess"].stop()  # the proxy that asked is gone; the approval is in the database
    replicas["store"].approvals.decide(approval_id, "approve", "ok", "alice")
    tmp: Path = replicas["tmp"]
    replicas["inprocess"] = restarted = start_inprocess_proxy(replicas["config"], replicas["db"], tmp / "confdir")
    with proxy_client(restarted.url) as agent:
        forwarded = agent.post(url, json=body)
    assert forwarded.status_code == 201 and replicas["up"].count("POST", "/refunds") == 1
    assert replicas["store"].approvals.get(approval_id).operation_id == forwarded.headers["x-receipt-id"]
