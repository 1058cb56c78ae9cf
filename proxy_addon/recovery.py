"""Proxy instances: register, heartbeat, and recover the receipts of instances that died.

A SIGKILLed proxy cannot say it stopped. Its heartbeat goes stale, and any live instance then turns its
`submitted` receipts into outcome_unknown (the request may have reached the upstream) and its `planned`
ones into rejected/not_sent (it never sent them). On the same machine a dead instance is known at once,
by its pid; elsewhere, after `instance_dead_after` without a heartbeat (database time is the reference).
"""

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.log import get_logger
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.recovery")


def new_instance_id() -> str:
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_namespace() -> str:
    """Host name, boot and pid namespace: where two instances with this same value can see each other's pids."""
    parts = [socket.gethostname()[:128]]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(path) if path.endswith("/pid") else Path(path).read_text().strip()[:36])
        except OSError:
            parts.append("?")
    return "/".join(parts)[:255]


class InstanceLiveness:
    def __init__(
        self,
        store: ReceiptStore,
        instance_id: str,
        heartbeat_interval: float,
        dead_after: float,
        in_flight: Callable[[], frozenset[str]] | None = None,
    ):
        self.store = store
        self.in_flight = in_flight
        self.instance_id = instance_id
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self.hostname = process_namespace()
        self.beat_at: float | None = None  # time.monotonic() when the last heartbeat that committed began
        self.gaps = 0  # heartbeats that committed more than `stall_limit` after the one before

    def register(self) -> None:
        started = time.monotonic()
        self.store.instances.register(self.instance_id, self.hostname, os.getpid())
        self.beat_at = started

    def beat(self) -> None:
        started = time.monotonic()
        self.store.instances.heartbeat(self.instance_id)
        if self.beat_at is not None and time.monotonic() - self.beat_at > self.stall_limit:
            self.gaps += 1  # another instance may have taken this one for dead meanwhile
        self.beat_at = started

    def mark(self) -> int:
        return self.gaps

    def lost_since(self, mark: int) -> bool:
        """Whether another instance may have taken this one for dead since `mark` (taken before a receipt was
        handed to the journal), or may before a write sent now is done: a gap in the heartbeats since, or the
        last one began more than `stall_limit` ago (the process was frozen: the monotonic clock goes on
        meanwhile; or its heartbeats fail). Then the receipt may have been recovered (outcome_unknown,
        then settled by a read that finds nothing: safe_to_retry), and its write must not be sent."""
        stale = self.beat_at is not None and time.monotonic() - self.beat_at > self.stall_limit
        return stale or self.gaps != mark

    @property
    def stall_limit(self) -> float:
        """How long without a heartbeat is a stall: instance_dead_after less one heartbeat interval (the time a
        write sent now has before a replica may take this instance for dead), and never under half of it."""
        return max(self.dead_after - self.heartbeat_interval, self.dead_after / 2)

    def stop(self) -> None:
        self.store.instances.stop(self.instance_id)

    def sweep(self) -> int:
        """Recover every dead instance's in-flight receipts; returns how many receipts changed."""
        known_dead = []
        if "?" not in self.hostname.split("/"):
            known_dead = [
                iid
                for iid, pid in self.store.instances.on_host(self.hostname)
                if iid != self.instance_id and not pid_alive(pid)
            ]
        changed = 0
        for dead in self.store.instances.dead(self.instance_id, self.dead_after, known_dead):
            for r in self.store.instances.recover(dead, by=self.instance_id):
                changed += 1
                log.warning(
                    "receipt_recovered",
                    operation_id=r.operation_id,
                    dead_instance=dead,
                    from_state=r.from_state,
                    to_state=r.to_state,
                )
        return changed

    async def sweep_own_orphans(self, executor: Executor, in_flight: Callable[[], frozenset[str]]) -> int:
        """This live instance's receipts that no request works on any more (a verdict that could not be written).

        The in-flight snapshot is taken after the database was read: a request still working on a listed
        receipt is then in the snapshot, and one that finished in between has moved it on, so the
        compare-and-set skips it. A request started later is not in the list at all."""
        loop = asyncio.get_running_loop()
        unsettled = await loop.run_in_executor(executor, self.store.instances.unsettled_of, self.instance_id)
        if not unsettled:
            return 0
        busy = in_flight()
        orphans = [(op, state) for op, state in unsettled if op not in busy]
        recovered = await loop.run_in_executor(executor, self.store.instances.settle_orphans, self.instance_id, orphans)
        for r in recovered:
            log.warning("receipt_orphan_settled", operation_id=r.operation_id, from_state=r.from_state, to_state=r.to_state)
        return len(recovered)

    async def run(self, executor: Executor) -> None:
        """Heartbeat and sweep forever; a database outage is logged and retried, never fatal."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(executor, self.beat)
                await loop.run_in_executor(executor, self.sweep)
                if self.in_flight is not None:
                    await self.sweep_own_orphans(executor, self.in_flight)
            except JournalUnavailableError as e:
                log.error("heartbeat_failed", error=str(e))
            await asyncio.sleep(self.heartbeat_interval)
