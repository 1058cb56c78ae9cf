"""The journaling proxy end to end: a real mitmproxy with the addon, real upstreams on 127.0.0.1, a real
httpx client through the proxy, and receipts in a real SQLite file and a real PostgreSQL database.

One proxy per database serves the whole module (its config gives each policy its own upstream port);
tests keep apart by sending bodies and paths no other test sends.
"""

import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.e2e import (
    PROBLEM_JSON,
    failing_receipt_writes,
    open_store,
    pg_rows_as_text,
    proxy_client,
    receipts_for,
    received,
    settled,
    settled_history,
    stop_process,
    tag,
    wait_for,
)
from support.e2e import migrate as migrate_url
from support.proxy import RunningProxy, start_inprocess_proxy, start_proxy_process
from support.server import free_port
from support.upstream import Upstream, start_upstream

from proxy_addon.journal.messages import Record
from proxy_addon.store import ReceiptStore

OUTCOME_UNKNOWN_TYPE = "outcome-unknown"
UPSTREAM_NAMES = ("main", "fast_timeout", "odd_statuses", "refuse", "allow", "inject")


@dataclass
class Env:
    proxy: RunningProxy
    store: ReceiptStore
    url: str
    ups: dict[str, Upstream]
    client: httpx.Client
    config: Path

    def at(self, name: str, path: str) -> str:
        return self.ups[name].base + path


@pytest.fixture(scope="module")
def upstreams():
    ups = {name: start_upstream() for name in UPSTREAM_NAMES}
    ups["idle_closing"] = start_upstream(idle_timeout=0.3)
    try:
        yield ups
    finally:
        for up in ups.values():
            up.stop()


def module_config(tmp: Path, ups: dict[str, Upstream]) -> Path:
    def entry(name: str, body: str) -> str:
        return f'  "127.0.0.1:{ups[name].port}": {body}\n'

    path = tmp / "config.yaml"
    path.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "defaults:\n"
        "  upstream_timeout: 10s\n"
        "  connect_timeout: 3s\n"
        "  redact_headers: [X-Custom-Token]\n"
        "hosts:\n"
        '  "127.0.0.1":\n'
        "    operations:\n"
        "      - {name: things.create, method: POST, path: /things, external_id: $.id}\n"
        '      - {name: location.create, method: POST, path: /location, external_id: "header:Location"}\n'
        + entry("fast_timeout", "{upstream_timeout: 1s}")
        + entry("odd_statuses", "{unknown_statuses: [599]}")
        + entry("refuse", "{after_success: {policy: refuse, window: 15m}}")
        + entry("allow", "{after_success: {policy: allow, window: 15m}}")
        + entry("inject", "{inject_idempotency_key: true}")
    )
    return path


@pytest.fixture(scope="module")
def env(module_db_url, upstreams, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy")
    config = module_config(tmp, upstreams)
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield Env(proxy, store, module_db_url, upstreams, client, config)
    finally:
        proxy.stop()


def problem(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    document = response.json()
    assert document["type"].endswith(kind), document
    return document


def history(store: ReceiptStore, operation_id: str) -> list[tuple[str | None, str]]:
    return [(t.from_state, t.to_state) for t in settled_history(store, operation_id)]


# -- what the upstream said -------------------------------------------------------------------------------


def test_2xx_passes_through_and_the_receipt_succeeds(env: Env):
    path = f"/ok/{tag()}"
    r = env.client.post(env.at("main", path), json={"title": path})
    assert r.status_code == 201
    assert r.json()["echo"] == {"title": path}
    op = r.headers["X-Receipt-Id"]
    assert op.startswith("op_")
    assert r.headers["X-Receipt-State"] == "succeeded"
    receipt = settled(env.store, op)
    assert (receipt.state, receipt.status_code, receipt.method, receipt.path) == ("succeeded", 201, "POST", path)
    assert receipt.authentication_recorded is False
    assert receipt.submitted_at is not None and receipt.completed_at is not None
    assert history(env.store, op) == [(None, "planned"), ("planned", "submitted"), ("submitted", "succeeded")]
    assert env.ups["main"].count("POST", path) == 1


def test_put_patch_delete_are_journaled_too(env: Env):
    path = f"/item/{tag()}"
    for method in ("PUT", "PATCH", "DELETE"):
        r = env.client.request(method, env.at("main", path), json={"method": method})
        assert r.status_code == 200, (method, r.text)
        receipt = settled(env.store, r.headers["X-Receipt-Id"])
        assert (receipt.method, receipt.state, receipt.status_code) == (method, "succeeded", 200)
        assert env.ups["main"].count(method, path) == 1
    assert len(receipts_for(env.store, path)) == 3


def test_external_id_from_a_json_path_rule(env: Env):
    r = env.client.post(env.at("main", "/things"), json={"title": tag()})
    assert r.status_code == 201
    receipt = settled(env.store, r.headers["X-Receipt-Id"])
    assert receipt.operation == "things.create"
    assert receipt.external_id == str(r.json()["id"])


def test_external_id_from_the_location_header(env: Env):
    r = env.client.post(env.at("main", "/location"), json={"title": tag()})
    assert r.status_code == 201
    receipt = settled(env.store, r.headers["X-Receipt-Id"])
    assert receipt.operation == "location.create"
    assert receipt.external_id == r.headers["Location"]
    assert receipt.external_id.startswith("/things/")


def test_4xx_passes_through_and_the_receipt_is_rejected(env: Env):
    path = f"/status/422/{tag()}"
    r = env.client.post(env.at("main", path), json={"x": 1})
    assert r.status_code == 422
    assert r.json() == {"error": "status 422"}  # the upstream's own answer
    assert r.headers["X-Receipt-State"] == "rejected"
    receipt = settled(env.store, r.headers["X-Receipt-Id"])
    assert (receipt.state, receipt.status_code) == ("rejected", 422)


def test_503_is_outcome_unknown(env: Env):
    path = f"/status/503/{tag()}"
    r = env.client.post(env.at("main", path), json={"x": 1})
    doc = problem(r, 504, OUTCOME_UNKNOWN_TYPE)
    op = r.headers["X-Receipt-Id"]
    assert doc["operation_id"] == op
    assert doc["state"] == "outcome_unknown"
    assert doc["upstream_status"] == 503
    assert "retry" in doc["detail"].lower()
    assert r.headers["X-Receipt-State"] == "outcome_unknown"
    receipt = settled(env.store, op)
    assert (receipt.state, receipt.status_code) == ("outcome_unknown", 503)


def test_host_unknown_statuses_override_the_defaults(env: Env):
    """The host says only 599 is ambiguous: its 503 is an ordinary rejection, its 599 outcome unknown."""
    r = env.client.post(env.at("odd_statuses", f"/status/503/{tag()}"), json={"x": 1})
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/json"
    receipt = settled(env.store, r.headers["X-Receipt-Id"])
    assert (receipt.state, receipt.status_code) == ("rejected", 503)

    r = env.client.post(env.at("odd_statuses", f"/status/599/{tag()}"), json={"x": 1})
    doc = problem(r, 504, OUTCOME_UNKNOWN_TYPE)
    assert doc["upstream_status"] == 599
    assert settled(env.store, doc["operation_id"]).state == "outcome_unknown"


def test_read_timeout_answers_outcome_unknown_before_the_upstream_finishes(env: Env):
    path = f"/held/{tag()}"  # the upstream answers only when the test releases it: any answer before is the proxy's
    started = time.monotonic()
    try:
        r = env.client.post(env.at("fast_timeout", path), json={"x": 1})
    finally:
        env.ups["fast_timeout"].release(path)
    elapsed = time.monotonic() - started
    doc = problem(r, 504, OUTCOME_UNKNOWN_TYPE)
    assert elapsed >= 0.9, f"answered after {elapsed:.2f}s; upstream_timeout is 1s"
    assert "upstream_status" not in doc
    receipt = settled(env.store, doc["operation_id"])
    assert (receipt.state, receipt.error_code, receipt.status_code) == ("outcome_unknown", "upstream_timeout", None)
    assert env.ups["fast_timeout"].count("POST", path) == 1


def test_reset_after_the_request_was_read_is_outcome_unknown(env: Env):
    path = f"/reset/{tag()}"
    r = env.client.post(env.at("main", path), json={"x": 1})
    doc = problem(r, 504, OUTCOME_UNKNOWN_TYPE)
    assert doc["state"] == "outcome_unknown"
    receipt = settled(env.store, doc["operation_id"])
    assert (receipt.state, receipt.error_code) == ("outcome_unknown", "upstream_reset")
    assert env.ups["main"].count("POST", path) == 1


def test_connection_refused_is_not_sent_and_a_retry_is_forwarded(env: Env):
    port = free_port()  # nothing listens here yet
    url = f"http://127.0.0.1:{port}/refused/{tag()}"
    body = {"title": "refused"}
    r = env.client.post(url, json=body)
    doc = problem(r, 502, "not-sent")
    first = settled(env.store, r.headers["X-Receipt-Id"])
    assert doc["operation_id"] == first.operation_id
    assert (first.state, first.error_code) == ("rejected", "not_sent")

    late = start_upstream(port=port)  # the upstream comes up; the agent retries the very same request
    try:
        r = env.client.post(url, json=body)
        assert r.status_code == 201, r.text
        assert r.headers["X-Receipt-State"] == "succeeded"
        second = settled(env.store, r.headers["X-Receipt-Id"])
        assert second.operation_id != first.operation_id
        assert second.intent_fingerprint == first.intent_fingerprint
        assert late.count("POST") == 1
    finally:
        late.stop()


# -- duplicates ---------------------------------------------------------------------------------------------


def test_duplicate_of_an_open_receipt_is_refused(env: Env):
    path = f"/status/503/{tag()}"
    body = {"amount": 10}
    first = problem(env.client.post(env.at("main", path), json=body), 504, OUTCOME_UNKNOWN_TYPE)
    r = env.client.post(env.at("main", path), json=body)
    doc = problem(r, 409, "duplicate-open")
    assert doc["operation_id"] == first["operation_id"]
    assert doc["state"] == "outcome_unknown"
    assert r.headers["X-Receipt-Id"] == first["operation_id"]
    assert env.ups["main"].count("POST", path) == 1
    assert len(receipts_for(env.store, path)) == 1


def burst(env: Env, proxy_urls: list[str], headers: dict[str, str] | None = None, n: int = 20) -> None:
    """n identical POSTs released at once by a barrier, spread over the proxies: the upstream sees one."""
    path = f"/held/{tag()}"
    url = env.at("main", path)  # held by the upstream until every other answer is in: no race with a clock
    barrier = threading.Barrier(n)
    answers: list[httpx.Response | BaseException] = [None] * n  # type: ignore[list-item]
    clients = [proxy_client(proxy_urls[i % len(proxy_urls)]) for i in range(n)]

    def send(i: int) -> None:
        try:
            barrier.wait(10)
            answers[i] = clients[i].post(url, json={"burst": path}, headers=headers)
        except BaseException as e:  # reported by the assertions below
            answers[i] = e

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: sum(a is not None for a in answers) >= n - 1, 30, 0.05)  # a forwarded second one would stay held
        env.ups["main"].release(path)
        for t in threads:
            t.join(30)
    finally:
        env.ups["main"].release(path)
        for c in clients:
            c.close()
    assert not any(t.is_alive() for t in threads)
    errors = [a for a in answers if not isinstance(a, httpx.Response)]
    assert not errors, errors
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {201: 1, 409: n - 1}, statuses
    winner = next(a for a in answers if a.status_code == 201).headers["X-Receipt-Id"]
    for a in answers:
        if a.status_code == 409:
            assert problem(a, 409, "duplicate-open")["operation_id"] == winner
    assert env.ups["main"].count("POST", path) == 1
    assert [r.operation_id for r in receipts_for(env.store, path)] == [winner]


def test_concurrent_identical_burst_reaches_the_upstream_once(env: Env):
    burst(env, [env.proxy.url])


def test_two_proxies_sharing_the_database_forward_an_open_intent_once(env: Env, tmp_path):
    # the second proxy runs the same config file (and secret), so it hashes the agent's account alike
    proc, port = start_proxy_process(env.config, env.url, tmp_path / "confdir", tmp_path / "second.log")
    try:
        burst(env, [env.proxy.url, f"http://127.0.0.1:{port}"], headers={"Authorization": "Bearer shared-agent"})
    finally:
        stop_process(proc)


def test_the_same_body_from_another_account_is_another_intent(env: Env):
    path = f"/ok/{tag()}"
    a = env.client.post(env.at("main", path), json={"x": 1}, headers={"Authorization": "Bearer agent-a"})
    b = env.client.post(env.at("main", path), json={"x": 1}, headers={"Authorization": "Bearer agent-b"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert "X-Receipt-Replayed" not in b.headers
    ra, rb = settled(env.store, a.headers["X-Receipt-Id"]), settled(env.store, b.headers["X-Receipt-Id"])
    assert ra.intent_fingerprint == rb.intent_fingerprint
    assert ra.account != rb.account
    assert env.ups["main"].count("POST", path) == 2


def test_an_answer_stored_redacted_is_refused_not_replayed(env: Env):
    """The upstream's answer holds a secret field (`token`): the database keeps it redacted, so it is not the
    answer as delivered, and a repeat gets 409 duplicate-succeeded naming the original, never altered bytes."""
    body = {"title": tag()}
    before = env.ups["main"].count("POST", "/things")
    first = env.client.post(env.at("main", "/things"), json=body)
    assert first.status_code == 201 and first.json()["token"] == "resp-secret-token"
    receipt = settled(env.store, first.headers["X-Receipt-Id"])
    assert receipt.response_body_redacted is True
    assert json.loads(receipt.response_body)["token"] == "[REDACTED]"
    again = env.client.post(env.at("main", "/things"), json=body)
    doc = problem(again, 409, "duplicate-succeeded")
    assert (doc["operation_id"], doc["upstream_status"], doc["external_id"]) == (receipt.operation_id, 201, receipt.external_id)
    assert again.headers["X-Receipt-Id"] == receipt.operation_id
    assert "X-Receipt-Replayed" not in again.headers
    assert env.ups["main"].count("POST", "/things") == before + 1


def test_a_success_settled_by_a_person_is_refused_not_replayed(env: Env):
    """Resolved succeeded after an unknown end, the receipt holds no upstream answer to replay: the retry
    is refused (409 duplicate-succeeded), never answered with the 503 that once made it unknown."""
    path = f"/status/503?settled={tag()}"
    first = env.client.post(env.at("main", path), json={"settle": path})
    operation_id = problem(first, 504, OUTCOME_UNKNOWN_TYPE)["operation_id"]
    settled(env.store, operation_id)
    env.store.receipts.transition(operation_id, "outcome_unknown", "succeeded", {"who": "person:test", "note": "seen"})
    again = env.client.post(env.at("main", path), json={"settle": path})
    problem(again, 409, "duplicate-succeeded")
    assert "X-Receipt-Replayed" not in again.headers
    assert sum(1 for r in env.ups["main"].received if r.path == path) == 1  # the retry was not forwarded


def test_after_success_policy_refuse(env: Env):
    path = f"/ok/{tag()}"
    first = env.client.post(env.at("refuse", path), json={"x": 1})
    assert first.status_code == 201
    r = env.client.post(env.at("refuse", path), json={"x": 1})
    doc = problem(r, 409, "duplicate-succeeded")
    assert doc["operation_id"] == first.headers["X-Receipt-Id"]
    assert env.ups["refuse"].count("POST", path) == 1


def test_after_success_policy_allow(env: Env):
    path = f"/ok/{tag()}"
    first = env.client.post(env.at("allow", path), json={"x": 1})
    again = env.client.post(env.at("allow", path), json={"x": 1})
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["X-Receipt-Id"] != first.headers["X-Receipt-Id"]
    assert "X-Receipt-Replayed" not in again.headers
    assert env.ups["allow"].count("POST", path) == 2
    assert {r.state for r in receipts_for(env.store, path)} == {"succeeded"}
    assert len(receipts_for(env.store, path)) == 2


def test_same_idempotency_key_with_a_different_body_is_422(env: Env):
    path = f"/ok/{tag()}"
    key = f"key-{tag()}"
    first = env.client.post(env.at("main", path), json={"v": 1}, headers={"Idempotency-Key": key})
    assert first.status_code == 201
    assert settled(env.store, first.headers["X-Receipt-Id"]).idempotency_key == key
    r = env.client.post(env.at("main", path), json={"v": 2}, headers={"Idempotency-Key": key})
    doc = problem(r, 422, "idempotency-key-mismatch")
    assert doc["operation_id"] == first.headers["X-Receipt-Id"]
    assert env.ups["main"].count("POST", path) == 1
    assert len(receipts_for(env.store, path)) == 1


def test_inject_idempotency_key_sends_the_operation_id(env: Env):
    path = f"/ok/{tag()}"
    r = env.client.post(env.at("inject", path), json={"x": 1})
    assert r.status_code == 201
    op = r.headers["X-Receipt-Id"]
    [seen] = received(env.ups["inject"], path)
    assert seen.headers.get("idempotency-key") == op
    assert settled(env.store, op).idempotency_key == op


def test_reads_pass_through_untouched(env: Env):
    path = f"/read/{tag()}"
    for method in ("GET", "HEAD", "OPTIONS"):
        r = env.client.request(method, env.at("main", path))
        assert "X-Receipt-Id" not in r.headers, method
        assert "X-Receipt-State" not in r.headers, method
    r = env.client.get(env.at("main", path))
    assert r.status_code == 200
    assert r.json()["token"] == "resp-secret-token"  # the upstream's answer, unredacted: nothing was journaled
    assert env.ups["main"].count("GET", path) == 2
    assert receipts_for(env.store, path) == []


def test_upstream_closing_idle_keepalive_connections_is_no_false_outcome_unknown(env: Env):
    up = env.ups["idle_closing"]
    first = env.client.post(up.base + f"/ok/{tag()}", json={"n": 1})
    assert first.status_code == 201
    time.sleep(1.0)  # the upstream closes its side of the idle connection after 0.3 s
    second = env.client.post(up.base + f"/ok/{tag()}", json={"n": 2})
    assert second.status_code == 201, second.text
    assert second.headers["X-Receipt-State"] == "succeeded"
    assert settled(env.store, second.headers["X-Receipt-Id"]).state == "succeeded"


# -- the journal cannot be written ---------------------------------------------------------------------------


def test_journal_unavailable_fails_closed(env: Env):
    path = f"/journal-down/{tag()}"
    with failing_receipt_writes(env.url, "INSERT"):
        r = env.client.post(env.at("main", path), json={"x": 1})
        problem(r, 503, "journal-unavailable")
        assert "X-Receipt-Id" not in r.headers
        assert env.ups["main"].count("POST", path) == 0  # nothing forwarded without a receipt
    r = env.client.post(env.at("main", path), json={"x": 1})  # the journal is back: the retry goes through
    assert r.status_code == 201, r.text
    assert env.ups["main"].count("POST", path) == 1


def test_a_journal_writer_killed_while_it_holds_a_write_fails_it_closed_and_is_restarted(env: Env):
    """The journal writer process dies (SIGKILL) with a write in its hands: that write is answered 503 and
    never sent; the next one starts a new writer and goes through, and the retry is not refused."""
    path = f"/writer-killed/{tag()}"
    journal = env.proxy.addon.journal
    assert env.client.post(env.at("main", f"{path}/warm"), json={"x": 0}).status_code == 201  # the writer runs
    pid = journal._link.process.pid
    os.kill(pid, signal.SIGSTOP)
    answers: list[httpx.Response] = []
    try:
        sending = threading.Thread(target=lambda: answers.append(env.client.post(env.at("main", path), json={"x": 1})))
        sending.start()
        # its receipt, not the warm-up's verdict (committed after its answer, so perhaps still held)
        held = wait_for(lambda: any(isinstance(h.request, Record) for h in journal._pending.values()), timeout=15)
        assert held, "the write never reached the writer"
    finally:
        os.kill(pid, signal.SIGKILL)
    sending.join(timeout=30)
    problem(answers[0], 503, "journal-unavailable")
    assert "journal writer stopped (killed by SIGKILL)" in answers[0].json()["detail"]
    assert env.ups["main"].count("POST", path) == 0 and receipts_for(env.store, path) == []
    r = env.client.post(env.at("main", path), json={"x": 1})
    assert r.status_code == 201, r.text
    assert env.ups["main"].count("POST", path) == 1 and journal._link.process.pid != pid


def test_a_verdict_that_cannot_be_written_yet_is_handed_over_again_until_it_is(env: Env):
    """The upstream answered but the journal refuses the verdict for a while: it is handed over again (not tried
    once and left to the orphan sweep, which would make it outcome_unknown against the agent's 201), its receipt
    open meanwhile (a retry is refused, nothing forwarded); once the journal takes it, the receipt is `succeeded`,
    as the agent was told."""
    path = f"/verdict-fails/{tag()}"
    with failing_receipt_writes(env.url, "UPDATE", "NEW.state = 'succeeded'"):
        r = env.client.post(env.at("main", path), json={"x": 1})
        assert r.status_code == 201 and r.headers["X-Receipt-State"] == "succeeded"  # the verdict it cannot write yet
        problem(env.client.post(env.at("main", path), json={"x": 1}), 409, "duplicate-open")
        assert env.store.receipts.get(r.headers["X-Receipt-Id"]).state == "submitted"
    told = settled(env.store, r.headers["X-Receipt-Id"])
    assert (told.state, told.status_code) == ("succeeded", 201), told
    assert env.ups["main"].count("POST", path) == 1


# -- secrets ------------------------------------------------------------------------------------------------


def test_secrets_reach_neither_the_database_nor_the_log(db_url, upstreams, tmp_path):
    migrate_url(db_url)
    up = upstreams["main"]
    names = ("bearer", "cookie", "apikey", "custom", "proxyauth", "query", "pw", "tok", "deep")
    s = {name: f"{name}-{tag()}" for name in names}
    config = tmp_path / "config.yaml"
    config.write_text(
        f"secret_file: {tmp_path / 'secret'}\n"
        "defaults:\n  redact_headers: [X-Custom-Token]\n"
        "hosts:\n"
        '  "127.0.0.1":\n'
        "    operations:\n"
        "      - {name: things.create, method: POST, path: /things, external_id: $.id}\n"
    )
    log_path = tmp_path / "proxy.log"
    proc, port = start_proxy_process(config, db_url, tmp_path / "confdir", log_path)
    title = f"title-{tag()}"
    headers = {
        "Authorization": f"Bearer {s['bearer']}",
        "Cookie": f"session={s['cookie']}",
        "X-Api-Key": s["apikey"],
        "X-Custom-Token": s["custom"],
        "Proxy-Authorization": f"Basic {s['proxyauth']}",
    }
    body = {
        "title": title,
        "password": s["pw"],
        "nested": {"list": [{"token": s["tok"]}], "deeper": {"again": {"password": s["deep"]}}},
    }
    ops = []
    try:
        with proxy_client(f"http://127.0.0.1:{port}") as client:
            paths = ("/things", f"/status/503/{tag()}", f"/status/400/{tag()}", f"/q/{tag()}?api_key={s['query']}", "/things")
            for path in paths:
                r = client.post(up.base + path, json=body, headers=headers)
                assert "X-Receipt-Id" in r.headers, r.text
                ops.append(r.headers["X-Receipt-Id"])
            assert r.status_code == 409 and r.json()["operation_id"] == ops[0]  # the first, not replayed: its answer had a secret
            refused = client.post(f"http://127.0.0.1:{free_port()}/x", json=body, headers=headers)
            assert refused.status_code == 502
            ops.append(refused.headers["X-Receipt-Id"])
    finally:
        stop_process(proc)
    assert proc.returncode == 0, "receipts proxy should stop cleanly on SIGTERM"

    with open_store(db_url) as store:
        first = settled(store, ops[0])
        assert first.request_headers["authorization"] == "[REDACTED]"
        assert first.account.startswith("acct:")
        assert settled(store, ops[3]).query == "api_key=%5BREDACTED%5D"
    [forwarded] = received(up, paths[3].split("?")[0])
    assert forwarded.headers["authorization"] == f"Bearer {s['bearer']}"  # the upstream still gets its credentials
    assert "proxy-authorization" not in forwarded.headers  # hop-by-hop: meant for the proxy only
    if db_url.startswith("sqlite"):
        db_file = Path(db_url.removeprefix("sqlite:///"))
        stored = b"".join(p.read_bytes() for p in (db_file, Path(f"{db_file}-wal")) if p.exists())
    else:
        stored = pg_rows_as_text(db_url).encode()
    log_text = log_path.read_bytes()
    assert title.encode() in stored, "the stored body should be in what we read (wrong file?)"
    assert ops[0].encode() in log_text, "the proxy's structlog lines should be in the log file"
    secrets = [*s.values(), "resp-secret-token", "upstream-cookie-secret"]
    for value in secrets:
        assert value.encode() not in stored, f"{value} written to the database"
        assert value.encode() not in log_text, f"{value} written to the log"
    for line in log_text.decode().splitlines():
        if line.startswith("{"):
            json.loads(line)  # every structlog line is one JSON document
