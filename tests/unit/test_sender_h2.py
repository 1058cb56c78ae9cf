"""HTTP/2 upstreams: one connection shared by the writes, and the only resend there is: a stream the upstream
refused unprocessed (REFUSED_STREAM, or above a GOAWAY's last-stream-id), sent once more on a new connection.
Against real HTTP/2 servers on loopback over TLS: support/h2_upstream.py (refuses on demand) and hypercorn."""

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from support.h2_upstream import H2Upstream
from support.hypercorn_upstream import HypercornUpstream

from proxy_addon.request.sender import SendEnd, SendResult, Timeouts, TLSSettings, UpstreamSender

KEEPALIVE = 4.0
TIMEOUTS = Timeouts(connect=5.0, idle=5.0, keepalive=KEEPALIVE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def up():
    server = H2Upstream().start()
    try:
        yield server
    finally:
        server.stop()


def run(script: Callable[[UpstreamSender, Clock], Awaitable[list[SendResult]]]) -> list[SendResult]:
    clock = Clock()

    async def main() -> list[SendResult]:
        sender = UpstreamSender(TLSSettings(insecure=True), clock=clock)
        try:
            return await script(sender, clock)
        finally:
            await sender.aclose()

    return asyncio.run(main())


async def post(sender: UpstreamSender, url: str, timeouts: Timeouts = TIMEOUTS) -> SendResult:
    return await sender.send_once("POST", url, [(b"content-type", b"application/json")], b'{"a": 1}', timeouts)


def test_sequential_writes_share_one_connection_and_a_ping_checks_it_after_idle(up):
    async def script(sender, clock):
        results = [await post(sender, f"{up.base}/things/{i}") for i in range(3)]
        clock.now += KEEPALIVE + 60  # idle past upstream_keepalive: a PING first, answered, so the same connection
        results.append(await post(sender, f"{up.base}/things/3"))
        return results

    results = run(script)
    assert [r.end for r in results] == [SendEnd.ANSWERED] * 4
    assert [r.reused for r in results] == [False, True, True, True]
    assert results[0].answer is not None and results[0].answer.status_code == 201 and results[0].answer.reason == "Created"
    assert up.accepted == 1 and len(up.processed) == 4


def test_concurrent_writes_are_streams_of_one_connection(up):
    async def script(sender, clock):
        first = await post(sender, f"{up.base}/things/warm")
        burst = [asyncio.ensure_future(post(sender, f"{up.base}/hold/k/{i}")) for i in range(8)]
        assert await asyncio.to_thread(up.wait_until, lambda u: len(u.processed) == 9), "all 8 in flight at once"
        up.release("k")
        return [first, *await asyncio.gather(*burst)]

    results = run(script)
    assert all(r.end == SendEnd.ANSWERED for r in results)
    assert up.accepted == 1


@pytest.mark.parametrize(("path", "why"), [("/refuse/a/x", "refused_stream"), ("/goaway-below/b/x", "goaway")])
def test_a_stream_refused_unprocessed_is_sent_once_more_on_a_new_connection(up, path, why):
    results = run(lambda sender, clock: asyncio.gather(post(sender, up.base + path)))
    [result] = results
    assert result.end == SendEnd.ANSWERED and result.resent == why
    assert up.count(path) == 1 and len(up.refused) == 1
    assert up.accepted == 2


def test_the_streams_a_goaway_refused_mid_burst_are_sent_once_more_together_on_one_new_connection(up):
    async def script(sender, clock):
        first = await post(sender, f"{up.base}/things/warm")
        burst = [post(sender, f"{up.base}/goaway-after/x")] + [post(sender, f"{up.base}/things/{i}") for i in range(5)]
        return [first, *await asyncio.gather(*burst)]

    results = run(script)
    assert all(r.end == SendEnd.ANSWERED for r in results), results
    assert [r.resent for r in results[2:]] == ["goaway"] * 5 and results[1].resent is None
    assert sorted(p.path for p in up.processed) == sorted(["/things/warm", "/goaway-after/x", *(f"/things/{i}" for i in range(5))])
    assert up.accepted == 2  # the five resends share one new connection


def test_a_second_refusal_is_not_sent_again(up):
    [result] = run(lambda sender, clock: asyncio.gather(post(sender, up.base + "/refuse/c/x?times=5")))
    assert result.end == SendEnd.NOT_SENT and result.resent == "refused_stream", result
    assert len(up.refused) == 2 and up.processed == []


@pytest.mark.parametrize("path", ["/goaway-above/x", "/reset-after/x"])
def test_a_stream_the_upstream_may_have_processed_is_never_sent_again(up, path):
    [result] = run(lambda sender, clock: asyncio.gather(post(sender, up.base + path)))
    assert result.end == SendEnd.RESET and result.resent is None and result.answer is None, result
    assert up.count(path) == 1 and up.refused == []


def test_a_stream_under_a_graceful_goaway_is_still_answered(up):
    [result] = run(lambda sender, clock: asyncio.gather(post(sender, up.base + "/drain/x")))
    assert result.end == SendEnd.ANSWERED and result.resent is None, result
    assert up.count("/drain/x") == 1


def test_the_upstreams_idle_goaway_leads_to_a_new_connection():
    up = H2Upstream(idle_timeout=0.2).start()
    try:

        async def script(sender, clock):
            first = await post(sender, f"{up.base}/things/1")
            assert await asyncio.to_thread(up.wait_until, lambda u: u.open == 0), "the upstream's idle close"
            return [first, await post(sender, f"{up.base}/things/2")]

        results = run(script)
        assert [r.end for r in results] == [SendEnd.ANSWERED] * 2 and not results[1].reused
        assert up.accepted == 2
    finally:
        up.stop()


@pytest.fixture
def hypercorn():
    server = HypercornUpstream(hold_until=8).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_general_http2_server_shares_one_connection_between_concurrent_writes(hypercorn):
    async def script(sender, clock):
        first = await post(sender, f"{hypercorn.base}/things/warm")  # the connection, before the burst
        burst = [post(sender, f"{hypercorn.base}/hold/{i}") for i in range(8)]  # answered once all 8 are in
        return [first, *await asyncio.gather(*burst)]

    results = run(script)
    assert all(r.end == SendEnd.ANSWERED for r in results), results
    assert {s.http_version for s in hypercorn.seen} == {"2"} and hypercorn.connections == 1


def test_fresh_connections_speak_http_1_1_one_per_write(hypercorn):
    """`upstream_connections: fresh` offers no h2: one HTTP/1.1 connection per write."""
    fresh = Timeouts(connect=5.0, idle=5.0)

    async def script(sender, clock):
        return [await post(sender, f"{hypercorn.base}/things/{i}", fresh) for i in range(3)]

    results = run(script)
    assert all(r.end == SendEnd.ANSWERED and not r.reused for r in results), results
    assert {s.http_version for s in hypercorn.seen} == {"1.1"} and hypercorn.connections == 3


@pytest.mark.parametrize("version", ["2", "1.1"])
def test_the_last_look_before_the_first_byte_withholds_the_request(hypercorn, version):
    """`may_send` is asked after the connection is made, before the request's first byte: False, and the upstream
    sees nothing (the handler then closes the receipt as not sent: a proxy frozen while connecting may have been
    taken for dead, its receipt settled safe_to_retry); True, and the write goes out on the same connection."""
    timeouts = TIMEOUTS if version == "2" else Timeouts(connect=5.0, idle=5.0)  # fresh: HTTP/1.1
    asked = []

    def may_send(answer: bool) -> Callable[[], bool]:
        return lambda: asked.append(answer) or answer

    async def script(sender, clock):
        url = f"{hypercorn.base}/things/"
        send = sender.send_once
        withheld = await send("POST", url + "withheld", [(b"content-type", b"application/json")], b"{}", timeouts, may_send(False))
        sent = await send("POST", url + "sent", [(b"content-type", b"application/json")], b"{}", timeouts, may_send(True))
        return [withheld, sent]

    withheld, sent = run(script)
    assert asked == [False, True]
    assert withheld.end == SendEnd.NOT_SENT and "last look" in (withheld.error or ""), withheld
    assert sent.end == SendEnd.ANSWERED, sent
    assert [(s.path, s.http_version) for s in hypercorn.seen] == [("/things/sent", version)]


def test_the_rest_of_a_body_longer_than_the_window_is_kept_back_once_the_proxy_may_have_been_taken_for_dead(hypercorn):
    """A body larger than HTTP/2's flow-control window goes out as the upstream's window updates allow, and
    `may_send` is asked again before each DATA frame that follows such a wait: a proxy frozen while it waited
    may have been taken for dead, its receipt settled by a read that found nothing. False after part of the body
    went out: the stream is reset, the upstream never has the whole request (hypercorn's app is told the client
    left), and the end is not `not_sent` (part of it went out) but an honest unknown. The connection serves the
    next write."""
    body = b'{"pad": "' + b"x" * 300_000 + b'"}'  # several windows of 65,535 bytes
    asked = []

    def may_send() -> bool:
        asked.append(len(asked) < 2)  # the last look before the head, and after the first wait for the window
        return asked[-1]

    async def script(sender, clock):
        headers = [(b"content-type", b"application/json")]
        kept_back = await sender.send_once("POST", f"{hypercorn.base}/things/kept-back", headers, body, TIMEOUTS, may_send)
        whole = await sender.send_once("POST", f"{hypercorn.base}/things/whole", headers, body, TIMEOUTS, lambda: True)
        return [kept_back, whole]

    kept_back, whole = run(script)
    assert asked == [True, True, False], asked
    assert kept_back.end not in (SendEnd.NOT_SENT, SendEnd.ANSWERED) and "kept back" in (kept_back.error or ""), kept_back
    assert whole.end == SendEnd.ANSWERED and whole.reused, whole
    assert hypercorn.wait_cut_short("/things/kept-back"), hypercorn.cut_short
    assert [(s.path, s.http_version) for s in hypercorn.seen] == [("/things/whole", "2")]
