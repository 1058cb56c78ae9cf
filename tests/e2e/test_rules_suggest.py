"""Reconciling a new API in five minutes, against a real server nobody here wrote (json-server, from npm):
`receipts rules suggest` reads its API from an OpenAPI document (tests/data/json-server.openapi.yaml, written by
hand: json-server publishes none), the YAML is pasted into config.yaml as printed, writes go through the real
proxy, and `receipts rules check` proves every suggested read rule with the verifier controls. Then the rules
settle writes whose answers were lost: committed ones `succeeded` with the server's id, a create the server never
saw goes to a person (the suggestion leaves `retry_safe` off)."""

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from support.e2e import migrate, once_moved_on, open_store, proxy_client
from support.json_server import JsonServer, Writes, json_server
from support.proxy import REPO, start_inprocess_proxy

from proxy_addon.cli import main
from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler

DOCUMENT = REPO / "tests" / "data" / "json-server.openapi.yaml"
READ_RULES = {"createPost", "replacePost", "updatePost", "deletePost", "createComment", "deleteComment"}
SETTINGS = {"reconcile": {"per_host_rate": 1000, "backoff": "50ms"}, "logging": {"level": "warning", "format": "json"}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[JsonServer]:
    directory = tmp_path / "json-server"
    directory.mkdir()
    with json_server(directory) as s:
        yield s


def suggested(server: JsonServer, capsys) -> str:
    assert main(["rules", "suggest", "--openapi", str(DOCUMENT), "--host", f"127.0.0.1:{server.port}"]) == 0
    out, err = capsys.readouterr()
    assert "6 writes: 5 lookup, 1 search, 0 without a read rule" in err
    return out


def pasted(tmp_path: Path, suggestion: str) -> Path:
    """config.yaml: this deployment's settings, and the suggestion pasted below them as printed."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"secret_file": str(tmp_path / "secret"), **SETTINGS}) + suggestion)
    return path


def write_each_operation(proxy_url: str, server: JsonServer) -> None:
    """One write of each operation through the proxy, as an agent would make them. The positive control runs on the
    newest success of each operation: no later write changes or deletes what the newest create made."""
    key = uuid.uuid4().hex[:8]
    posts, comments = f"{server.base}/posts", f"{server.base}/comments"
    with proxy_client(proxy_url) as client:
        assert client.post(posts, json={"id": f"q-{key}", "title": f"deleted {key}"}).status_code == 201
        assert client.delete(f"{posts}/q-{key}").status_code == 200
        assert client.post(posts, json={"id": f"r-{key}", "title": f"first {key}", "body": "x"}).status_code == 201
        assert client.put(f"{posts}/r-{key}", json={"title": f"renamed {key}"}).status_code == 200
        assert client.patch(f"{posts}/r-{key}", json={"body": "y"}).status_code == 200
        assert client.post(posts, json={"id": f"p-{key}", "title": f"kept {key}"}).status_code == 201
        # comments of a post that stays (json-server deletes orphans on any delete), the deleted one made first: a
        # new comment gets the highest id + 1, so one made after the highest was deleted would take its id, and the
        # delete's lookup would see it (its positive control fails then, as it should)
        gone = client.post(comments, json={"postId": f"p-{key}", "body": f"deleted {key}"}).json()["id"]
        assert client.post(comments, json={"postId": f"p-{key}", "body": f"kept {key}"}).status_code == 201
        assert client.delete(f"{comments}/{gone}").status_code == 200


def test_suggested_rules_are_proven_by_the_verifier_controls_on_the_real_server(server, tmp_path, capsys, monkeypatch):
    config_path = pasted(tmp_path, suggested(server, capsys))
    database = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(database)
    proxy = start_inprocess_proxy(config_path, database, tmp_path / "mitmproxy")
    try:
        write_each_operation(proxy.url, server)
    finally:
        proxy.stop()
    with open_store(database) as store:
        receipts = once_moved_on(lambda: store.receipts.list(limit=None))
    assert len(receipts) == 9 and {r.state for r in receipts} == {"succeeded"}
    assert {r.operation for r in receipts} == READ_RULES

    monkeypatch.setenv("RECEIPTS_DATABASE_URL", database)
    assert main(["rules", "check", "--json", "--config", str(config_path)]) == 0
    checked = {h["operation"]: h for h in json.loads(capsys.readouterr().out)}

    assert set(checked) == READ_RULES
    results = {name: (h["positive"]["result"], h["negative"]["result"]) for name, h in checked.items()}
    assert results == dict.fromkeys(READ_RULES, ("passed", "passed")), checked
    assert all(h["proven"] for h in checked.values()), checked


def test_a_suggested_rule_settles_a_write_whose_answer_was_lost(server, tmp_path, capsys):
    config = load_config(pasted(tmp_path, suggested(server, capsys)))
    database = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(database)
    key = uuid.uuid4().hex[:8]
    with open_store(database) as store:
        writes = Writes(server, store, config)
        writes.succeeded({"id": f"k-{key}", "title": f"known {key}"})  # the known success the controls run on
        post_lost = writes.unknown({"id": f"p-{key}", "title": f"lost {key}"}, committed=True)
        post_unseen = writes.unknown({"id": f"u-{key}", "title": f"unseen {key}"}, committed=False)
        comment_lost = writes.unknown({"postId": f"k-{key}", "body": f"lost {key}"}, committed=True, path="/comments")

        asyncio.run(Reconciler(config, store).run_once())

        lost = store.receipts.get(post_lost)
        assert (lost.state, lost.external_id) == ("succeeded", f"p-{key}")
        comment = store.receipts.get(comment_lost)
        assert comment.state == "succeeded" and comment.external_id == str(server_comment_id(server, f"lost {key}"))
        unseen = store.receipts.get(post_unseen)
        detail = store.receipts.history(post_unseen)[-1].detail
        assert (unseen.state, detail["result"]) == ("manual_review", "absent"), detail
        assert "absent_means manual_review" in detail["reason"]


def server_comment_id(server: JsonServer, body: str) -> int:
    found = httpx.get(f"{server.base}/comments", params={"body": body}, trust_env=False, timeout=10).json()
    assert len(found) == 1
    return found[0]["id"]
