"""The presets' end-to-end harness: a real server of the preset's API (localstripe, moto, ...) behind a faulty
front (support/faulty_front.py), a real in-process proxy whose config says only `preset: NAME` for the front's
address, and a SQLite store. `lost_answer` makes a write the server committed whose answer the front holds past
the proxy's `upstream_timeout`; `never_received` one the front never forwards. Both end `outcome_unknown`
(the proxy's 504), and the tests then run `receipts rules check` and one reconcile pass, as a user would.
"""

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy_addon.cli import main
from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.store import ReceiptStore
from support.e2e import proxy_client, settled
from support.faulty_front import DELAY, LOST, FaultyFront
from support.proxy import RunningProxy, start_inprocess_proxy
from support.reconcile import outcome_unknown
from support.store import migrated_sqlite, store_copied_from

UPSTREAM_TIMEOUT = "1500ms"  # every write through the proxy: long enough for the real server on a busy machine
HOLD = 2.5  # how long the front holds a lost answer, or a request it never forwards: past UPSTREAM_TIMEOUT


@dataclass
class PresetWorld:
    front: FaultyFront
    store: ReceiptStore
    config: ReceiptsConfig
    config_path: Path
    database_url: str
    proxy: RunningProxy
    client: httpx.Client  # the agent's, through the proxy

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.client.request(method, self.front.base + path, **kw)

    def succeeded(self, method: str, path: str, **kw: Any) -> ReceiptRecord:
        r = self.send(method, path, **kw)
        assert r.is_success, r.text
        return settled(self.store, r.headers["X-Receipt-Id"])

    def lost_answer(self, method: str, path: str, **kw: Any) -> str:
        """A write the server committed; its answer held past the proxy's upstream_timeout."""
        return self._unknown(DELAY, method, path, **kw)

    def never_received(self, method: str, path: str, **kw: Any) -> str:
        """A write that never reached the server (the front held it, then reset the connection)."""
        return self._unknown(LOST, method, path, **kw)

    def _unknown(self, kind: str, method: str, path: str, **kw: Any) -> str:
        return self.unknown(kind, lambda m, t, _b: m == method and t.split("?")[0] == path, lambda: outcome_unknown(self.send(method, path, **kw)))

    def unknown(self, kind: str, matches: Callable[[str, str, bytes], bool], send: Callable[[], str]) -> str:
        """Arm the front with `kind` (DELAY: a lost answer; LOST: never received) for the next request that
        `matches`, then `send` it as the agent does; the receipt's id, its verdict committed."""
        self.front.arm(kind, matches, delay=HOLD)
        operation_id = send()
        settled(self.store, operation_id)
        return operation_id

    def reconcile(self) -> None:
        asyncio.run(Reconciler(self.config, self.store).run_once())

    def rules_check(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
        """`receipts rules check --json`, by operation."""
        monkeypatch.setenv("RECEIPTS_DATABASE_URL", self.database_url)
        capsys.readouterr()
        assert main(["rules", "check", "--json", "--config", str(self.config_path)]) == 0
        return {row["operation"]: row for row in json.loads(capsys.readouterr().out)}

    def forwarded(self, matches: Callable[[str, str, bytes], bool]) -> int:
        """The requests that reached the real server, of those matching."""
        self.front.wait_idle()
        return sum(1 for s in self.front.matching(matches) if s.fault != LOST)


@contextmanager
def preset_world(preset: str, server_port: int, directory: Path) -> Iterator[PresetWorld]:
    """The proxy with `hosts: {"127.0.0.1:FRONT": {preset: NAME}}`, in front of the real server on `server_port`."""
    with preset_worlds({preset: server_port}, directory) as worlds:
        yield worlds[preset]


@contextmanager
def preset_worlds(servers: dict[str, int], directory: Path) -> Iterator[dict[str, PresetWorld]]:
    """One proxy (one in a process: mitmproxy's in-process masters share state) whose config gives each preset a
    host of its own, a front in front of its real server; by preset, each world with its front."""
    with ExitStack() as stack:
        directory.mkdir(parents=True, exist_ok=True)
        fronts = {preset: FaultyFront(port).start() for preset, port in servers.items()}
        for front in fronts.values():
            stack.callback(front.stop)
        config_path, database = directory / "config.yaml", directory / "receipts.db"
        config_path.write_text(
            f"secret_file: {directory / 'secret'}\n"
            "reconcile: {per_host_rate: 100, backoff: 1s}\n"
            "hosts:\n"
            + "".join(f'  "127.0.0.1:{f.port}": {{preset: {p}, upstream_timeout: {UPSTREAM_TIMEOUT}}}\n' for p, f in fronts.items())
        )
        store = stack.enter_context(store_copied_from(migrated_sqlite(directory), database))
        url = f"sqlite:///{database}"
        proxy = start_inprocess_proxy(config_path, url, directory / "confdir")
        stack.callback(proxy.stop)
        client = stack.enter_context(proxy_client(proxy.url))
        config = load_config(config_path)
        yield {p: PresetWorld(f, store, config, config_path, url, proxy, client) for p, f in fronts.items()}
