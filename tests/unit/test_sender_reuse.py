"""HTTP/1.1 connection reuse against a real keep-alive upstream on loopback (support/answering.py), counting the
connections it accepted. The idle bounds are read off a clock the test turns, so no test waits for them; the
upstream's own idle close is waited for on its connection count."""

import asyncio

from support.answering import AnsweringUpstream

from proxy_addon.request.sender import SendEnd, SendResult, Timeouts, TLSSettings, UpstreamSender

KEEPALIVE = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def writes(up: AnsweringUpstream, steps: list[float], keepalive: float | None = KEEPALIVE) -> list[SendResult]:
    """One write per step, the clock turned by the step's seconds before it (None: wait for the upstream's idle
    close instead), all through one sender."""
    clock = Clock()

    async def main() -> list[SendResult]:
        sender = UpstreamSender(TLSSettings(), clock=clock)
        results = []
        try:
            for i, step in enumerate(steps):
                if step is None:
                    assert await asyncio.to_thread(up.wait_closed), "the upstream's idle close"
                else:
                    clock.now += step
                timeouts = Timeouts(connect=2.0, idle=5.0, keepalive=keepalive)
                results.append(await sender.send_once("POST", f"{up.base}/things/{i}", [], b"{}", timeouts))
        finally:
            await sender.aclose()
        return results

    results = asyncio.run(main())
    assert all(r.end == SendEnd.ANSWERED for r in results), results
    return results


def upstream(**options) -> AnsweringUpstream:
    return AnsweringUpstream(**options).start()


def test_sequential_writes_share_one_connection():
    up = upstream()
    try:
        results = writes(up, [0, 0.5, 1.0, 3.9, 0])
        assert up.accepted == 1
        assert [r.reused for r in results] == [False, True, True, True, True]
    finally:
        up.stop()


def test_a_connection_idle_for_upstream_keepalive_is_not_used_again():
    up = upstream()
    try:
        results = writes(up, [0, KEEPALIVE, 0])
        assert up.accepted == 2
        assert [r.reused for r in results] == [False, False, True]
    finally:
        up.stop()


def test_the_upstreams_advertised_keep_alive_timeout_less_a_margin_bounds_reuse():
    """`Keep-Alive: timeout=2` under upstream_keepalive 4s: reused within 1 s of idleness (a second is kept for the
    close and the request to cross the wire), not after."""
    up = upstream(keep_alive_header="timeout=2, max=100")
    try:
        results = writes(up, [0, 0.9, 1.0, 0])
        assert [r.reused for r in results] == [False, True, False, True]
        assert up.accepted == 2
    finally:
        up.stop()


def test_keep_alive_max_0_ends_reuse():
    up = upstream(keep_alive_header="timeout=5, max=0")
    try:
        results = writes(up, [0, 0, 0])
        assert up.accepted == 3 and not any(r.reused for r in results)
    finally:
        up.stop()


def test_a_connection_the_upstream_closed_while_idle_is_not_used():
    """The upstream closes connections idle 0.2 s; once it has, its EOF is pending on ours: a new one is made."""
    up = upstream(idle_timeout=0.2)
    try:
        results = writes(up, [0, None, None])
        assert up.accepted == 3 and not any(r.reused for r in results)
    finally:
        up.stop()


def test_fresh_connections_one_per_write():
    up = upstream()
    try:
        results = writes(up, [0, 0, 0], keepalive=None)
        assert up.accepted == 3 and not any(r.reused for r in results)
    finally:
        up.stop()


def test_idle_connections_are_closed_with_the_sender():
    up = upstream()
    try:
        writes(up, [0, 0])
        assert up.wait_closed(5), "aclose closed the idle connection"
    finally:
        up.stop()
