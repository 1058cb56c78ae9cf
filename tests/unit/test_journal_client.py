"""The proxy's side of its journal writer (journal/client.py): what a write gets when the writer answers, when
it dies, when it keeps dying at once, and when the proxy stops it, on a real SQLite journal."""

import asyncio
import socket
import time
from pathlib import Path

import pytest
from support.e2e import migrate
from support.store import intent

from proxy_addon.exceptions import (
    DuplicateOpenError,
    JournalTimeoutError,
    JournalUnavailableError,
    StaleStateError,
    WriterLostError,
)
from proxy_addon.journal.client import JournalClient
from proxy_addon.journal.links import WriterThread
from proxy_addon.journal.messages import Blocked, Done, Failed, Ready, Record, Setup, frame, split_frames
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Intent
from proxy_addon.rules.states import State

DEFAULT_WINDOW = successes_block_for(AfterSuccess())  # what a Record carries for the default policy
ROUNDING = 1e-6  # seconds: a float's rounding of time.monotonic() sums, far below any share of a timeout


class SilentWriter:
    """A writer that says it is ready, then reads what it is sent and never answers (a hung one); `die()` ends it."""

    def __init__(self, ready: bool = True) -> None:
        self.sock, self.other = socket.socketpair()
        self.buffer = bytearray()
        self.frames: list = []
        self.killed = False
        if ready:
            self.other.sendall(frame(0, Ready()))

    async def received(self, count: int) -> list:
        """The first `count` frames the proxy sent (its setup first), once they are here."""
        while len(self.frames) < count:
            self.buffer += await asyncio.to_thread(self.other.recv, 65536)
            self.frames += split_frames(self.buffer)
        return self.frames[:count]

    def die(self) -> None:
        self.other.close()

    def ended(self) -> str:
        return "its socket closed"

    def stop(self) -> None:
        self.sock.close()
        self.other.close()

    def kill(self) -> None:
        self.killed = True
        self.die()


class DeadAtStart(SilentWriter):
    def __init__(self) -> None:
        super().__init__(ready=False)
        self.die()


class Writers:
    """The SilentWriters a client starts, one after another; `second` is set when it starts the second one."""

    def __init__(self) -> None:
        self.started: list[SilentWriter] = []
        self.second = asyncio.Event()  # made inside the test's event loop (each test runs its own)

    def start(self) -> SilentWriter:
        self.started.append(SilentWriter())
        if len(self.started) == 2:
            self.second.set()
        return self.started[-1]


async def verdict_held_by_the_first(client: JournalClient, writers: Writers) -> tuple[Intent, asyncio.Future]:
    """A write recorded through the first writer (answered by hand), then its told verdict handed over and held
    by that writer; the intent, and the future the verdict's callback answers."""
    it = intent(proxy_instance="me")
    first = asyncio.ensure_future(client.record(it, AfterSuccess(), "me"))
    await asyncio.sleep(0)  # the client starts its writer
    [_setup, (record_id, _)] = await writers.started[0].received(2)
    writers.started[0].other.sendall(frame(record_id, Done("sha256:head")))
    await first
    answers: asyncio.Future = asyncio.get_running_loop().create_future()
    client.advance_now(it.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {}, "sha256:head", answers.set_result, answered=True)
    await writers.started[0].received(3)
    return it, answers


async def recorded_once_started(client: JournalClient, attempts: int = 60) -> None:
    """Record one write through `client`, whose writer is starting. A start can take longer than a short
    journal_timeout on a loaded machine: that write fails alone and the start goes on, so try again, boundedly."""
    for _ in range(attempts - 1):
        try:
            return await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")
        except JournalUnavailableError as e:
            if "did not start within" not in str(e):
                raise
    await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(url)
    return url


def test_a_write_is_recorded_a_repeat_refused_and_a_lost_compare_and_set_reported(url: str) -> None:
    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), WriterThread)
        try:
            it = intent(proxy_instance="me")
            head = await client.record(it, AfterSuccess(), "me")
            assert head is not None and head.startswith("sha256:")  # the history head, for the verdict's compare
            with pytest.raises(DuplicateOpenError):
                await client.record(intent(it.intent_fingerprint, proxy_instance="me"), AfterSuccess(), "me")
            await client.advance(it.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {"status_code": 201}, head)
            with pytest.raises(StaleStateError) as e:
                await client.advance(it.operation_id, State.SUBMITTED, State.REJECTED, {"who": "me"}, {})
            assert e.value.actual == "succeeded"
        finally:
            await client.aclose()

    asyncio.run(go())


def test_a_verdict_handed_over_now_is_on_the_socket_before_anything_sent_after_it(url: str) -> None:
    """advance_now writes its frame before it returns: a record sent after it reaches the writer after it
    (request/recording.py answers in between, and relies on that order)."""
    writer = SilentWriter()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), lambda: writer)
        it = intent(proxy_instance="me")
        answers: asyncio.Future = asyncio.get_running_loop().create_future()
        then = answers.set_result
        first = asyncio.ensure_future(client.record(it, AfterSuccess(), "me"))
        [_setup, (record_id, _)] = await writer.received(2)
        writer.other.sendall(frame(record_id, Done("sha256:head")))
        assert await first == "sha256:head"
        client.advance_now(it.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {}, "sha256:head", then)
        later = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        [*_, (advance_id, advance), (later_id, record)] = await writer.received(4)
        assert (type(advance).__name__, advance.operation_id, advance.to, advance.head) == (
            "Advance", it.operation_id, "succeeded", "sha256:head"
        )
        assert type(record).__name__ == "Record" and later_id > advance_id
        writer.other.sendall(frame(advance_id, Failed("stale", "moved on", "rejected")))
        error = await answers  # what the writer answered, as advance() raises it
        assert isinstance(error, StaleStateError) and error.actual == "rejected"
        writer.other.sendall(frame(later_id, Done("sha256:other")))
        await later
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_what_a_dying_writer_held_fails_at_once_and_the_next_write_starts_a_new_one(url: str) -> None:
    writers: list[SilentWriter | WriterThread] = []

    def start() -> SilentWriter | WriterThread:
        writers.append(SilentWriter() if not writers else WriterThread())
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), start)
        answered = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await asyncio.sleep(0)  # the client starts its writer
        first = writers[0]
        assert isinstance(first, SilentWriter)
        [_setup, (request_id, _record)] = await first.received(2)
        first.other.sendall(frame(request_id, Done()))  # answered by hand
        await answered  # the writer got past its start
        held = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await first.received(3)
        first.die()
        with pytest.raises(WriterLostError, match="journal writer stopped"):
            await held
        await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")  # a new writer, at once
        assert len(writers) == 2
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_verdict_a_dying_writer_held_goes_first_to_the_next_writer_which_is_started_for_it(url: str) -> None:
    """The writer dies holding a verdict (its agent may have been told it): the verdict is not failed; a new
    writer is started for it at once, without waiting for the next write, and it is that writer's first frame
    after its setup, before a record handed over meanwhile (which a repeat of the intent would be)."""
    writers = Writers()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), writers.start)
        it, answers = await verdict_held_by_the_first(client, writers)
        writers.started[0].die()
        await writers.second.wait()  # started for the verdict, not for a write (bounded by the test's own timeout)
        repeat = asyncio.ensure_future(client.record(it, AfterSuccess(), "me"))
        [_setup, (kept_id, kept), (repeat_id, record)] = await writers.started[1].received(3)
        assert (type(kept).__name__, kept.operation_id, kept.to, kept.answered) == ("Advance", it.operation_id, "succeeded", True)
        assert type(record).__name__ == "Record" and repeat_id > kept_id
        assert not answers.done()  # not failed by the first writer's death
        writers.started[1].other.sendall(frame(kept_id, Done("sha256:next")))
        assert await answers is None
        writers.started[1].other.sendall(frame(repeat_id, Done("sha256:other")))
        await repeat
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_closing_on_the_event_loop_calls_back_every_verdict_it_held(url: str) -> None:
    """aclose fails what the writer held on the event loop itself: a verdict's callback (the handler's) runs.
    From another thread a future's callbacks cannot be scheduled (asyncio's debug mode refuses it), and one
    failed there was lost."""
    writer = SilentWriter()

    async def go() -> None:
        asyncio.get_running_loop().set_debug(True)
        client = JournalClient(Setup(url, log_level="error"), lambda: writer)
        it = intent(proxy_instance="me")
        first = asyncio.ensure_future(client.record(it, AfterSuccess(), "me"))
        [_setup, (record_id, _)] = await writer.received(2)
        writer.other.sendall(frame(record_id, Done("sha256:head")))
        await first
        answers: asyncio.Future = asyncio.get_running_loop().create_future()
        client.advance_now(it.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {}, "sha256:head", answers.set_result)
        await writer.received(3)
        await client.aclose()
        error = await asyncio.wait_for(answers, 5)
        assert isinstance(error, WriterLostError) and "was stopped" in str(error)

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_writer_stopped_while_it_holds_a_record_is_killed_not_left_to_commit_it(url: str) -> None:
    """The proxy fails a held record (503, never sent) when it stops its writer: the writer must not commit it
    after, or its receipt would block the retry the 503 invites. So it is killed, not asked to finish."""
    writer = SilentWriter()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), lambda: writer)
        held = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await writer.received(2)
        await client.aclose()
        with pytest.raises(WriterLostError):
            await held
        assert writer.killed

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_writer_that_dies_before_its_first_answer_is_restarted_only_after_a_pause(url: str) -> None:
    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), DeadAtStart)
        with pytest.raises(WriterLostError):
            await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")
        with pytest.raises(JournalUnavailableError, match="keeps stopping; next start in"):
            await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_stopping_the_writer_fails_what_it_has_not_answered(url: str) -> None:
    writers: list[SilentWriter] = []

    def start() -> SilentWriter:
        writers.append(SilentWriter())
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), start)
        held = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await asyncio.sleep(0)  # the client starts its writer
        await writers[0].received(2)
        client.close()
        with pytest.raises(WriterLostError, match="was stopped"):
            await held

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_writer_that_stops_answering_is_killed_within_the_timeout_and_the_next_write_starts_a_new_one(url: str) -> None:
    writers: list[SilentWriter | WriterThread] = []

    def start() -> SilentWriter | WriterThread:
        writers.append(SilentWriter() if not writers else WriterThread())
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error", journal_timeout=0.5), start)
        first = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await asyncio.sleep(0)  # the client starts its writer
        hung = writers[0]
        assert isinstance(hung, SilentWriter)
        [_setup, (request_id, _record)] = await hung.received(2)
        hung.other.sendall(frame(request_id, Done()))  # it answered once, then hangs
        await first
        loop = asyncio.get_running_loop()
        began = loop.time()
        held = [asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me")) for _ in range(3)]
        assert len(await hung.received(5)) == 5  # all three were handed to it
        for answer in asyncio.as_completed(held):
            # its own time ran out, or the writer was killed for the oldest one's just before
            with pytest.raises(WriterLostError, match=r"(did not answer within|held a write longer than) proxy.journal_timeout \(0.5s\)"):
                await answer
        assert loop.time() - began < 0.5 + 10  # each within its bound (and slack for a loaded machine), not for ever
        for _ in range(200):  # killed once it has held them for the timeout
            if hung.killed:
                break
            await asyncio.sleep(0.01)
        assert hung.killed
        await recorded_once_started(client)  # a new writer, at once
        assert len(writers) == 2
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_write_whose_time_runs_out_while_the_writer_starts_fails_alone(url: str) -> None:
    writers: list[SilentWriter] = []

    def start() -> SilentWriter:
        writers.append(SilentWriter(ready=False))  # still starting: it never said it is ready
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error", journal_timeout=0.3), start)
        with pytest.raises(JournalUnavailableError, match="did not start within proxy.journal_timeout"):
            await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")
        only = writers[0]
        assert not only.killed  # it may still finish its start: nothing was handed to it
        assert len(await only.received(1)) == 1  # its setup, and no request
        only.other.sendall(frame(0, Ready()))
        answered = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        [_setup, (request_id, _record)] = await only.received(2)
        only.other.sendall(frame(request_id, Done()))
        await answered
        assert len(writers) == 1
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_writer_does_not_write_a_request_past_its_deadline(url: str) -> None:
    writer = JournalWriter(url, 64)
    try:
        late, live = intent(proxy_instance="me"), intent(proxy_instance="me")
        past, future = time.monotonic() - 1, time.monotonic() + 60
        replies = dict(writer.run([(1, Record(late, DEFAULT_WINDOW, "me", past)), (2, Record(live, DEFAULT_WINDOW, "me", future))]))
        assert isinstance(replies[1], Failed) and "waited longer than proxy.journal_timeout" in replies[1].message
        assert isinstance(replies[2], Done)
        [(_, again)] = writer.run([(3, Record(late, DEFAULT_WINDOW, "me", future))])
        assert isinstance(again, Done)  # the late one was not written: not a duplicate of itself
        [(_, repeat)] = writer.run([(4, Record(intent(live.intent_fingerprint, proxy_instance="me"), DEFAULT_WINDOW, "me", future))])
        assert isinstance(repeat, Blocked)
    finally:
        writer.close()


def test_a_receipt_committed_after_its_caller_gave_up_is_closed_as_not_sent(url: str) -> None:
    writers: list[SilentWriter] = []

    def start() -> SilentWriter:
        writers.append(SilentWriter())
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error", journal_timeout=30), start)
        it = intent(proxy_instance="me")
        with pytest.raises(JournalTimeoutError):  # a deadline sooner than the writer's watchdog: it is not killed
            await client._call(Record(it, DEFAULT_WINDOW, "me", time.monotonic() + 0.2), time.monotonic() + 0.3)
        slow = writers[0]
        [_setup, (request_id, _record)] = await slow.received(2)
        slow.other.sendall(frame(request_id, Done()))  # committed, answered too late
        [*_, (advance_id, advance)] = await slow.received(3)  # the client closes it through the writer
        assert (advance.operation_id, advance.expected_from, advance.to) == (it.operation_id, "submitted", "rejected")
        assert advance.updates["error_code"] == "not_sent"
        slow.other.sendall(frame(advance_id, Done()))
        assert not slow.killed
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_watchdog_is_due_one_journal_timeout_after_the_send(url: str) -> None:
    """A writer that has held a request for proxy.journal_timeout is killed: its timer is due then, not later.
    Read off the timer against the loop's clock (time.monotonic, the client's clock too), not waited for."""
    writer = SilentWriter()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        client = JournalClient(Setup(url, log_level="error", journal_timeout=30), lambda: writer)
        held = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        await writer.received(2)
        now = loop.time()
        [sent] = client._pending.values()
        timer = client._watchdog
        assert timer is not None and not timer.cancelled()
        # due at the send plus the timeout, give or take the float's rounding; the microseconds the client took
        # to arm it (between the send and now) are all it may be later by
        assert sent.sent + 30 - ROUNDING <= timer.when() <= now + 30 + ROUNDING
        await client.aclose()
        with pytest.raises(WriterLostError):
            await held

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_writer_is_handed_a_deadline_before_its_caller_gives_up(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer writes nothing past the deadline it is handed (writer.py): it must come before the caller's
    own give-up, or a record its caller already failed (503, not sent) could still be committed."""
    writer = SilentWriter()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error", journal_timeout=30), lambda: writer)
        gives_up: list[float] = []
        answer_of = client._answer_of

        async def watched(held, give_up: float):
            gives_up.append(give_up)  # the caller's own give-up, as the client computed it
            return await answer_of(held, give_up)

        monkeypatch.setattr(client, "_answer_of", watched)
        held = asyncio.ensure_future(client.record(intent(proxy_instance="me"), AfterSuccess(), "me"))
        [_setup, (_, record)] = await writer.received(2)
        assert isinstance(record, Record) and gives_up
        assert record.deadline < gives_up[0]
        await client.aclose()
        with pytest.raises(WriterLostError):
            await held

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_verdict_handed_over_while_no_writer_runs_starts_one_for_it_at_once(url: str) -> None:
    """The writer died between a record's answer and its verdict, holding nothing: the verdict handed over then is
    kept, and a writer is started for it at once, not with the next write (which may never come: the verdict's
    receipt stays open, and shutdown waits for it, until it is written)."""
    writers = Writers()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), writers.start)
        it = intent(proxy_instance="me")
        first = asyncio.ensure_future(client.record(it, AfterSuccess(), "me"))
        await asyncio.sleep(0)  # the client starts its writer
        [_setup, (record_id, _)] = await writers.started[0].received(2)
        writers.started[0].other.sendall(frame(record_id, Done("sha256:head")))
        await first
        writers.started[0].die()
        for _ in range(1000):  # the client sees its writer gone (bounded)
            if client._link is None:
                break
            await asyncio.sleep(0.005)
        assert client._link is None and len(writers.started) == 1  # nothing was held: no writer started yet
        answers: asyncio.Future = asyncio.get_running_loop().create_future()
        client.advance_now(it.operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {}, "sha256:head", answers.set_result, answered=True)
        try:
            await asyncio.wait_for(writers.second.wait(), 10)
        except TimeoutError:
            pytest.fail("no writer was started for the verdict")
        [_setup, (kept_id, kept)] = await writers.started[1].received(2)
        assert (type(kept).__name__, kept.operation_id, kept.to) == ("Advance", it.operation_id, "succeeded")
        writers.started[1].other.sendall(frame(kept_id, Done("sha256:next")))
        assert await answers is None
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_write_handed_over_the_moment_the_next_writer_is_usable_goes_after_the_kept_verdict(url: str) -> None:
    """The kept verdicts are on the new writer's socket before it is usable by anyone: a write that starts as soon
    as the client has a stream again (looked at on every turn of the event loop) still reaches it after them."""
    writers = Writers()

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), writers.start)
        it, answers = await verdict_held_by_the_first(client, writers)
        old_stream = client._stream

        async def write_once_usable() -> str | None:
            # looked at on every turn of the loop (no event says "usable": the client's stream is the signal)
            while client._stream is None or client._stream is old_stream:  # noqa: ASYNC110
                await asyncio.sleep(0)
            return await client.record(intent(proxy_instance="me"), AfterSuccess(), "me")

        repeat = asyncio.ensure_future(write_once_usable())
        writers.started[0].die()
        await writers.second.wait()  # started for the kept verdict (bounded by the test's own timeout)
        [_setup, (a_id, a), (b_id, b)] = await writers.started[1].received(3)
        assert [type(a).__name__, type(b).__name__] == ["Advance", "Record"], (a, b)
        writers.started[1].other.sendall(frame(a_id, Done("sha256:next")) + frame(b_id, Done("sha256:other")))
        assert await answers is None
        await repeat
        await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_closing_while_no_writer_runs_calls_back_the_verdicts_that_wait_for_one(url: str) -> None:
    """A kept verdict waits for a writer that keeps dying at its start (none is running between two starts) when
    the proxy stops: closing fails it on the event loop, so that its callback (the handler's) runs."""
    writers: list[DeadAtStart] = []

    def start() -> DeadAtStart:
        writers.append(DeadAtStart())
        return writers[-1]

    async def go() -> None:
        client = JournalClient(Setup(url, log_level="error"), start)
        answers: asyncio.Future = asyncio.get_running_loop().create_future()
        client.advance_now("op_kept", State.SUBMITTED, State.SUCCEEDED, {"who": "me"}, {}, None, answers.set_result, answered=True)
        for _ in range(1000):  # its first writer started and died: the next start waits for a pause (bounded)
            if writers and client._link is None:
                break
            await asyncio.sleep(0.005)
        assert writers and client._link is None and not answers.done()
        await client.aclose()
        try:
            error = await asyncio.wait_for(answers, 5)
        except TimeoutError:
            pytest.fail("closing did not call back the verdict that waited for a writer")
        assert isinstance(error, WriterLostError) and "was stopped" in str(error)

    asyncio.run(asyncio.wait_for(go(), 30))
