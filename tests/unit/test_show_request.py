"""The request as journaled, where a person reads it (issue 14): `GET /receipts/{id}` and the review page show
the method, the URL with its redacted query, the redacted headers and the body (JSON pretty-printed, form
fields, or "N bytes of binary"), the upstream's stored answer and the reconciler's reads; long bodies folded,
everything escaped. `receipts show` is tested in test_cli.py; secrets sent through a real proxy in
e2e/test_show_secrets.py."""

import dataclasses
import json
import re

import pytest
from sqlalchemy import update
from support.store import intent, recorded, walk

from proxy_addon.admin.app import create_app
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts
from tests.conftest import migrate


@pytest.fixture
def sqlite_store(sqlite_url):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield ReceiptStore(engine)
    engine.dispose()


def config_text(tmp_path) -> str:
    return f"secret_file: {tmp_path / 'secret'}\n"


def made(store: ReceiptStore, target: State, **fields) -> str:
    rec = recorded(store, dataclasses.replace(intent(), **fields))
    walk(store, rec.operation_id, target)
    return rec.operation_id


def test_the_page_shows_the_request_the_answer_and_the_reads(sqlite_store, tmp_path):
    op = made(sqlite_store, State.OUTCOME_UNKNOWN, scheme="http", host="127.0.0.1", port=18112, query="a=1&token=%5BREDACTED%5D",
              request_headers={"content-type": "application/json", "authorization": "[REDACTED]"},
              request_body=b'{"amount":4200,"currency":"EUR"}', request_body_size=40)
    sqlite_store.receipts.transition(op, State.OUTCOME_UNKNOWN, State.RECONCILING, {"who": "worker-1"})
    read = {"method": "GET", "url": "http://127.0.0.1:18112/charges?q=<b>x</b>", "status": 200, "elapsed_ms": 8.1}
    sqlite_store.receipts.transition(
        op, State.RECONCILING, State.MANUAL_REVIEW,
        {"who": "worker-1", "strategy": "search", "result": "ambiguous", "reads": [read], "reason": "2 records match"},
    )
    client = create_app(parse_config(config_text(tmp_path)), sqlite_store).test_client()
    html = client.get(f"/ui/receipts/{op}").get_data(as_text=True)
    assert "POST 127.0.0.1:18112/api/articles</h1>" in html
    assert "http://127.0.0.1:18112/api/articles?a=1&amp;token=%5BREDACTED%5D" in html
    assert "<th>authorization</th><td class=\"mono\">[REDACTED]</td>" in html
    body = re.search(r'<pre class="body" id="request-body">(.*?)</pre>', html, re.S).group(1)
    assert body == '{\n  &#34;amount&#34;: 4200,\n  &#34;currency&#34;: &#34;EUR&#34;\n}'
    assert "Body: JSON, 40 bytes" in html
    assert 'id="response"' not in html  # no answer stored
    reads = re.search(r'<table id="reads">(.*?)</table>', html, re.S).group(1)
    assert "GET http://127.0.0.1:18112/charges?q=&lt;b&gt;x&lt;/b&gt;" in reads and "ambiguous" in reads
    assert "2 records match" in reads and "8.1 ms" in reads


def test_the_page_folds_long_bodies_and_escapes_everything(sqlite_store, tmp_path):
    evil = '<script>alert("body")</script>'
    long = {f"field_{i:03}": evil if i == 99 else i for i in range(100)}
    op = made(sqlite_store, State.MANUAL_REVIEW, request_headers={"content-type": "application/json", "x-evil": "<img src=x>"},
              request_body=json.dumps(long).encode(), request_body_size=2000)
    done = made(sqlite_store, State.SUCCEEDED, request_headers={"content-type": "application/octet-stream"},
                request_body=bytes(range(256)), request_body_size=256)
    client = create_app(parse_config(config_text(tmp_path)), sqlite_store).test_client()
    html = client.get(f"/ui/receipts/{op}").get_data(as_text=True)
    assert "<script" not in html and "<img" not in html
    assert "&lt;img src=x&gt;" in html and "&lt;script&gt;alert(" in html
    head = re.search(r'<pre class="body" id="request-body">(.*?)</pre>', html, re.S).group(1)
    assert head.count("\n") == 29 and "field_027" in head and "field_099" not in head
    folded = re.search(r'<details class="fold"><summary>show the rest: 72 more lines</summary><pre class="body">(.*?)</pre>',
                       html, re.S)
    assert folded and "field_099" in folded.group(1) and "&lt;script&gt;" in folded.group(1)
    html = client.get(f"/ui/receipts/{done}").get_data(as_text=True)
    assert "256 bytes of binary" in html and "Body: binary, 256 bytes" in html


def test_the_page_shows_a_stored_form_and_a_stored_answer(sqlite_store, tmp_path):
    op = made(sqlite_store, State.REJECTED, request_headers={"content-type": "application/x-www-form-urlencoded"},
              request_body=b"user=ana&password=%5BREDACTED%5D", request_body_size=30)
    with sqlite_store.engine.begin() as conn:  # the answer as verdicts.storable_response keeps it
        conn.execute(update(receipts).where(receipts.c.operation_id == op).values(
            status_code=422, response_headers={"content-type": "application/json", "set-cookie": "[REDACTED]"},
            response_body=b'{"error":"user exists","token":"[REDACTED]"}'))
    client = create_app(parse_config(config_text(tmp_path)), sqlite_store).test_client()
    html = client.get(f"/ui/receipts/{op}").get_data(as_text=True)
    assert "user = ana\npassword = [REDACTED]" in html and "form, 30 bytes, 2 fields" in html
    answer = re.search(r'<div class="card exchange" id="response">(.*?)</div>', html, re.S).group(1)
    assert "<b>422</b>" in answer and "set-cookie" in answer and "&#34;error&#34;: &#34;user exists&#34;" in answer
    document = client.get(f"/receipts/{op}").get_json()
    assert document["response"]["body"]["document"] == {"error": "user exists", "token": "[REDACTED]"}


def test_the_api_and_the_page_filter_by_host_and_port(sqlite_store, tmp_path):
    a = made(sqlite_store, State.OUTCOME_UNKNOWN, scheme="http", host="127.0.0.1", port=18112)
    b = made(sqlite_store, State.OUTCOME_UNKNOWN, scheme="http", host="127.0.0.1", port=18113)
    client = create_app(parse_config(config_text(tmp_path)), sqlite_store).test_client()
    assert [r["operation_id"] for r in client.get("/receipts?host=127.0.0.1:18112").get_json()] == [a]
    assert {r["operation_id"] for r in client.get("/receipts?host=127.0.0.1").get_json()} == {a, b}
    r = client.get("/receipts?host=127.0.0.1:http")
    assert r.status_code == 400 and "host" in r.get_json()["detail"]
    html = client.get("/?host=127.0.0.1:18113").get_data(as_text=True)
    assert b in html and a not in html and "127.0.0.1:18113</td>" in html
    html = client.get("/?host=127.0.0.1:18119").get_data(as_text=True)
    assert "no receipt matches state open, host 127.0.0.1:18119." in html


@pytest.mark.parametrize("content_type, stored, kind", [
    ("application/json", b'{"a":1}', "json"),
    ("text/plain", b'[1, 2]', "json"),  # JSON declared as something else: the proxy canonicalised it as JSON
    ("application/problem+json", b'"quoted"', "json"),
    ("text/plain", b"42", "text"),
    ("application/x-www-form-urlencoded", b"a=1&b=", "form"),
    ("application/x-www-form-urlencoded", b"not a form", "text"),
    (None, b"caf\xc3\xa9", "text"),
    (None, b"\x00\x01", "binary"),
    (None, b"", "empty"),
])
def test_body_kinds(content_type, stored, kind):
    from proxy_addon.views.journaled import body_view

    assert body_view(stored, len(stored), False, None, content_type).kind == kind


def test_a_cap_that_cut_a_character_in_two_is_still_text():
    from proxy_addon.views.journaled import body_lines, body_view

    body = body_view("é".encode() * 3 + b"\xc3", 100, True, None, "text/plain")
    assert (body.kind, body_lines(body)) == ("text", ["ééé"])
    assert body_view(b"\xc3" + b"abcdef", 7, True, None, None).kind == "binary"  # not at the cut: binary
