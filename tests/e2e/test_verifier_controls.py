"""Verifier controls against a real server nobody here wrote (json-server, from npm): read rules written
correctly keep their verdicts, and rules broken the ways people break them (the wrong collection, a query
parameter the server ignores, the wrong items path, a match on a field the server does not return, a catch-all
route that answers 200 for any path) never give `safe_to_retry` or a false `succeeded`: the receipt goes to a
person with `verifier_unproven`, naming the control that failed. Each case runs for a write the server committed
and for one it never saw, with a known success of the same operation and account made first.
"""

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from support.json_server import JsonServer, Writes, config_for, config_text, json_server, post
from support.store import migrated_sqlite, store_copied_from

from proxy_addon.admin.app import create_app
from proxy_addon.cli import main
from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.reconcile.worker import Reconciler
from proxy_addon.store import ReceiptStore

LOOKUP = {"strategy": "lookup", "url": "{scheme}://{netloc}/posts/{body.id}", "match": {"$.title": "$.title"}, "id": "$.id"}
SEARCH = {
    "strategy": "search",
    "url": "{scheme}://{netloc}/posts?title={body.title}&_limit=3",
    "match": {"$.title": "$.title"},
    "id": "$.id",
}
WHOLE_DB = {"strategy": "search", "url": "{scheme}://{netloc}/db", "items": "$.posts", "match": {"$.title": "$.title"}, "id": "$.id"}
CORRECT = {"lookup": LOOKUP, "search": SEARCH, "search of /db": WHOLE_DB}

# rule, break, the broken rule, the control that fails it (None: the read itself goes to a person)
BROKEN: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("lookup", "wrong collection", {**LOOKUP, "url": "{scheme}://{netloc}/comments/{body.id}"}, "positive"),
    ("lookup", "catch-all 200", {"strategy": "lookup", "url": "{scheme}://{netloc}/spa/posts/{body.id}", "id": "$.id"}, "negative"),
    ("lookup", "match on a field not returned", {**LOOKUP, "match": {"$.headline": "$.title"}}, "positive"),
    ("search", "wrong collection", {**SEARCH, "url": "{scheme}://{netloc}/comments?title={body.title}&_limit=3"}, "positive"),
    ("search", "wrong query parameter", {**SEARCH, "url": "{scheme}://{netloc}/posts?titel={body.title}&_limit=3"}, "positive"),
    ("search", "match on a field not returned", {**SEARCH, "match": {"$.headline": "$.title"}}, "positive"),
    ("search of /db", "wrong items path", {**WHOLE_DB, "items": "$.comments"}, "positive"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[JsonServer]:
    with json_server(tmp_path_factory.mktemp("json-server")) as s:
        yield s


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return migrated_sqlite(tmp_path_factory.mktemp("controls-db"))


@pytest.fixture
def settle(server: JsonServer, template: Path, tmp_path: Path) -> Iterator[Callable[..., tuple[ReceiptStore, str]]]:
    """`settle(rule, committed, known=True)`: a known success (unless `known` is false), then an unknown write the
    server committed or never saw, then one reconcile pass; returns the store and the unknown receipt's id."""
    with ExitStack() as stack:

        def run(rule: dict[str, Any], committed: bool, known: bool = True) -> tuple[ReceiptStore, str]:
            store = stack.enter_context(store_copied_from(template, tmp_path / "receipts.db"))
            config = config_for(server, tmp_path, rule)
            writes = Writes(server, store, config)
            if known:
                writes.succeeded(post("known"))
            op = writes.unknown(post("unknown"), committed)
            asyncio.run(Reconciler(config, store).run_once())
            return store, op

        yield run


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-seen"])
@pytest.mark.parametrize("kind", list(CORRECT))
def test_a_correct_rule_keeps_its_verdict(settle, kind, committed):
    store, op = settle(CORRECT[kind], committed)

    receipt = store.receipts.get(op)
    assert receipt.state == ("succeeded" if committed else "safe_to_retry"), store.receipts.history(op)[-1].detail
    detail = store.receipts.history(op)[-1].detail
    controls = {c["control"]: c["result"] for c in detail["controls"]}
    assert controls == ({"negative": "passed"} if committed else {"negative": "passed", "positive": "passed"})
    if committed:
        assert receipt.external_id == json.loads(receipt.request_body)["id"]


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-seen"])
@pytest.mark.parametrize("kind, broken, rule, fails", BROKEN, ids=[f"{k}: {b}" for k, b, _, _ in BROKEN])
def test_a_broken_rule_never_gives_a_false_verdict(settle, kind, broken, rule, fails, committed):
    store, op = settle(rule, committed)

    receipt = store.receipts.get(op)
    detail = store.receipts.history(op)[-1].detail
    assert receipt.state == "manual_review", detail
    if broken == "match on a field not returned" and kind == "lookup" and committed:
        assert (detail["result"], receipt.error_code) == ("mismatch", "upstream_timeout")  # the read's own doubt
        return
    assert (receipt.error_code, detail["unproven"]) == ("verifier_unproven", fails), detail
    assert f"its {fails} control failed" in detail["reason"] and detail["controls"]


def test_without_a_known_success_absence_goes_to_a_person(settle):
    store, op = settle(SEARCH, committed=False, known=False)

    receipt = store.receipts.get(op)
    detail = store.receipts.history(op)[-1].detail
    assert (receipt.state, receipt.error_code, detail["unproven"]) == ("manual_review", "verifier_unproven", "no_known_success")
    assert detail["result"] == "absent" and "no known success" in detail["reason"]


def test_without_a_known_success_presence_still_stands_on_the_negative_control(settle):
    store, op = settle(SEARCH, committed=True, known=False)

    assert store.receipts.get(op).state == "succeeded"
    assert [c["control"] for c in store.receipts.history(op)[-1].detail["controls"]] == ["negative"]


# -- receipts rules check ----------------------------------------------------------------------------------------

UNUSED = {"name": "comments.create", "method": "POST", "path": "/comments", "external_id": "$.id", "reconcile": SEARCH}


def rules_check(config_path: Path, database_url: str, capsys, monkeypatch) -> list[dict[str, Any]]:
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", database_url)
    assert main(["rules", "check", "--json", "--config", str(config_path)]) == 0
    return json.loads(capsys.readouterr().out)


def test_rules_check_proves_a_rule_before_any_unknown_needs_it(server, template, tmp_path, capsys, monkeypatch):
    config_path, database = tmp_path / "config.yaml", tmp_path / "receipts.db"
    with store_copied_from(template, database) as store:
        broken = {**SEARCH, "url": "{scheme}://{netloc}/comments?title={body.title}&_limit=3"}
        config_path.write_text(config_text(server, tmp_path, broken, UNUSED))
        known = Writes(server, store, load_config(config_path)).succeeded(post("known"))
        url = f"sqlite:///{database}"

        first = {h["operation"]: h for h in rules_check(config_path, url, capsys, monkeypatch)}

        assert set(first) == {"posts.create", "comments.create"}
        rule = first["posts.create"]
        assert (rule["host"], rule["proven"]) == (f"127.0.0.1:{server.port}", False)
        assert (rule["positive"]["result"], rule["negative"]["result"]) == ("failed", "passed")
        assert rule["positive"]["known_operation_id"] == known and rule["positive"]["checked_at"]
        evidence = rule["positive"]["evidence"]
        assert evidence["found"] == "absent" and evidence["reads"][0]["url"].startswith(f"{server.base}/comments?title=")
        unused = first["comments.create"]
        assert (unused["proven"], unused["positive"]["result"], unused["negative"]["result"]) == (False, "not_run", "not_run")
        assert_rule_health_shown(load_config(config_path), store, proven="no", unproven_metric=1)

        config_path.write_text(config_text(server, tmp_path, SEARCH, UNUSED))  # the slip fixed
        fixed = {h["operation"]: h for h in rules_check(config_path, url, capsys, monkeypatch)}["posts.create"]
        assert (fixed["proven"], fixed["positive"]["result"], fixed["negative"]["result"]) == (True, "passed", "passed")
        assert fixed["positive"]["evidence"]["matched_id"] == store.receipts.get(known).external_id
        assert_rule_health_shown(load_config(config_path), store, proven="yes", unproven_metric=0)

        runs = len(store.controls.history())
        op = Writes(server, store, load_config(config_path)).unknown(post("unknown"), committed=False)
        asyncio.run(Reconciler(load_config(config_path), store).run_once())
        assert store.receipts.get(op).state == "safe_to_retry"  # on the check's proof: no control ran again
        assert len(store.controls.history()) == runs == 4


def assert_rule_health_shown(config: ReceiptsConfig, store: ReceiptStore, proven: str, unproven_metric: int) -> None:
    """The review page's rule health, and the metric of unproven rules, from the runs on record."""
    client = create_app(config, store).test_client()
    page = client.get("/").get_data(as_text=True)
    table = page[page.index('id="rule-health"') :]
    assert "posts.create" in table and f"<td>{proven}</td>" in table
    metrics = client.get("/metrics").get_data(as_text=True)
    assert f"receipts_unproven_rules {float(unproven_metric)}" in metrics


def test_rules_check_prints_a_table(server, template, tmp_path, capsys, monkeypatch):
    config_path, database = tmp_path / "config.yaml", tmp_path / "receipts.db"
    with store_copied_from(template, database):
        config_path.write_text(config_text(server, tmp_path, SEARCH))
        monkeypatch.setenv("RECEIPTS_DATABASE_URL", f"sqlite:///{database}")
        monkeypatch.setenv("COLUMNS", "200")
        assert main(["rules", "check", "--config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "read rules" in out and "posts.create" in out and "NO" in out and "not run" in out
