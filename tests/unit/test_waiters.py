"""request/waiters.py on its own: repeats waiting for an in-flight original's verdict, woken by the handler (this proxy's
originals) or by one shared, backed-off poll (other replicas'); bounded by their own deadline and their client."""

import asyncio

from proxy_addon.request.waiters import VerdictWaiters


class States:
    """A stand-in for the store's `states` read: what the database says, and how often it was asked."""

    def __init__(self) -> None:
        self.now: dict[str, str] = {}
        self.reads: list[list[str]] = []
        self.read_thrice = asyncio.Event()

    async def read(self, operation_ids):
        self.reads.append(sorted(operation_ids))
        if len(self.reads) >= 3:
            self.read_thrice.set()
        return {op: self.now[op] for op in operation_ids if op in self.now}


def never() -> bool:
    return False


def test_local_waiters_wake_when_the_handler_settles_the_original():
    async def main():
        states = States()
        waiters = VerdictWaiters(states.read)
        tasks = [asyncio.create_task(waiters.wait("op_a", True, 30, never)) for _ in range(50)]
        await asyncio.sleep(0)  # each task runs up to its wait
        assert waiters.waiting == 50
        waiters.settled("op_a")
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return states.reads, waiters.waiting

    reads, still_waiting = asyncio.run(main())
    assert reads == [] and still_waiting == 0  # no database read at all for this proxy's own originals


def test_remote_waiters_share_one_poll():
    async def main():
        states = States()
        states.now = {"op_a": "submitted", "op_b": "submitted"}
        waiters = VerdictWaiters(states.read)
        tasks = [asyncio.create_task(waiters.wait(op, False, 30, never)) for op in ("op_a", "op_b") * 25]
        await asyncio.wait_for(states.read_thrice.wait(), 5)  # the poll has run a few times, for everyone at once
        states.now = {"op_a": "succeeded", "op_b": "outcome_unknown"}
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return states.reads, waiters

    reads, waiters = asyncio.run(main())
    assert all(r == ["op_a", "op_b"] for r in reads)  # one query for all fifty waiters
    assert waiters.waiting == 0 and waiters._poller is not None and waiters._poller.done()


def test_a_waiter_stops_at_its_deadline_and_when_its_client_leaves():
    async def main():
        states = States()
        states.now = {"op_a": "submitted"}
        waiters = VerdictWaiters(states.read)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await waiters.wait("op_a", False, 0.2, never)
        timed_out = loop.time() - started
        gone = asyncio.Event()
        task = asyncio.create_task(waiters.wait("op_a", True, 30, gone.is_set))
        gone.set()
        await asyncio.wait_for(task, 5)
        return timed_out, waiters.waiting

    timed_out, still_waiting = asyncio.run(main())
    assert 0.15 <= timed_out < 5 and still_waiting == 0


def test_a_failed_poll_wakes_nobody():
    async def main():
        calls = 0

        async def failing(operation_ids):
            nonlocal calls
            calls += 1
            raise RuntimeError("database down")

        waiters = VerdictWaiters(failing)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await waiters.wait("op_a", False, 0.3, never)  # ends at its deadline, not woken by the failure
        return calls, loop.time() - started

    calls, waited = asyncio.run(main())
    assert calls >= 1 and waited >= 0.25
