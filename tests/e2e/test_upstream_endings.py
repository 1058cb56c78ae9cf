"""The right verdict for every way an exchange with the upstream ends, end to end: a real proxy, real
upstreams (support/answering.py), httpx through the proxy, receipts on SQLite and PostgreSQL.

- `upstream_timeout` is an idle timeout: an answer that trickles in steadily succeeds however long it takes;
  `upstream_deadline` bounds the whole exchange.
- An answer that came before the upstream read the whole request (an early 413 or 401, then a reset) stands.
- With mitmproxy's `stream_large_bodies`, a journaled write still goes upstream exactly once.
- An upstream closing idle connections (after 0.3 s, after 1 s) never turns into a false outcome_unknown.
- HTTP/2: a stream refused unprocessed is sent once more (the history says so), never a third time; one the
  upstream may have processed is outcome_unknown.
The timeout and early-answer writes go on a reused connection (an earlier write leaves it idle): its history
says so.
"""

import time
from pathlib import Path

import pytest
from support.answering import AnsweringUpstream
from support.bodies import binary
from support.e2e import open_store, proxy_client, settled, settled_history, tag
from support.h2_upstream import H2Upstream
from support.proxy import start_inprocess_proxy

BIG_BODY = 16 * 1024 * 1024  # far more than the kernel buffers: the upstream answers while it is being written


@pytest.fixture(scope="module")
def ups():
    started = {
        "main": AnsweringUpstream().start(),
        "idle_0_3": AnsweringUpstream(idle_timeout=0.3).start(),
        "idle_1": AnsweringUpstream(idle_timeout=1.0).start(),
        "deadline": AnsweringUpstream().start(),
        "h2": H2Upstream().start(),
    }
    try:
        yield started
    finally:
        for up in started.values():
            up.stop()


def running_proxy(db_url: str, ups: dict, tmp: Path, **options):
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "defaults: {upstream_timeout: 2s, connect_timeout: 3s}\n"
        "hosts:\n"
        f'  "127.0.0.1:{ups["deadline"].port}": {{upstream_deadline: 1s}}\n'
    )
    proxy = start_inprocess_proxy(config, db_url, tmp / "confdir", ssl_insecure=True, **options)
    try:
        with open_store(db_url) as store, proxy_client(proxy.url, verify=False) as client:
            yield {"store": store, "client": client}
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def env(module_db_url, ups, tmp_path_factory):
    yield from running_proxy(module_db_url, ups, tmp_path_factory.mktemp("endings"))


@pytest.fixture(scope="module")
def streaming(module_db_url, ups, tmp_path_factory):
    """A proxy run as `receipts proxy --set stream_large_bodies=1k` runs it."""
    yield from running_proxy(module_db_url, ups, tmp_path_factory.mktemp("streaming"), stream_large_bodies="1k")


def receipt_of(env, response):
    return settled(env["store"], response.headers["X-Receipt-Id"])


def warm(env, up) -> None:
    """A write that leaves an idle connection to `up` for the next one to reuse."""
    r = env["client"].post(up.base + f"/pretty/{tag()}", json={"warm": True})
    assert r.status_code == 201, r.text


def on_reused_connection(env, response) -> bool:
    verdict = settled_history(env["store"], response.headers["X-Receipt-Id"])[-1]
    return verdict.detail.get("connection") == "reused"


# -- timeouts -------------------------------------------------------------------------------------------------


def test_an_answer_trickling_in_steadily_outlives_the_idle_timeout(env, ups):
    """A chunk every 0.5 s for 3 s, upstream_timeout 2s: the upstream is visibly working, the write succeeds."""
    path = f"/trickle/{tag()}?chunks=6&every=0.5"
    warm(env, ups["main"])
    started = time.monotonic()
    r = env["client"].post(ups["main"].base + path, json={"x": 1})
    elapsed = time.monotonic() - started
    assert r.status_code == 201, r.text
    assert r.json() == {"chunks": [0, 1, 2, 3, 4, 5]}
    assert elapsed > 2.0, f"the answer took {elapsed:.2f}s, so it did outlast upstream_timeout (2s)"
    assert receipt_of(env, r).state == "succeeded"
    assert on_reused_connection(env, r)


def test_the_deadline_bounds_the_whole_exchange(env, ups):
    """The same trickle to a host with upstream_deadline 1s: outcome unknown once the deadline passes."""
    path = f"/trickle/{tag()}?chunks=6&every=0.5"
    warm(env, ups["deadline"])
    started = time.monotonic()
    r = env["client"].post(ups["deadline"].base + path, json={"x": 1})
    elapsed = time.monotonic() - started
    assert r.status_code == 504 and r.json()["type"].endswith("outcome-unknown"), r.text
    assert elapsed < 2.9, f"answered after {elapsed:.2f}s; the deadline is 1s, the trickle takes 3s"
    receipt = receipt_of(env, r)
    assert (receipt.state, receipt.error_code) == ("outcome_unknown", "upstream_timeout")
    assert "upstream_deadline" in receipt.error_message
    assert on_reused_connection(env, r)


# -- early answers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [413, 401])
def test_an_early_answer_then_a_reset_stands(env, ups, status):
    path = f"/early/{status}/{tag()}"
    warm(env, ups["main"])
    r = env["client"].post(ups["main"].base + path, content=binary(BIG_BODY), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == status, r.text
    assert r.json() == {"error": status}  # the upstream's own answer
    receipt = receipt_of(env, r)
    assert (receipt.state, receipt.status_code, receipt.error_code) == ("rejected", status, "upstream_status")
    assert ups["main"].count(path) == 1
    assert on_reused_connection(env, r)


# -- stream_large_bodies ------------------------------------------------------------------------------------


def test_a_journaled_write_over_stream_large_bodies_goes_upstream_once(streaming, ups):
    path = f"/pretty/{tag()}"
    body = binary(8 * 1024)  # over the 1k at which mitmproxy would stream it
    r = streaming["client"].post(ups["main"].base + path, content=body, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201 and r.headers["X-Receipt-State"] == "succeeded", r.text
    assert ups["main"].count(path) == 1
    [seen] = [s for s in ups["main"].seen if s.path == path]
    assert seen.body == body


def test_a_chunked_journaled_write_over_stream_large_bodies_goes_upstream_once(streaming, ups):
    """No Content-Length: mitmproxy decides to stream only once it has read past the limit."""
    path = f"/pretty/{tag()}"
    parts = [binary(1024, seed=i) for i in range(8)]
    r = streaming["client"].post(ups["main"].base + path, content=iter(parts), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201 and r.headers["X-Receipt-State"] == "succeeded", r.text
    assert ups["main"].count(path) == 1
    [seen] = [s for s in ups["main"].seen if s.path == path]
    assert seen.body == b"".join(parts)


def test_pass_through_answers_are_still_streamed(streaming, ups):
    """The option still does what it says for what is not journaled: the first chunk of an answer reaches the
    client while the upstream holds the rest."""
    key = tag()
    with streaming["client"].stream("GET", ups["main"].base + f"/hold-stream/{key}", timeout=10) as r:
        assert r.status_code == 200 and "X-Receipt-Id" not in r.headers
        chunks = r.iter_raw()
        assert next(chunks).startswith(b"first chunk")  # a buffered answer would not come before the release
        ups["main"].release(key)
        assert b"".join(chunks).endswith(b"the rest\n")


# -- upstreams that close idle connections ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["idle_0_3", "idle_1"])
def test_an_upstream_closing_idle_connections_gives_no_false_unknown(env, ups, name):
    """The upstream closes connections idle for 0.3 s (1 s), well within upstream_keepalive. Each write after its
    close finds the close pending on the idle connection and goes on a new one: all succeed, each reached it."""
    up = ups[name]
    accepted = up.accepted
    paths = [f"/pretty/{tag()}" for _ in range(3)]
    for i, path in enumerate(paths):
        assert up.wait_closed(), "the upstream closes its idle connections"  # the scenario: its close came first
        r = env["client"].post(up.base + path, json={"n": i})
        assert r.status_code == 201, r.text
        assert r.headers["X-Receipt-State"] == "succeeded"
        assert up.count(path) == 1
        assert not on_reused_connection(env, r)
    assert up.accepted == accepted + 3


# -- HTTP/2 upstreams -----------------------------------------------------------------------------------------


def test_http2_a_refused_stream_is_sent_once_more_and_the_history_says_so(env, ups):
    path = f"/refuse/{tag()}/x"
    r = env["client"].post(ups["h2"].base + path, json={"x": 1})
    assert r.status_code == 201 and r.headers["X-Receipt-State"] == "succeeded", r.text
    verdict = settled_history(env["store"], r.headers["X-Receipt-Id"])[-1]
    assert verdict.detail["resent"] == "refused_stream"
    assert ups["h2"].count(path) == 1


def test_http2_a_stream_refused_twice_is_not_sent_again_and_may_be_retried(env, ups):
    path = f"/refuse/{tag()}/x"
    r = env["client"].post(ups["h2"].base + path + "?times=5", json={"x": 1})
    assert r.status_code == 502 and r.json()["type"].endswith("not-sent"), r.text
    receipt = receipt_of(env, r)
    assert (receipt.state, receipt.error_code) == ("rejected", "not_sent")
    assert ups["h2"].count(path) == 0 and ups["h2"].refused.count(path + "?times=5") == 2


@pytest.mark.parametrize("kind", ["goaway-above", "reset-after"])
def test_http2_a_stream_the_upstream_may_have_processed_is_outcome_unknown(env, ups, kind):
    path = f"/{kind}/{tag()}"
    r = env["client"].post(ups["h2"].base + path, json={"x": 1})
    assert r.status_code == 504 and r.json()["type"].endswith("outcome-unknown"), r.text
    assert receipt_of(env, r).state == "outcome_unknown"
    assert ups["h2"].count(path) == 1
