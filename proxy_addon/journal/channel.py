"""The proxy's channel to its journal writer: started on first use, each request framed onto their socket and
its answer read back and matched, a writer that dies or stops answering replaced, kept verdicts handed to the
next one first. journal/client.py (JournalClient, the hot path's calls over it) says why it behaves so.
"""

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy_addon import metrics
from proxy_addon.exceptions import JournalTimeoutError, JournalUnavailableError, WriterLostError
from proxy_addon.journal.links import WriterLink, WriterProcess, stop_link
from proxy_addon.journal.messages import HEADER_SIZE, Advance, Ready, Record, Reply, Setup, body_size, frame, unframe
from proxy_addon.log import get_logger

log = get_logger("receipts.proxy")
MAX_PAUSE = 5.0  # seconds between the starts of a writer that keeps dying before its first answer
WRITER_START_TIMEOUT = 30.0  # seconds: a writer not ready by then is killed (its start-up is ~1 s of CPU)
VERDICT_RESTART_PAUSE = 0.25  # seconds between the starts of a writer for kept verdicts while none will start


@dataclass(slots=True)
class _Held:
    """A request handed to the writer and not answered yet."""

    request: Record | Advance
    answered: "asyncio.Future[Reply]"
    sent: float  # time.monotonic()
    abandoned: bool = False  # its caller's time ran out: its answer, if it comes, is nobody's
    kept: bool = False  # a verdict of advance_now: handed to the next writer if this one is lost


class WriterChannel:
    """The proxy's end of its journal writer (journal/client.py says how it behaves): `_call` hands a request over
    and waits for its answer; the writer is started on first use, watched, replaced when lost."""

    def __init__(self, setup: Setup, start: Callable[[], WriterLink] = WriterProcess):
        self.setup = setup
        self.timeout = setup.journal_timeout  # proxy.journal_timeout: the longest a request waits for its answer
        self._start = start
        self._link: WriterLink | None = None
        self._stream: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, _Held] = {}  # in the order sent: the first is the oldest
        self._watchdog: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)  # 0 is the setup's and the writer's Ready
        self._answered = False  # the current writer answered a request: it got past its start
        self._ready: asyncio.Future[None] | None = None  # resolved by the writer's Ready frame
        self._quick_deaths = 0
        self._paused_until = 0.0
        self._reader: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[asyncio.StreamWriter] | None = None
        self._unsent: list[_Held] = []  # kept verdicts waiting for a writer: the first frames of the next one
        self._restarting: asyncio.Task[None] | None = None
        self.closed = False
        metrics.WRITER_PENDING.set_function(lambda: len(self._pending))

    def start_soon(self) -> None:
        """Start the writer now, on this event loop, rather than with the first write: its start-up (a new
        Python importing the database layer) then overlaps the proxy's own instead of delaying that write."""
        task = asyncio.get_running_loop().create_task(self._connected())
        task.add_done_callback(_retrieve)  # a failed start is the first write's to report

    # -- the writer's life ------------------------------------------------------------------------------------

    async def _call(self, request: Record | Advance, give_up: float) -> Reply:
        """`request`'s answer; past `give_up` (time.monotonic()), JournalUnavailableError (not handed over) or
        JournalTimeoutError (handed over, and not answered)."""
        stream = await self._stream_by(give_up)
        if stream is not self._stream:  # the writer died between its start and now: nobody would answer
            raise WriterLostError("cannot write the journal: the journal writer stopped as it started")
        held = _Held(request, asyncio.get_running_loop().create_future(), time.monotonic())
        self._send(stream, held)
        return await self._answer_of(held, give_up)

    def _send(self, stream: asyncio.StreamWriter, held: _Held) -> None:
        """Write the held request's frame to the running writer's stream; it is pending until answered."""
        request_id = next(self._ids)
        held.sent = time.monotonic()
        self._pending[request_id] = held
        stream.write(frame(request_id, held.request))
        if self._watchdog is None and self._link is not None:
            self._watch_from(self._link, held.sent + self.timeout)

    def _restart_for_verdicts(self) -> None:
        """Start a writer for the kept verdicts now, rather than with the next record: again after each pause
        while the writer keeps failing, until they are handed over or the client is closed."""
        if self._restarting is not None and not self._restarting.done():
            return
        self._restarting = asyncio.get_running_loop().create_task(self._hand_over_unsent())
        self._restarting.add_done_callback(_retrieve)

    async def _hand_over_unsent(self) -> None:
        while self._unsent and not self.closed:
            try:
                await self._connected()  # _open hands them over first
            except JournalUnavailableError as e:
                log.warning("verdicts_wait_for_journal_writer", verdicts=len(self._unsent), error=str(e))
                await asyncio.sleep(max(self._paused_until - time.monotonic(), VERDICT_RESTART_PAUSE))

    async def _answer_of(self, held: _Held, give_up: float) -> Reply:
        answered = held.answered
        try:
            async with asyncio.timeout(give_up - time.monotonic()):
                return await asyncio.shield(answered)
        except TimeoutError:
            if answered.done():
                return answered.result()
            held.abandoned = True
            raise JournalTimeoutError(
                f"cannot write the journal: the journal writer did not answer within proxy.journal_timeout ({self.timeout:g}s)"
            ) from None

    async def _stream_by(self, give_up: float) -> asyncio.StreamWriter:
        """The running writer's stream at once (the usual case: no timer), else `_connected()` until `give_up`."""
        stream = self._stream
        if stream is not None and self._loop is asyncio.get_running_loop():
            return stream
        try:
            async with asyncio.timeout(give_up - time.monotonic()):
                return await self._connected()
        except TimeoutError:
            raise JournalUnavailableError(
                f"cannot write the journal: the journal writer did not start within proxy.journal_timeout ({self.timeout:g}s)"
            ) from None

    def _watch_from(self, link: WriterLink, when: float) -> None:
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(max(0.0, when - time.monotonic()), self._watch, link)

    def _watch(self, link: WriterLink) -> None:
        """Kill the writer if it has held its oldest request for proxy.journal_timeout; else look again then."""
        self._watchdog = None
        oldest = next(iter(self._pending.values()), None)
        if link is not self._link or oldest is None:
            return
        if time.monotonic() >= oldest.sent + self.timeout:
            self._unresponsive(link)
        else:
            self._watch_from(link, oldest.sent + self.timeout)

    async def _connected(self) -> asyncio.StreamWriter:
        """The stream to the running writer; the first caller after a stop starts one, the others wait for it."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            if self._stream is not None:
                return self._stream
            if self._connecting is not None:
                return await asyncio.shield(self._connecting)
        if self._link is not None:  # started on another event loop (the in-process tests run one per request)
            self._end(self._link, keep_verdicts=True)
        if time.monotonic() < self._paused_until:
            raise JournalUnavailableError(
                f"cannot write the journal: the journal writer keeps stopping; next start in {self._paused_until - time.monotonic():.1f}s"
            )
        link = self._start()
        self._link, self._loop, self._answered = link, loop, False
        metrics.WRITER_STARTS.inc()
        self._connecting = loop.create_task(self._open(link))
        self._connecting.add_done_callback(_retrieve)  # its callers may have stopped waiting (their timeout)
        return await asyncio.shield(self._connecting)

    async def _open(self, link: WriterLink) -> asyncio.StreamWriter:
        """Connect, hand the writer its setup, and wait until it is ready (WRITER_START_TIMEOUT at most)."""
        try:
            reader, stream = await asyncio.open_unix_connection(sock=link.sock)
        except OSError as e:
            if link is self._link:
                self._connecting = None
                self._end(link, keep_verdicts=True)
            raise WriterLostError(f"cannot write the journal: cannot reach the journal writer ({e})") from e
        stream.write(frame(0, self.setup))
        if link is not self._link:
            stream.close()
            raise WriterLostError("cannot write the journal: the journal writer was restarted")
        loop = asyncio.get_running_loop()
        ready = self._ready = loop.create_future()
        self._reader = loop.create_task(self._read(reader, link))
        try:
            async with asyncio.timeout(WRITER_START_TIMEOUT):
                await ready
        except TimeoutError:
            if link is self._link:
                self._unresponsive(link, f"did not finish its start within {WRITER_START_TIMEOUT:g}s")
            raise WriterLostError("cannot write the journal: the journal writer did not start") from None
        if link is not self._link:
            stream.close()
            raise WriterLostError("cannot write the journal: the journal writer was restarted")
        unsent, self._unsent = self._unsent, []
        for held in unsent:  # the kept verdicts first: anything handed over from now on is written after them
            self._send(stream, held)
        self._stream, self._connecting = stream, None
        return stream

    async def _read(self, reader: asyncio.StreamReader, link: WriterLink) -> None:
        try:
            while True:
                header = await reader.readexactly(HEADER_SIZE)
                request_id, reply = unframe(await reader.readexactly(body_size(header)))
                if isinstance(reply, Ready):
                    if self._ready is not None and not self._ready.done() and link is self._link:
                        self._ready.set_result(None)
                    continue
                self._answered = True
                held = self._pending.pop(request_id, None)
                if held is None:
                    continue
                if held.abandoned:
                    self._answered_late(held, reply)
                elif not held.answered.done():
                    held.answered.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        if link is self._link:
            self._lost(link)

    def _lost(self, link: WriterLink) -> None:
        how = link.ended()
        metrics.WRITER_RESTARTS.labels("died").inc()
        self._stopped(link, how)

    def _unresponsive(self, link: WriterLink, why: str = "") -> None:
        """The writer holds a request past proxy.journal_timeout (or never finished its start): kill it."""
        why = why or f"held a write longer than proxy.journal_timeout ({self.timeout:g}s)"
        link.kill()
        metrics.WRITER_RESTARTS.labels("unresponsive").inc()
        self._stopped(link, f"killed: it {why}")

    def _stopped(self, link: WriterLink, how: str) -> None:
        self._quick_deaths = 0 if self._answered else self._quick_deaths + 1
        pause = min(MAX_PAUSE, 0.25 * 2 ** (self._quick_deaths - 1)) if self._quick_deaths else 0.0
        self._paused_until = time.monotonic() + pause
        records = sum(isinstance(held.request, Record) for held in self._pending.values())
        log.error(
            "journal_writer_stopped",
            how=how,
            unanswered_records=records,  # answered 503, not sent
            unanswered_verdicts=len(self._pending) - records,  # handed to the next writer first
            restart_in_seconds=pause,
        )
        self._end(link, WriterLostError(f"cannot write the journal: the journal writer stopped ({how})"), keep_verdicts=True)

    def _end(self, link: WriterLink, error: JournalUnavailableError | None = None, keep_verdicts: bool = False) -> None:
        """`_detach`, then the writer stopped: killed if it held a record, which it must not commit after its
        caller was failed (a receipt for a write answered 503 and never sent would block the retry it invites)."""
        stop_link(link, self._detach(link, error, keep_verdicts))
        if self._unsent:  # kept verdicts: a new writer for them now, not with the next write
            self._restart_for_verdicts()

    def _detach(self, link: WriterLink, error: JournalUnavailableError | None, keep_verdicts: bool) -> bool:
        """Fail what the writer held (its kept verdicts wait for the next one when `keep_verdicts`) and let go of
        it, on the event loop; whether it held a record."""
        error = error or WriterLostError("cannot write the journal: the journal writer was restarted")
        held_record = False
        for held in self._pending.values():
            if held.abandoned or held.answered.done():
                continue
            held_record = held_record or isinstance(held.request, Record)
            if keep_verdicts and held.kept and not held.answered.get_loop().is_closed():
                self._unsent.append(held)
                continue
            with contextlib.suppress(RuntimeError):  # its event loop is closed already (the in-process tests)
                held.answered.set_exception(error)
        self._pending.clear()
        if not keep_verdicts:
            self._fail_unsent(error)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._ready is not None and not self._ready.done():
            with contextlib.suppress(RuntimeError):  # its event loop is closed already (the in-process tests)
                self._ready.set_exception(error)
                self._ready.exception()  # retrieved: nobody may be waiting on it
        if self._stream is not None:
            with contextlib.suppress(RuntimeError):  # its event loop is closed already (the in-process tests)
                self._stream.close()
        self._link = self._stream = self._loop = self._connecting = self._ready = None
        return held_record

    def _fail_unsent(self, error: JournalUnavailableError) -> None:
        unsent, self._unsent = self._unsent, []
        for held in unsent:
            if not held.answered.done():
                with contextlib.suppress(RuntimeError):
                    held.answered.set_exception(error)

    async def aclose(self) -> None:
        """`close`, with the futures failed on this event loop (their callbacks are the handler's) and only the
        wait for the writer's exit on a thread."""
        self.closed = True
        error = WriterLostError("cannot write the journal: the journal writer was stopped")
        link = self._link
        if link is None:
            self._fail_unsent(error)
            return
        held_record = self._detach(link, error, keep_verdicts=False)
        await asyncio.to_thread(stop_link, link, held_record)

    def close(self) -> None:
        """Stop the writer (it finishes the verdicts it holds, then exits; killed if it holds a record); what it
        has not answered fails as not written. From the event loop's thread, or once that loop has stopped."""
        self.closed = True
        if self._link is not None:
            self._end(self._link, WriterLostError("cannot write the journal: the journal writer was stopped"))
        else:
            self._fail_unsent(WriterLostError("cannot write the journal: the journal writer was stopped"))

    def _answered_late(self, held: _Held, reply: Reply) -> None:
        """What to do with an answer that came after its caller gave up (JournalClient closes such a receipt)."""


def _retrieve(task: "asyncio.Task[Any]") -> None:
    if not task.cancelled():
        task.exception()
