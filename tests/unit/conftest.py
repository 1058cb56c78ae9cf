"""The unit tier's shared fixture: the journal addon in a taddons context (test_handler.py and beside it)."""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.test import taddons
from support.e2e import migrate
from support.handler import FakeSender

from proxy_addon.addons.receipts import Receipts
from proxy_addon.journal.links import WriterThread
from proxy_addon.request.sender import SendResult


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """`journal(*results, **config)` -> (run, addon, sender): `run(flow)` passes the flow through the addon's
    request hook in a taddons context; the addon journals into a migrated SQLite file."""
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(url)
    made: list[Receipts] = []

    def make(*results: SendResult, config: str = "") -> tuple[Callable[[Any], Any], Receipts, FakeSender]:
        path = tmp_path / "config.yaml"
        path.write_text(f"secret_file: {tmp_path / 'secret'}\nlogging: {{level: error}}\n{config}")
        addon, sender = Receipts(), FakeSender(*results)
        addon.writer = WriterThread  # the writer's own loop, in a thread: no process to start per test

        def run(flow: Any, *more: Any, together: bool = False, script: Callable[[Receipts], Any] | None = None) -> Any:
            """The flows one after the other (or all at once), on one event loop (so one journal writer); the
            first returned. `script(addon)`, a coroutine function, runs instead of the flows when given."""

            async def go() -> None:
                with taddons.context(addon) as tctx:
                    tctx.configure(addon, receipts_config=str(path), receipts_database_url=url)
                    assert addon.handler is not None
                    addon.handler.sender = sender
                    if script is not None:
                        await script(addon)
                    elif together:
                        await asyncio.gather(*(addon.request(f) for f in (flow, *more)))
                    for f in () if together or script else (flow, *more):
                        await addon.request(f)
                    await addon.handler.drain()  # the verdicts committed after their answers, as on shutdown

            asyncio.run(go())
            return flow

        made.append(addon)
        return run, addon, sender

    yield make
    for addon in made:
        if addon.journal is not None:
            addon.journal.close()
        if addon.store is not None:
            addon.store.engine.dispose()
