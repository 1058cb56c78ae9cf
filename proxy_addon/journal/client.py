"""The proxy's side of its journal writer: starts it, hands it the hot path's writes, restarts it when it dies.

Calls are made on the proxy's event loop: a request is a frame written to the socket, its answer a future the
reader task resolves. No thread hand-off, no database work in the proxy's process.

The writer's death is the journal's failure. Every record it had not answered fails at once with
WriterLostError (the proxy answers 503 and sends nothing upstream; whether the writer committed it before it
died is not known, request/handler.py closes such a receipt itself). A verdict handed over with `advance_now` is
not failed: it is kept, a new writer is started for it at once, and it goes first on the new writer's socket,
before any record, so that a repeat journaled after it still sees it. The next request starts a new writer too;
one that keeps dying before it answered anything is started again only after a growing pause, during which
records fail closed at once (verdicts wait for it).

No request waits longer than proxy.journal_timeout: then it fails (JournalTimeoutError: 503, not sent), and
the writer, which checks each request's deadline before it writes and before it commits, does not write it
after (writer.py); if its commit crossed the deadline, the late answer closes the receipt as not sent. A writer
that stops answering (stopped, looping, waiting on a lock) is found by the same clock: one that has held a
request for proxy.journal_timeout is killed (SIGKILL: it cannot wake up later and act on what it held), and
what it held fails as if it had died. A writer not ready within WRITER_START_TIMEOUT is killed too.
"""

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from proxy_addon import metrics
from proxy_addon.exceptions import (
    ApprovalNeededError,
    DuplicateIntentError,
    IllegalTransitionError,
    JournalTimeoutError,
    JournalUnavailableError,
    ReceiptNotFoundError,
    ReceiptsError,
    StaleStateError,
    WriterLostError,
)
from proxy_addon.journal.messages import (
    HEADER_SIZE,
    Advance,
    AwaitingApproval,
    Blocked,
    Done,
    Failed,
    Ready,
    Record,
    Reply,
    Setup,
    body_size,
    frame,
    unframe,
)
from proxy_addon.log import get_logger
from proxy_addon.rules.approvals import ApprovalAsk
from proxy_addon.rules.duplicates import successes_block_for
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Intent
from proxy_addon.rules.states import State, is_allowed
from proxy_addon.rules.verdicts import not_sent

log = get_logger("receipts.proxy")
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
MAX_PAUSE = 5.0  # seconds between the starts of a writer that keeps dying before its first answer
# Shares of proxy.journal_timeout: the writer is asked to answer within 80 % of it (it writes nothing after:
# writer.py), the caller gives up at 90 %, and the rest is for closing a receipt that may have been committed
# (request/handler.py). A writer that has held a request for the whole timeout is killed.
WRITER_SHARE = 0.8
CALLER_SHARE = 0.9
WRITER_START_TIMEOUT = 30.0  # seconds: a writer not ready by then is killed (its start-up is ~1 s of CPU)
VERDICT_RESTART_PAUSE = 0.25  # seconds between the starts of a writer for kept verdicts while none will start


class WriterLink(Protocol):
    """A started writer: the proxy's end of their socketpair, and how to tell and end the writer's life."""

    sock: socket.socket

    def ended(self) -> str: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...


class WriterProcess:
    """The writer as a child process: `python -m proxy_addon.journal.writer`, given its end of a socketpair."""

    def __init__(self) -> None:
        self.sock, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        # -P: not the working directory first on the path, so that the writer runs this very proxy_addon
        cmd = [sys.executable, "-P", "-m", "proxy_addon.journal.writer", "--fd", str(child.fileno())]
        try:
            self.process = subprocess.Popen(cmd, pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            child.close()

    def ended(self) -> str:
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "its socket closed"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def stop(self) -> None:
        self.sock.close()  # the writer reads the end of its socket, finishes what it holds, and exits
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, which ends a stopped process too, and wait for it: nothing it held can be committed after."""
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.sock.close()


class WriterThread:
    """The writer's same loop in a thread of this process (the in-process tests; never the proxy's choice)."""

    def __init__(self) -> None:
        from proxy_addon.journal.writer import serve_socket

        self.sock, child = socket.socketpair()
        self.thread = threading.Thread(target=serve_socket, args=(child, False), name="receipts-journal-writer", daemon=True)
        self.thread.start()

    def ended(self) -> str:
        return "its thread ended"

    def stop(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)

    def kill(self) -> None:
        self.sock.close()  # a thread cannot be killed; its requests carry their deadlines (writer.py)


@dataclass(slots=True)
class _Held:
    """A request handed to the writer and not answered yet."""

    request: Record | Advance
    answered: "asyncio.Future[Reply]"
    sent: float  # time.monotonic()
    abandoned: bool = False  # its caller's time ran out: its answer, if it comes, is nobody's
    kept: bool = False  # a verdict of advance_now: handed to the next writer if this one is lost


class JournalClient:
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

    # -- the hot path's two calls -----------------------------------------------------------------------------

    async def record(
        self, intent: Intent, after_success: AfterSuccess, who: str, approval: ApprovalAsk | None = None
    ) -> str | None:
        """Decide and commit the receipt as `submitted` (creation and `planned -> submitted` rows, one commit);
        its history head, for the verdict's `advance`.

        Raises DuplicateIntentError (nothing written), ApprovalNeededError (no receipt: `approval` asks for a
        person's approval, and there is none usable), JournalUnavailableError (nothing written), or
        WriterLostError (the writer died or was killed first: it may have committed it, or not)."""
        now = time.monotonic()
        request = Record(intent, successes_block_for(after_success), who, now + self.timeout * WRITER_SHARE, approval)
        reply = await self._call(request, now + self.timeout * CALLER_SHARE)
        if isinstance(reply, Blocked):
            raise DuplicateIntentError.of(reply.blocker, intent)
        if isinstance(reply, AwaitingApproval):
            raise ApprovalNeededError(reply.approval, intent)
        _raise_failure(reply, intent.operation_id)
        metrics.transitioned(State.PLANNED)
        metrics.transitioned(State.SUBMITTED)
        return reply.head if isinstance(reply, Done) else None

    async def advance(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None = None,
    ) -> None:
        """`store.receipts.transition`, through the writer: compare-and-set with its history row, one commit
        (journal/writes.py, `advance`). `head`: the history head `record` returned (None: the writer reads it)."""
        request, give_up = self._advance_request(operation_id, expected_from, to, detail, updates, head)
        reply = await self._call(request, give_up)
        _raise_failure(reply, operation_id, expected_from.value)
        metrics.transitioned(to)

    def advance_now(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None,
        then: Callable[[ReceiptsError | None], None],
        answered: bool = False,
    ) -> None:
        """`advance`, handed over before this returns: whatever this client hands over after it, the writer
        commits after it (one socket, read in order). With no writer running, or if the writer is lost before
        it answers, it is kept and is the first thing the next writer is handed (one is started for it at
        once), so the order holds across restarts. `then(error)` once the writer has answered: None when
        committed, else what `advance` would have raised (JournalUnavailableError: the journal could not write
        it; the caller may hand it over again). A callback, not a task: it is on every journaled write's path
        (docs/performance.md). `answered`: its agent was given this verdict (messages.Advance)."""
        request, _ = self._advance_request(operation_id, expected_from, to, detail, updates, head, answered)
        loop = asyncio.get_running_loop()
        held = _Held(request, loop.create_future(), time.monotonic(), kept=True)

        def replied(reply: "asyncio.Future[Reply]") -> None:
            try:
                _raise_failure(reply.result(), operation_id, expected_from.value)
            except ReceiptsError as e:
                then(e)
                return
            metrics.transitioned(to)
            then(None)

        held.answered.add_done_callback(replied)
        if self.closed:
            held.answered.set_exception(WriterLostError("cannot write the journal: the journal writer was stopped"))
            return
        stream = self._stream
        if stream is not None and self._loop is loop:
            self._send(stream, held)
        else:
            self._unsent.append(held)
            self._restart_for_verdicts()

    def _advance_request(
        self,
        operation_id: str,
        expected_from: State,
        to: State,
        detail: dict[str, Any],
        updates: dict[str, Any],
        head: str | None,
        answered: bool = False,
    ) -> tuple[Advance, float]:
        if not is_allowed(expected_from, to):
            raise IllegalTransitionError(f"{expected_from.value} -> {to.value} is not an allowed transition")
        request = Advance(operation_id, expected_from.value, to.value, detail, updates, head, answered)
        return request, time.monotonic() + self.timeout * CALLER_SHARE

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

    def _answered_late(self, held: _Held, reply: Reply) -> None:
        """A receipt committed after its caller gave up (the commit crossed the deadline): it was not sent, so
        close it as not sent, through the writer, as request/handler.py does when the writer is lost."""
        request = held.request
        if not (isinstance(request, Record) and isinstance(reply, Done)):
            return
        operation_id = request.intent.operation_id
        closed = not_sent(request.who, "the journal answered after proxy.journal_timeout, so the request was not sent")

        async def close() -> None:
            try:
                await self.advance(operation_id, State.SUBMITTED, closed.state, closed.detail, closed.updates, reply.head)
            except StaleStateError:
                return  # closed already (request/handler.py)
            except ReceiptsError as e:
                log.error("unsent_receipt_left_open", operation_id=operation_id, error=str(e))
                return
            log.warning("late_receipt_closed_as_not_sent", operation_id=operation_id)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

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
        _stop_link(link, self._detach(link, error, keep_verdicts))
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
        await asyncio.to_thread(_stop_link, link, held_record)

    def close(self) -> None:
        """Stop the writer (it finishes the verdicts it holds, then exits; killed if it holds a record); what it
        has not answered fails as not written. From the event loop's thread, or once that loop has stopped."""
        self.closed = True
        if self._link is not None:
            self._end(self._link, WriterLostError("cannot write the journal: the journal writer was stopped"))
        else:
            self._fail_unsent(WriterLostError("cannot write the journal: the journal writer was stopped"))


def _stop_link(link: WriterLink, held_record: bool) -> None:
    if held_record:
        link.kill()
    else:
        link.stop()


def _retrieve(task: "asyncio.Task[Any]") -> None:
    if not task.cancelled():
        task.exception()


def _raise_failure(reply: Reply, operation_id: str, expected: str | None = None) -> None:
    if isinstance(reply, Done):
        return
    if not isinstance(reply, Failed):
        raise JournalUnavailableError(f"cannot write the journal: the writer answered {type(reply).__name__}")
    if reply.reason == "stale":
        raise StaleStateError(operation_id, expected or "", reply.actual)
    if reply.reason == "not_found":
        raise ReceiptNotFoundError(reply.message)
    raise JournalUnavailableError(reply.message)
