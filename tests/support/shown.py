"""What an operator sees of the receipts at one host: the `receipts ls` table and the review page's list."""

import contextlib
import io
import os
from pathlib import Path

from proxy_addon.admin.app import create_app
from proxy_addon.cli import main
from proxy_addon.config import load_config
from proxy_addon.store import ReceiptStore


def ls_table(config: Path, database_url: str, host: str) -> str:
    out = io.StringIO()
    saved = os.environ.get("RECEIPTS_DATABASE_URL")
    os.environ["RECEIPTS_DATABASE_URL"] = database_url
    try:
        with contextlib.redirect_stdout(out):
            assert main(["ls", "--host", host, "--state", "succeeded", "--config", str(config)]) == 0
    finally:
        if saved is None:
            os.environ.pop("RECEIPTS_DATABASE_URL")
        else:
            os.environ["RECEIPTS_DATABASE_URL"] = saved
    return out.getvalue()


def review_page(config: Path, store: ReceiptStore, host: str) -> str:
    client = create_app(load_config(config), store).test_client()
    return client.get(f"/?state=succeeded&host={host}").get_data(as_text=True)
