"""The addon's options, driven in-process with mitmproxy's taddons: what a bad setting reports, and what stays."""

import pytest
from alembic import command
from mitmproxy import exceptions
from mitmproxy.test import taddons

from proxy_addon.addons.receipts import Receipts
from proxy_addon.db import alembic_config
from proxy_addon.keyfiles import SECRET_ENV


@pytest.fixture
def setting(tmp_path, monkeypatch):
    """(config path, database url) in a directory with no ./config.yaml, the option's default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SECRET_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    command.upgrade(alembic_config(url), "head")
    config = tmp_path / "receipts.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    return config, url


def test_a_bad_setting_is_reported_as_itself(setting, tmp_path):
    """mitmproxy re-configures with the defaults after a failed update; their failure must not hide this one."""
    config, url = setting
    (tmp_path / "short").write_text("too-short")
    config.write_text(f"secret_file: {tmp_path / 'short'}\n")
    addon = Receipts()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError) as err:
            tctx.configure(addon, receipts_config=str(config), receipts_database_url=url)
        assert "too short to be a key" in str(err.value) and "config file not found" not in str(err.value)
        assert addon.store is None


def test_a_failed_reconfigure_keeps_the_journal_it_had(setting, tmp_path):
    config, url = setting
    addon = Receipts()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, receipts_config=str(config), receipts_database_url=url)
        store, hasher = addon.store, addon.handler.hasher
        assert store is not None and store.db.dialect == "sqlite"
        with pytest.raises(exceptions.OptionsError, match="nowhere.yaml: config file not found"):
            tctx.configure(addon, receipts_config=str(tmp_path / "nowhere.yaml"))
        assert tctx.options.receipts_config == str(config)
        assert (addon.store, addon.handler.hasher) == (store, hasher)
        store.instances.register("still-writable", "h", 1)
        assert "still-writable" in store.instances.dead(None, 0.0, known_dead=["still-writable"])
