"""The journal writer: a process of its own that commits the proxy's hot-path writes, many to a commit.

Why a process: under load the proxy's event loop has one core, and its throughput is that core divided by its
CPU per request. A writer thread shares the proxy's GIL, so journal work in it still costs the proxy's core;
only another process takes it off. The proxy starts this one (client.py), hands it
one end of a socketpair, and restarts it if it dies.

Group commit: the writer reads every request waiting on its socket, runs them in one transaction (one fsync on
SQLite, one WAL flush on PostgreSQL), commits, and only then answers them. If the transaction fails, none of
it committed: each request then runs alone in a transaction of its own, so that one bad request fails alone
and the others are still written.

Nothing stale: each record carries the moment past which its proxy no longer waits for it (its
journal_timeout). One that is past it is not written, and a batch is not committed once one of its records is
past it; the proxy answers such a write 503 and sends nothing. (A writer that stops answering is killed by its
proxy anyway: client.py.) A verdict (an Advance) has no such moment and is never expired: it is what the
upstream answered, and its agent may have been told it already (request/handler.py, answer first).

Orphaned (its proxy died): what it holds of records is dropped, since nobody will send what they record, and
the verdicts are still committed, since the upstream did answer them. A verdict whose receipt a recovery made
`outcome_unknown` first (it took the proxy for dead: `proxy_interrupted`) replaces that guess (`_applied`).

    python -m proxy_addon.journal.writer --fd N    (the proxy runs this; the first frame says which database)
"""

import argparse
import math
import os
import socket
import sys
import time
from typing import Any

from proxy_addon.db import database_wait
from proxy_addon.exceptions import JournalUnavailableError, ReceiptNotFoundError, StaleStateError
from proxy_addon.journal.connection import DriverConnection
from proxy_addon.journal.driver import OnDriver
from proxy_addon.journal.messages import (
    Advance,
    AwaitingApproval,
    Blocked,
    Done,
    Failed,
    Ready,
    Record,
    Reply,
    Setup,
    frame,
    split_frames,
)
from proxy_addon.journal.rows import NewReceipt, Step
from proxy_addon.journal.writes import JournalWrites
from proxy_addon.log import DeferredLogger
from proxy_addon.rules.records import ApprovalRecord
from proxy_addon.rules.states import State, is_allowed

log = DeferredLogger("receipts.journal_writer")  # structlog loaded at the first line, if any: see log.py
RECEIVE_SIZE = 1 << 18
TOO_LATE = "the write waited longer than proxy.journal_timeout, so it was not written"
EXPIRED = f"cannot write the journal: {TOO_LATE}"


class ExpiredError(Exception):
    """A record of the batch is past its deadline: nobody waits for its answer any more."""


class OrphanedError(Exception):
    """The proxy died while the batch ran: its records are not to be committed (nobody will send them)."""


class JournalWriter:
    def __init__(self, database_url: str, max_batch: int, wait: float | None = None):
        self.connection = DriverConnection(database_url, wait)
        self.max_batch = max_batch
        self.proxy_pid = os.getppid()

    def serve(self, sock: socket.socket, buffer: bytearray, requests: list[tuple[int, Any]]) -> None:
        """Answer `requests`, then what comes, until the proxy closes its end (it stopped, or died)."""
        chunk = memoryview(bytearray(RECEIVE_SIZE))
        listening = True
        while True:
            for start in range(0, len(requests), self.max_batch):
                replies = self.run(requests[start : start + self.max_batch])
                if listening:
                    try:
                        sock.sendall(b"".join(frame(request_id, reply) for request_id, reply in replies))
                    except OSError:  # the proxy is gone: what it sent before it died is still committed
                        listening = False
            if not _receive(sock, buffer, chunk):
                return
            requests = split_frames(buffer)

    def run(self, batch: list[tuple[int, Any]]) -> list[tuple[int, Reply]]:
        """Every request of `batch` in one transaction, answered after its COMMIT; alone each if that fails.
        Records past their deadline are answered as not written, and are not; an orphan writes no record."""
        if self._orphaned():
            batch = [(request_id, request) for request_id, request in batch if isinstance(request, Advance)]
            if not batch:
                return []
        now = time.monotonic()
        late = [(request_id, Failed("unavailable", EXPIRED)) for request_id, request in batch if _expired(request, now)]
        if late:
            live = [(request_id, request) for request_id, request in batch if not _expired(request, now)]
            log.warning("journal_writes_expired", requests=len(late))
            return late + (self.run(live) if live else [])
        deadline = min((r.deadline for _, r in batch if isinstance(r, Record)), default=math.inf)  # no wait lasts past it
        try:
            alone = len(batch) == 1 and _one_statement(batch[0][1])
            with self.connection.transaction(alone=alone, within=deadline - now) as conn:
                self._check_orphaned(batch)
                journal = JournalWrites.on(OnDriver(conn), self.connection.statements)
                writes = [_write_of(request) for _, request in batch]
                sent = journal.pipelined(writes)
                replies = [
                    (request_id, _applied(journal, write, first, request))
                    for (request_id, request), write, first in zip(batch, writes, sent, strict=True)
                ]
                self._check_orphaned(batch)
                if conn.autocommit is not True and time.monotonic() >= deadline:
                    raise ExpiredError(TOO_LATE)  # not committed: each runs alone again, and the late one is refused
                return replies
        except OrphanedError:
            return self.run(batch)  # its verdicts alone
        except Exception as e:  # noqa: BLE001 - nothing of the batch committed: say why, to each or one by one
            reason = _one_line(e)
            if len(batch) == 1 or not self.connection.usable or _waited_too_long(e):
                log.error("journal_write_failed", requests=len(batch), error=reason)
                return [(request_id, Failed("unavailable", f"cannot write the journal: {reason}")) for request_id, _ in batch]
            return [reply for item in batch for reply in self.run([item])]

    def _orphaned(self) -> bool:
        return os.getppid() != self.proxy_pid

    def _check_orphaned(self, batch: list[tuple[int, Any]]) -> None:
        """The proxy died: nobody will send what this batch records, so none of its records is committed."""
        if self._orphaned() and any(isinstance(request, Record) for _, request in batch):
            raise OrphanedError

    def close(self) -> None:
        self.connection.close()


def _one_statement(request: Record | Advance) -> bool:
    """Whether the request writes with one statement (on PostgreSQL), so that alone it may run in autocommit:
    every write but one needing approval, whose use of the approval and receipt must commit together."""
    return not (isinstance(request, Record) and request.approval is not None)


def _write_of(request: Record | Advance) -> NewReceipt | Step:
    if isinstance(request, Record):
        return NewReceipt(request.intent, request.successes_block_for, request.who, approval=request.approval)
    return Step(request.operation_id, request.expected_from, request.to, request.detail, request.updates, head=request.head)


def _expired(request: Record | Advance, now: float) -> bool:
    return isinstance(request, Record) and request.deadline <= now


def _applied(journal: JournalWrites, write: NewReceipt | Step, sent: Any, request: Record | Advance) -> Reply:
    """`_apply`; and a verdict its agent was given, found `outcome_unknown` by a recovery's guess (its proxy
    seemed dead before the verdict committed: a SIGSTOPped or orphaned writer), replaces the guess: the
    upstream's answer is the fact, and the journal must not contradict what the agent was told."""
    reply = _apply(journal, write, sent)
    if not (isinstance(request, Advance) and request.answered and isinstance(reply, Failed) and reply.actual == State.OUTCOME_UNKNOWN.value):
        return reply
    if request.to == State.OUTCOME_UNKNOWN.value:
        return Done()  # the guess is what the agent was told
    if not is_allowed(State.OUTCOME_UNKNOWN, State(request.to)) or not isinstance(write, Step):
        return reply  # a rejection, which commits before its answer: its agent was told nothing yet

    detail = {**write.detail, "replaces": "recovery's outcome_unknown: this verdict, the upstream's answer, committed late"}
    updates = {"error_code": None, "error_message": None, **write.updates}  # the guess's error is not the verdict's
    correction = Step(write.operation_id, State.OUTCOME_UNKNOWN.value, write.to, detail, updates)
    return _apply(journal, correction, None)


def _apply(journal: JournalWrites, write: NewReceipt | Step, sent: Any) -> Reply:
    """One write inside the batch's transaction; what it may refuse is answered, any other error fails the batch."""
    try:
        if isinstance(write, NewReceipt):
            recorded = journal.record(write, sent)
            if isinstance(recorded, ApprovalRecord):
                return AwaitingApproval(recorded)
            return Done(recorded) if isinstance(recorded, str) else Blocked(recorded)
        return Done(journal.advance(write, sent))
    except StaleStateError as e:
        return Failed("stale", str(e), e.actual)
    except ReceiptNotFoundError as e:
        return Failed("not_found", str(e))
    except JournalUnavailableError as e:
        return Failed("unavailable", str(e))


def _receive(sock: socket.socket, buffer: bytearray, chunk: memoryview) -> bool:
    """Wait for bytes, then take what else is there already without waiting; False once the proxy closed its end.
    `chunk` is reused: a fresh buffer for each receive would cost an allocation of its size."""
    n = sock.recv_into(chunk)
    if n == 0:
        return False
    buffer += chunk[:n]
    while True:
        try:
            n = sock.recv_into(chunk, len(chunk), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        if n == 0:
            return True  # the end of the socket: the next wait sees it
        buffer += chunk[:n]


def _waited_too_long(e: BaseException) -> bool:
    """The batch failed waiting (a lock held elsewhere, a statement or deadline timeout), not on a bad request:
    running its requests one by one would only wait again."""
    if isinstance(e, ExpiredError):
        return False  # the late request is refused, the others run again
    cause = getattr(e, "orig", None) or e
    if getattr(cause, "sqlstate", None) in ("55P03", "57014"):  # lock_not_available, query_canceled
        return True
    return "database is locked" in str(cause)  # SQLite's busy timeout


def _one_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _setup_frame(sock: socket.socket, buffer: bytearray) -> tuple[Setup, list[tuple[int, Any]]]:
    """The setup the proxy sends first, and the requests that came with it."""
    while True:
        if not _receive(sock, buffer, memoryview(bytearray(4096))):
            raise SystemExit(0)
        frames = split_frames(buffer)
        if frames:
            _, setup = frames[0]
            if not isinstance(setup, Setup):
                raise SystemExit(f"journal writer: the first frame must be its setup, not {type(setup).__name__}")
            return setup, frames[1:]


def serve_socket(sock: socket.socket, configure_log: bool) -> None:
    """Read the setup frame, then serve: what the process runs, and what a test runs in a thread."""
    buffer = bytearray()
    setup, requests = _setup_frame(sock, buffer)
    if configure_log:
        log.configure(setup.log_level, setup.log_format)
    writer = JournalWriter(setup.database_url, setup.max_batch, database_wait(setup.journal_timeout))
    sock.sendall(frame(0, Ready()))
    try:
        writer.serve(sock, buffer, requests)
    finally:
        writer.close()
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy_addon.journal.writer", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="this process's end of the proxy's socketpair")
    args = parser.parse_args(argv)
    serve_socket(socket.socket(fileno=args.fd), configure_log=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
