"""Helpers shared by the store tests: intents with fresh fingerprints, and walking a receipt along the contract."""

import shutil
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Table, func, select

from proxy_addon.db import make_engine
from proxy_addon.rules.policy import AfterSuccess
from proxy_addon.rules.records import Intent, ReceiptRecord, utcnow
from proxy_addon.rules.states import ALLOWED_TRANSITIONS, State
from proxy_addon.store import ReceiptStore

S = State


def _paths() -> dict[State, list[State]]:
    """The shortest allowed path from planned to every state (breadth-first over the contract's table)."""
    paths, queue = {S.PLANNED: []}, deque([S.PLANNED])
    while queue:
        here = queue.popleft()
        for there in sorted(ALLOWED_TRANSITIONS[here]):
            if there not in paths:
                paths[there] = [*paths[here], there]
                queue.append(there)
    return paths


PATHS = _paths()


def fp() -> str:
    return "sha256:" + uuid.uuid4().hex * 2


def intent(fingerprint: str | None = None, account: str = "acct:alice", **kw) -> Intent:
    fields = {"operation": "articles.create", "method": "POST", "scheme": "https", "host": "api.example.com", "port": 443,
              "path": "/api/articles", **kw}
    return Intent(intent_fingerprint=fingerprint or fp(), account=account, **fields)


def recorded(store: ReceiptStore, intent: Intent, after_success: AfterSuccess | None = None) -> ReceiptRecord:
    """Record a `planned` receipt and read it back."""
    store.receipts.record(intent, after_success)
    return store.receipts.get(intent.operation_id)


def transitioned(store: ReceiptStore, op: str, *args, **kwargs) -> ReceiptRecord:
    """`transition`, and the receipt read back."""
    store.receipts.transition(op, *args, **kwargs)
    return store.receipts.get(op)


def walk(store: ReceiptStore, op: str, target: State, **last_updates) -> ReceiptRecord:
    """Move a planned receipt to `target` along an allowed path; `last_updates` go with the last step."""
    steps = list(zip([S.PLANNED, *PATHS[target]], PATHS[target]))
    for i, (a, b) in enumerate(steps):
        store.receipts.transition(op, a, b, {"step": i}, **(last_updates if i == len(steps) - 1 else {}))
    return store.receipts.get(op)


def count(store: ReceiptStore, table: Table, *where) -> int:
    with store.engine.connect() as c:
        return c.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def raw_row(fingerprint: str, account: str = "acct:alice", state: str = "submitted") -> dict:
    """A receipt row for a raw INSERT that bypasses the store."""
    now = utcnow()
    return dict(operation_id="op_raw_" + uuid.uuid4().hex[:8], operation="raw", method="POST", scheme="https",
                host="api.example.com", port=443, path="/raw", intent_fingerprint=fingerprint, account=account,
                state=state, created_at=now, updated_at=now)


def migrated_sqlite(directory: Path) -> Path:
    """A SQLite file migrated to head once, to be copied for each test (quicker than migrating each time)."""
    from support.e2e import migrate

    path = directory / "template.db"
    migrate(f"sqlite:///{path}")
    return path


@contextmanager
def store_copied_from(template: Path, path: Path) -> Iterator[ReceiptStore]:
    """A store of its own on a copy of `template`."""
    shutil.copyfile(template, path)
    engine = make_engine(f"sqlite:///{path}")
    try:
        yield ReceiptStore(engine)
    finally:
        engine.dispose()
