"""`in_flight: {policy: wait}` end to end (issue 18): a repeat of a write still in flight waits for the original's
verdict, on this proxy or another replica, and gets what a repeat after that verdict gets. Real proxies (one
in-process, one `receipts proxy` process), an upstream that holds its answer until the test releases it
(support/answering.py), httpx clients, receipts on SQLite and PostgreSQL.

Nothing here sleeps to wait for an event: the tests wait for the upstream to have the request, and poll (bounded)
for the proxy's count of waiting requests.
"""

import asyncio
import threading
import time

import httpx
import pytest
from support.answering import AnsweringUpstream
from support.e2e import open_store, proxy_client, stop_process, tag, wait_for
from support.proxy import start_inprocess_proxy, start_proxy_process

JOURNAL_THREADS = 4
REPEATS = 20


@pytest.fixture(scope="module")
def ups():
    started = {"wait": AnsweringUpstream().start(), "short": AnsweringUpstream().start()}
    try:
        yield started
    finally:
        for up in started.values():
            up.stop()


@pytest.fixture(scope="module")
def env(module_db_url, ups, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("in_flight")
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        f"proxy: {{database_threads: {JOURNAL_THREADS}}}\n"
        "defaults: {upstream_timeout: 20s}\n"
        "hosts:\n"
        f'  "127.0.0.1:{ups["wait"].port}": {{in_flight: {{policy: wait, max_wait: 20s}}}}\n'
        f'  "127.0.0.1:{ups["short"].port}": {{in_flight: {{policy: wait, max_wait: 500ms}}}}\n'
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store:
            yield {"proxy": proxy, "store": store, "config": config, "url": module_db_url, "tmp": tmp}
    finally:
        proxy.stop()


def waiting(env) -> int:
    return env["proxy"].addon.handler.waiters.waiting


def threads() -> int:
    """Threads in this process (the in-process proxy's among them), less the test's own asyncio helpers."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("asyncio_"))


class Original:
    """The first request, sent on a thread of its own through `proxy_url`; it stays in flight until released."""

    def __init__(self, proxy_url: str, url: str, body: dict):
        self.response: httpx.Response | None = None
        self.thread = threading.Thread(target=self._send, args=(proxy_url, url, body), daemon=True)
        self.thread.start()

    def _send(self, proxy_url: str, url: str, body: dict) -> None:
        with proxy_client(proxy_url) as client:
            self.response = client.post(url, json=body)

    def result(self) -> httpx.Response:
        self.thread.join(30)
        assert self.response is not None
        return self.response


async def repeats_while_held(env, up, key: str, url: str, body: dict, n: int) -> tuple[list[httpx.Response], dict]:
    """n repeats at once; once all n are waiting in the proxy, note its threads and database connections,
    then let the upstream answer the original."""
    engine = env["proxy"].addon.store.engine
    seen: dict = {"threads_before": threads()}
    async with httpx.AsyncClient(proxy=env["proxy"].url, trust_env=False, timeout=30) as client:
        tasks = [asyncio.create_task(client.post(url, json=body)) for _ in range(n)]
        await asyncio.to_thread(wait_for, lambda: waiting(env) >= n, 15, 0.02)  # a bounded poll of the proxy's count
        seen.update(waiting=waiting(env), threads=threads(), connections=engine.pool.checkedout())
        up.release(key)
        return await asyncio.gather(*tasks), seen


def assert_the_originals_answer(answers: list[httpx.Response], original: httpx.Response) -> None:
    for a in answers:
        assert a.status_code == original.status_code, a.text
        assert a.headers["X-Receipt-Replayed"] == "true"
        assert a.headers["X-Receipt-Id"] == original.headers["X-Receipt-Id"]
        assert a.content == original.content


def test_twenty_repeats_of_an_in_flight_write_wait_and_get_its_answer(env, ups):
    up, key = ups["wait"], tag()
    url, body = f"{up.base}/hold/{key}", {"title": key}
    original = Original(env["proxy"].url, url, body)
    assert up.wait_for(f"/hold/{key}")  # the original has reached the upstream: its receipt is submitted
    answers, seen = asyncio.run(repeats_while_held(env, up, key, url, body, REPEATS))
    first = original.result()
    assert first.status_code == 201 and first.headers["X-Receipt-State"] == "succeeded"
    assert seen["waiting"] == REPEATS, seen
    assert_the_originals_answer(answers, first)
    assert up.count(f"/hold/{key}") == 1
    # waiting costs no thread and no database connection per waiter
    assert seen["threads"] <= seen["threads_before"] + JOURNAL_THREADS, seen
    assert seen["connections"] <= 2, seen  # (the heartbeat or the orphan sweep may hold one a moment)
    assert waiting(env) == 0


def test_repeats_wait_for_an_original_in_flight_on_another_replica(env, ups, tmp_path):
    """The original goes through a second proxy process; this proxy learns its verdict from the database."""
    proc, port = start_proxy_process(env["config"], env["url"], tmp_path / "confdir", tmp_path / "replica.log")
    try:
        up, key = ups["wait"], tag()
        url, body = f"{up.base}/hold/{key}", {"title": key}
        original = Original(f"http://127.0.0.1:{port}", url, body)
        assert up.wait_for(f"/hold/{key}")
        answers, seen = asyncio.run(repeats_while_held(env, up, key, url, body, REPEATS))
        first = original.result()
        assert first.status_code == 201 and seen["waiting"] == REPEATS, seen
        assert_the_originals_answer(answers, first)
        assert up.count(f"/hold/{key}") == 1
        assert seen["connections"] <= 2, seen  # one shared poll, not a query per waiter
    finally:
        stop_process(proc)


def test_a_repeat_of_an_original_that_ends_unknown_gets_its_504(env, ups):
    up, key = ups["wait"], tag()
    url, body = f"{up.base}/hold/{key}?status=503", {"title": key}
    original = Original(env["proxy"].url, url, body)
    assert up.wait_for(f"/hold/{key}")
    [repeat], _ = asyncio.run(repeats_while_held(env, up, key, url, body, 1))
    first = original.result()
    assert first.status_code == 504
    assert repeat.status_code == 504, repeat.text
    doc = repeat.json()
    assert doc["type"].endswith("outcome-unknown") and doc["state"] == "outcome_unknown" and doc["upstream_status"] == 503
    assert doc["operation_id"] == first.headers["X-Receipt-Id"] == repeat.headers["X-Receipt-Id"]
    assert up.count(f"/hold/{key}") == 1


def test_a_repeat_of_an_original_that_was_rejected_is_sent_anew(env, ups):
    """A rejection blocks nothing: what a repeat after it gets is a new receipt, and the upstream's answer."""
    up, key = ups["wait"], tag()
    url, body = f"{up.base}/hold/{key}?status=422", {"title": key}
    original = Original(env["proxy"].url, url, body)
    assert up.wait_for(f"/hold/{key}")
    [repeat], _ = asyncio.run(repeats_while_held(env, up, key, url, body, 1))
    first = original.result()
    assert (first.status_code, repeat.status_code) == (422, 422)
    assert repeat.headers["X-Receipt-Id"] != first.headers["X-Receipt-Id"]
    assert up.count(f"/hold/{key}") == 2


def test_past_max_wait_the_repeat_is_refused_as_open(env, ups):
    up, key = ups["short"], tag()
    url, body = f"{up.base}/hold/{key}", {"title": key}
    original = Original(env["proxy"].url, url, body)
    try:
        assert up.wait_for(f"/hold/{key}")
        started = time.monotonic()
        with proxy_client(env["proxy"].url) as client:
            r = client.post(url, json=body)
        elapsed = time.monotonic() - started
        assert r.status_code == 409 and r.json()["type"].endswith("duplicate-open"), r.text
        assert r.json()["state"] == "submitted"
        assert 0.4 <= elapsed < 10, f"refused after {elapsed:.2f}s; max_wait is 0.5s"
    finally:
        up.release(key)
    assert original.result().status_code == 201
    assert up.count(f"/hold/{key}") == 1


def test_a_repeat_whose_client_left_stops_waiting(env, ups):
    up, key = ups["wait"], tag()
    url, body = f"{up.base}/hold/{key}", {"title": key}
    original = Original(env["proxy"].url, url, body)
    try:
        assert up.wait_for(f"/hold/{key}")
        with proxy_client(env["proxy"].url, timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post(url, json=body)
        # max_wait is 20 s; the proxy notices the client has gone long before that
        assert wait_for(lambda: waiting(env) == 0, timeout=10), waiting(env)
    finally:
        up.release(key)
    assert original.result().status_code == 201
    assert up.count(f"/hold/{key}") == 1
