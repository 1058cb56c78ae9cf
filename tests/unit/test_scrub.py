"""`receipts scrub` on SQLite and PostgreSQL: rows written with the rules of earlier versions (secrets they did
not know for secrets) are redacted again; what is not secret stays; a second run changes nothing."""

import dataclasses
import gzip
import hashlib
import json
from pathlib import Path

import pytest
from support.e2e import pg_rows_as_text
from support.store import intent, recorded, walk

from proxy_addon.cli import main
from proxy_addon.db import make_engine
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts, transitions

M = {name: f"mark-{name}-7f3a" for name in (
    "goog", "apim", "private", "shopify", "access", "key", "sig", "client", "refresh", "pk", "apikey", "card", "cvc",
    "form", "cut", "resp", "gzresp", "h11", "detail", "url", "pin",
)}
KEPT = "kept-title-91c2"


@pytest.fixture
def cli(migrated_url, tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", migrated_url)

    def run(*args: str) -> tuple[int, str]:
        code = main([*args, "--config", str(config)])
        out, err = capsys.readouterr()
        assert not err, err
        return code, out

    return run


def old_rows(store: ReceiptStore) -> list[str]:
    """Receipts as an earlier version wrote them: its redaction knew only a few names."""
    headers = {"content-type": "application/json", "authorization": "[REDACTED]", "x-goog-api-key": M["goog"],
               "ocp-apim-subscription-key": M["apim"], "private-token": M["private"], "x-shopify-access-token": M["shopify"],
               "idempotency-key": "idem-kept-1"}
    body = {"title": KEPT, "client_secret": M["client"], "auth": {"refresh_token": M["refresh"], "private_key": M["pk"]},
            "apiKey": M["apikey"], "card": {"number": 1, "card_number": M["card"], "cvc": M["cvc"]}, "password": "[REDACTED]"}
    json_body = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    multipart = json.dumps({"multipart": [["pin", hashlib.sha256(M["pin"].encode()).hexdigest()],
                                          ["title", hashlib.sha256(b"hi").hexdigest()]]}).encode()
    ops = []
    for fields in (
        {"request_headers": headers, "query": f"access_token={M['access']}&key={M['key']}&sig={M['sig']}&page=2",
         "request_body": json_body},
        {"request_headers": {"content-type": "application/x-www-form-urlencoded"},
         "request_body": f"title={KEPT}&client_secret={M['form']}".encode()},
        {"request_headers": {"content-type": "application/json"}, "request_body": b'{"a":1,"cvc":"' + M["cut"].encode(),
         "request_body_truncated": True},
        {"request_headers": {"content-type": "multipart/form-data; boundary=x"}, "request_body": multipart,
         "body_note": "multipart stored as part digests"},
    ):
        rec = recorded(store, dataclasses.replace(intent(), **fields))
        ops.append(rec.operation_id)
    walk(store, ops[0], State.SUCCEEDED, status_code=201, response_headers={"content-type": "application/json"},
         response_body=json.dumps({"id": 7, "access_token": M["resp"], "title": KEPT}).encode())
    walk(store, ops[1], State.SUCCEEDED, status_code=201,
         response_headers={"content-type": "application/json", "content-encoding": "gzip"},
         response_body=gzip.compress(json.dumps({"session_token": M["gzresp"]}).encode()))
    walk(store, ops[2], State.REJECTED, error_code="not_sent",
         error_message=f"LocalProtocolError: Illegal header value b'Bearer {M['h11']}\\x00'")
    store.receipts.transition(ops[3], State.PLANNED, State.SUBMITTED, {"who": "old", "error": f"h11 said b'{M['detail']}'"})
    store.receipts.transition(ops[3], State.SUBMITTED, State.OUTCOME_UNKNOWN,
                              {"who": "old", "evidence": {"read": {"url": f"https://api.example.com/x?access_token={M['url']}"}}})
    return ops


def everything(url: str, store: ReceiptStore) -> bytes:
    if url.startswith("sqlite"):
        store.engine.dispose()
        path = Path(url.removeprefix("sqlite:///"))
        data = b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
        with store.engine.connect() as conn:  # the WAL may still hold old pages: read the rows too
            rows = [*conn.execute(receipts.select()), *conn.execute(transitions.select())]
        return data + repr(rows).encode() + b"".join(gzip.decompress(r.response_body) for r in rows
                                                    if (getattr(r, "response_body", None) or b"")[:2] == b"\x1f\x8b")
    return pg_rows_as_text(url).encode()


def test_scrub_redacts_what_earlier_versions_stored(migrated_url, cli):
    engine = make_engine(migrated_url)
    store = ReceiptStore(engine)
    try:
        ops = old_rows(store)
        before = everything(migrated_url, store)
        assert all(v.encode() in before for k, v in M.items() if k not in ("gzresp", "pin")), "the old rows should hold them"

        code, out = cli("scrub", "--dry-run", "--json")
        assert code == 0 and json.loads(out)["receipts_changed"] == 4 and json.loads(out)["dry_run"] is True
        assert everything(migrated_url, store).count(M["goog"].encode()) >= 1  # a dry run changes nothing

        code, out = cli("scrub", "--vacuum")  # VACUUM: freed pages and dead tuples would keep the old bytes
        assert code == 0 and out.startswith("changed 4 of 4 receipts and 2 of ")
        after = everything(migrated_url, store)
        for name, value in M.items():
            assert value.encode() not in after, f"{name} left after scrub"
        assert hashlib.sha256(M["pin"].encode()).hexdigest().encode() not in after
        assert hashlib.sha256(b"hi").hexdigest().encode() not in after  # unkeyed part digests are gone

        first = store.receipts.get(ops[0])
        assert json.loads(first.request_body)["title"] == KEPT and first.request_headers["idempotency-key"] == "idem-kept-1"
        assert first.request_headers["x-goog-api-key"] == "[REDACTED]"
        assert first.query == "access_token=%5BREDACTED%5D&key=%5BREDACTED%5D&sig=%5BREDACTED%5D&page=2"
        assert json.loads(first.response_body) == {"id": 7, "access_token": "[REDACTED]", "title": KEPT}
        second = store.receipts.get(ops[1])
        assert second.request_body == f"title={KEPT}&client_secret=%5BREDACTED%5D".encode()
        assert json.loads(second.response_body) == {"session_token": "[REDACTED]"}  # stored decoded from now on
        assert "content-encoding" not in second.response_headers
        assert store.receipts.get(ops[2]).request_body == b"[REDACTED]"
        assert store.receipts.get(ops[2]).error_message == "LocalProtocolError: Illegal header value [REDACTED]"

        code, out = cli("scrub")
        assert code == 0 and out.startswith("changed 0 of 4 receipts and 0 of ")  # nothing left to do
    finally:
        engine.dispose()
