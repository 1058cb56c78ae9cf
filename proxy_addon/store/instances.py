"""Proxy instances in the database: register, heartbeat, stop, and settle the receipts of dead ones.

Liveness is judged by the database's clock (Database.clock), so replicas whose clocks disagree agree on
who is dead. recovery.py decides when to sweep; this module only reads and writes.
"""

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import ColumnElement, Table, exists, func, insert, or_, select, update

from proxy_addon.exceptions import StaleStateError
from proxy_addon.journal.tables import ProxyInstance
from proxy_addon.rules.records import Recovered
from proxy_addon.rules.states import State
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import StoredReceipts, receipts

instances: Table = ProxyInstance.__table__  # type: ignore[assignment]
_UNSETTLED = [State.PLANNED.value, State.SUBMITTED.value]


def _needs_recovery() -> ColumnElement[bool]:
    """Not recovered yet, or recovered and holding receipts again: an instance taken for dead (frozen past
    instance_dead_after) that woke up and took writes before its next heartbeat cleared `recovered_at`."""
    holds_unsettled = exists().where(
        receipts.c.proxy_instance == instances.c.instance_id, receipts.c.state.in_(_UNSETTLED)
    )
    return or_(instances.c.recovered_at.is_(None), holds_unsettled)


class Instances:
    def __init__(self, db: Database, receipts_: StoredReceipts):
        self.db = db
        self.receipts = receipts_

    def register(self, instance_id: str, hostname: str, pid: int) -> None:
        with self.db.writing() as conn:
            now = self.db.clock(conn)
            values = {"instance_id": instance_id, "hostname": hostname, "pid": pid, "started_at": now, "heartbeat_at": now}
            conn.execute(insert(instances).values(**values))

    def heartbeat(self, instance_id: str) -> None:
        """Also clears `recovered_at`: an instance once taken for dead (frozen, or cut off from the database
        longer than instance_dead_after) that beats again is alive, and is recovered again when it dies."""
        with self.db.writing() as conn:
            now = self.db.clock(conn)
            conn.execute(
                update(instances).where(instances.c.instance_id == instance_id).values(heartbeat_at=now, recovered_at=None)
            )

    def stop(self, instance_id: str) -> None:
        with self.db.writing() as conn:
            now = self.db.clock(conn)
            conn.execute(
                update(instances).where(instances.c.instance_id == instance_id).values(stopped_at=now, heartbeat_at=now)
            )

    def dead(self, me: str | None, dead_after: float, known_dead: Sequence[str] = ()) -> list[str]:
        """Instances that need recovery (`_needs_recovery`) and stopped, stopped heartbeating, or that the caller
        knows died."""
        with self.db.storage_errors(), self.db.reading() as conn:
            cutoff = self.db.clock(conn) - timedelta(seconds=dead_after)
            rows = conn.execute(
                select(instances.c.instance_id).where(
                    _needs_recovery(),
                    instances.c.instance_id != (me or ""),
                    (instances.c.stopped_at.is_not(None))
                    | (instances.c.heartbeat_at < cutoff)
                    | (instances.c.instance_id.in_(list(known_dead))),
                )
            ).all()
        return [r.instance_id for r in rows]

    def on_host(self, hostname: str) -> list[tuple[str, int]]:
        """(instance id, pid) of the running instances registered from this host (a process namespace)."""
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(
                select(instances.c.instance_id, instances.c.pid).where(
                    instances.c.hostname == hostname, _needs_recovery(), instances.c.stopped_at.is_(None)
                )
            ).all()
        return [(r.instance_id, r.pid) for r in rows]

    def recover(self, dead_instance: str, by: str | None) -> list[Recovered]:
        """A dead instance's `submitted` receipts become outcome_unknown, its `planned` ones rejected/not_sent."""
        recovered = self._settle_abandoned(
            dead_instance,
            self.unsettled_of(dead_instance),
            by,
            note={"dead_instance": dead_instance},
            code="proxy_interrupted",
            message="the proxy stopped while the request was in flight; the upstream may have acted",
        )
        with self.db.writing() as conn:
            still = conn.execute(
                select(func.count())
                .select_from(receipts)
                .where(receipts.c.proxy_instance == dead_instance, receipts.c.state.in_(_UNSETTLED))
            ).scalar_one()
            if still == 0:
                conn.execute(
                    update(instances).where(instances.c.instance_id == dead_instance).values(recovered_at=self.db.clock(conn))
                )
        return recovered

    def unsettled_of(self, instance_id: str) -> list[tuple[str, str]]:
        """(operation_id, state) of an instance's receipts still planned or submitted."""
        with self.db.storage_errors(), self.db.reading() as conn:
            rows = conn.execute(
                select(receipts.c.operation_id, receipts.c.state).where(
                    receipts.c.proxy_instance == instance_id, receipts.c.state.in_(_UNSETTLED)
                )
            ).all()
        return [(r.operation_id, r.state) for r in rows]

    def settle_orphans(self, instance_id: str, orphans: Sequence[tuple[str, str]]) -> list[Recovered]:
        """A live instance's receipts that no request works on any more (their verdict could not be written):
        settled as if the instance had died, so they do not block retries for as long as it lives.
        The caller lists them from `unsettled_of` minus what it still has in flight."""
        return self._settle_abandoned(
            instance_id,
            orphans,
            instance_id,
            note={"orphaned_by": instance_id},
            code="verdict_not_recorded",
            message="the upstream's answer could not be journaled; the upstream may have acted",
        )

    def _settle_abandoned(
        self,
        instance_id: str,
        rows: Sequence[tuple[str, str]],
        by: str | None,
        note: dict[str, str],
        code: str,
        message: str,
    ) -> list[Recovered]:
        recovered: list[Recovered] = []
        for operation_id, state in rows:
            if state == State.SUBMITTED.value:
                to, error_code, error_message = State.OUTCOME_UNKNOWN, code, message
            else:
                to, error_code, error_message = State.REJECTED, "not_sent", "the request was never sent"
            try:
                self.receipts.transition(
                    operation_id,
                    state,
                    to,
                    {"who": by or "recovery", "error": error_code, **note},
                    error_code=error_code,
                    error_message=error_message,
                )
            except StaleStateError:
                continue
            recovered.append(Recovered(operation_id, instance_id, state, to.value))
        return recovered
