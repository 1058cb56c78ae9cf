"""`receipts_admin_listen` (addons/admin.py): where a proxy serves its admin server whatever admin.enabled says,
as docker-compose.yml runs the replicas for Prometheus. Served through a real proxy: e2e/test_dashboards.py."""

import asyncio

import httpx
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from proxy_addon.addons.admin import InProxyAdmin
from proxy_addon.admin.server import parse_listen, serve_at
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import ConfigError
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate


@pytest.mark.parametrize(("spec", "expected"), [
    ("0.0.0.0:8081", ("0.0.0.0", 8081)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:9000", ("::1", 9000)),
    ("metrics.internal:8081", ("metrics.internal", 8081)),
])  # fmt: skip
def test_parse_listen(spec, expected):
    assert parse_listen(spec) == expected


@pytest.mark.parametrize("spec", ["8081", ":8081", "host:", "host:port", "host:70000", "0.0.0.0"])
def test_a_bad_listen_address_is_one_line_naming_the_option(spec):
    with pytest.raises(ValueError, match=r"receipts_admin_listen .*expected HOST:PORT"):
        parse_listen(spec, "receipts_admin_listen")


class Journal:
    def __init__(self, config, store):
        self.config, self.store = config, store


@pytest.fixture
def store(sqlite_url):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield ReceiptStore(engine)
    engine.dispose()


def test_the_option_is_checked_when_set(store, tmp_path):
    addon = InProxyAdmin(Journal(parse_config(f"secret_file: {tmp_path / 's'}"), store))
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="receipts_admin_listen 'nowhere'"):
        tctx.configure(addon, receipts_admin_listen="nowhere")


def test_the_option_serves_the_admin_server_though_the_config_has_it_off(store, tmp_path, monkeypatch):
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    config = parse_config(f"secret_file: {tmp_path / 's'}")
    assert not config.admin.enabled
    addon = InProxyAdmin(Journal(config, store))
    with taddons.context(addon) as tctx:
        tctx.configure(addon, receipts_admin_listen="127.0.0.1:0")

        async def serve_and_stop() -> int:
            await addon.running()
            assert addon.server is not None
            port = addon.server.port
            answer = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/metrics", trust_env=False)
            assert answer.status_code == 200 and "receipts_store_up 1.0" in answer.text
            await addon.done()
            return port

        asyncio.run(serve_and_stop())
    assert addon.server is None


def test_an_address_beyond_loopback_without_the_token_is_logged_and_the_proxy_goes_on(store, tmp_path, monkeypatch):
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    logged: list[dict] = []

    class Recorder:
        def error(self, event: str, **kw: object) -> None:
            logged.append({"event": event, **kw})

        info = warning = error

    monkeypatch.setattr("proxy_addon.addons.admin.log", Recorder())
    addon = InProxyAdmin(Journal(parse_config(f"secret_file: {tmp_path / 's'}"), store))
    with taddons.context(addon) as tctx:
        tctx.configure(addon, receipts_admin_listen="0.0.0.0:0")
        asyncio.run(addon.running())
    assert addon.server is None
    [line] = [e for e in logged if e["event"] == "admin_not_started"]
    assert "RECEIPTS_ADMIN_TOKEN" in line["error"]


def test_a_process_serves_its_metrics_beside_its_work(store, tmp_path, monkeypatch):
    """`receipts reconcile --admin-listen`: the worker's verdicts are counted in its own process."""
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    config = parse_config(f"secret_file: {tmp_path / 's'}")
    server = serve_at(config, store, ("127.0.0.1", 0))
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/metrics", trust_env=False, timeout=10)
        assert answer.status_code == 200 and 'receipts_reconcile_verdicts_total{state="manual_review"}' in answer.text
    finally:
        server.stop()
    with pytest.raises(ConfigError, match="RECEIPTS_ADMIN_TOKEN"):
        serve_at(config, store, ("0.0.0.0", 0))
