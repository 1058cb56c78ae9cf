"""Never a secret in what a person reads: credentials and secret fields sent through a real proxy, and
the secrets the upstream answered with, appear in none of `receipts show` (table and --json), `GET
/receipts/{id}` and the review page, which show the request as journaled: already redacted when stored."""

import json

import httpx
from support.proxy import start_inprocess_proxy
from support.upstream import start_upstream

from proxy_addon.admin.app import create_app
from proxy_addon.cli import main
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate

SECRETS = {
    "query": "QS-SECRET-1",
    "authorization": "AUTH-SECRET-2",
    "cookie": "COOKIE-SECRET-3",
    "x-api-key": "KEY-SECRET-4",
    "password": "PW-SECRET-5",
    "nested token": "TOK-SECRET-6",
    "form password": "FORM-SECRET-7",
    "upstream's token": "resp-secret-token",  # tests/support/upstream.py answers with it
    "upstream's cookie": "upstream-cookie-secret",
}


def config_text(tmp_path) -> str:
    return f"secret_file: {tmp_path / 'secret'}\n"


def test_a_secret_sent_through_a_real_proxy_is_in_no_output(sqlite_url, tmp_path, monkeypatch, capsys):
    migrate(sqlite_url)
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tmp_path))
    upstream = start_upstream()
    proxy = start_inprocess_proxy(config, sqlite_url, tmp_path / "confdir")
    try:
        with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as agent:
            answer = agent.post(
                f"{upstream.base}/api/charges?token={SECRETS['query']}&currency=EUR",
                headers={"Authorization": f"Bearer {SECRETS['authorization']}", "Cookie": f"sid={SECRETS['cookie']}",
                         "X-Api-Key": SECRETS["x-api-key"]},
                json={"amount": 4200, "password": SECRETS["password"], "card": {"token": SECRETS["nested token"]}},
            )
            form = agent.post(f"{upstream.base}/status/503/signup",
                              data={"user": "ana", "password": SECRETS["form password"]})
    finally:
        proxy.stop()
        upstream.stop()
    assert answer.status_code == 201 and form.status_code == 504
    ops = [answer.headers["X-Receipt-Id"], form.headers["X-Receipt-Id"]]

    monkeypatch.setenv("RECEIPTS_DATABASE_URL", sqlite_url)
    outputs = []
    for op in ops:
        for json_flag in ([], ["--json"]):
            assert main(["show", op, *json_flag, "--config", str(config)]) == 0
            outputs.append(capsys.readouterr().out)
    engine = make_engine(sqlite_url)
    try:
        client = create_app(parse_config(config_text(tmp_path)), ReceiptStore(engine)).test_client()
        for op in ops:
            outputs.append(client.get(f"/receipts/{op}").get_data(as_text=True))
            outputs.append(client.get(f"/ui/receipts/{op}").get_data(as_text=True))
    finally:
        engine.dispose()

    for output in outputs:
        for where, secret in SECRETS.items():
            assert secret not in output, f"the {where} secret is shown"
        assert "REDACTED" in output
    table, document, _, _, api, page = outputs[0], json.loads(outputs[1]), outputs[2], outputs[3], outputs[4], outputs[5]
    assert '"amount": 4200,' in table and "authorization: [REDACTED]" in table and "set-cookie: [REDACTED]" in table
    assert document["request"]["body"]["document"]["amount"] == 4200
    assert document["request"]["url"].startswith("http://127.0.0.1:") and "currency=EUR" in document["request"]["url"]
    assert document["response"]["status_code"] == 201
    assert json.loads(api) == document
    assert "&#34;amount&#34;: 4200," in page or '"amount": 4200,' in page
    assert "user = ana" in outputs[2] and "password = [REDACTED]" in outputs[2]
