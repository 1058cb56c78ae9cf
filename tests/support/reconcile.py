"""The reconciliation tests' environment: a world (support/world.py), its config, an emptied database, and the
receipts made unknown, either through a real in-process proxy (`through_proxy=True`) or straight in the store,
the way the proxy would have made them, without one (unit tests of the worker: no proxy, no timeout to wait out).
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import text

from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.db import make_engine
from proxy_addon.keyfiles import load_or_create_key
from proxy_addon.protocols.facts import RequestFacts, split_query
from proxy_addon.reconcile.worker import PassReport, Reconciler
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.records import TransitionRecord, new_operation_id
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from support.e2e import settled
from support.proxy import RunningProxy, start_inprocess_proxy
from support.world import World, start_world

AS_IF_PROXY = "test-proxy-instance"


@dataclass
class Env:
    world: World
    store: ReceiptStore
    config: ReceiptsConfig
    config_path: Path
    database_url: str
    proxy: RunningProxy | None = None
    client: httpx.Client | None = None  # through the proxy

    def post(self, path: str, document: Any, **kw: Any) -> httpx.Response:
        assert self.client is not None, "make_env(..., through_proxy=True) for requests through the proxy"
        return self.client.post(self.world.base + path, json=document, **kw)

    def unknown(self, path: str, document: Any, method: str = "POST", headers: dict[str, str] | None = None) -> str:
        """A write the world leaves unanswered, made outcome_unknown: through the proxy (its 504), or as the
        proxy would have recorded it. Returns the receipt's id."""
        if self.client is not None:
            r = self.client.request(method, self.world.base + path, json=document, headers=headers)
            operation_id = outcome_unknown(r)
            settled(self.store, operation_id)  # its verdict committed: the reconciler may claim it
            return operation_id
        return self._unknown_without_proxy(method, path, document, headers or {})

    def known_success(self, path: str, document: Any, method: str = "POST") -> str:
        """A write that succeeded (the world must be in its `ok` mode): the known effect a read rule's positive
        control is run on. Through the proxy, or journaled as the proxy would have. Returns the receipt's id."""
        if self.client is not None:
            r = self.client.request(method, self.world.base + path, json=document)
            assert r.status_code < 300 and r.headers["X-Receipt-State"] == "succeeded", r.text
            return settled(self.store, r.headers["X-Receipt-Id"]).operation_id
        operation_id, facts, sent, body = self._journaled(method, path, document, {})
        r = httpx.request(method, facts.url, headers=sent, content=body, timeout=10, trust_env=False)
        assert r.status_code < 300, r.text
        found = r.json().get("id") if r.content else None
        self.store.receipts.transition(
            operation_id, State.SUBMITTED, State.SUCCEEDED, {"who": AS_IF_PROXY}, status_code=r.status_code,
            external_id=None if found is None else str(found),
        )
        return operation_id

    def _unknown_without_proxy(self, method: str, path: str, document: Any, headers: dict[str, str]) -> str:
        """The proxy's own steps, with its own code for the intent: journal (planned, submitted), send the write to
        the world, and once the world is done with it (stored or not, now hanging), record the timeout."""
        operation_id, facts, sent, body = self._journaled(method, path, document, headers)
        before = self.world.settled_writes
        threading.Thread(target=_send_and_forget, args=(method, facts.url, sent, body), daemon=True).start()
        assert self.world.wait_settled(before + 1), "the world never took the write"
        self.store.receipts.transition(
            operation_id, State.SUBMITTED, State.OUTCOME_UNKNOWN, {"who": AS_IF_PROXY, "end": "upstream_timeout"},
            error_code="upstream_timeout", error_message="TimeoutError: read timeout (as the proxy would say)",
        )
        return operation_id

    def _journaled(
        self, method: str, path: str, document: Any, headers: dict[str, str]
    ) -> tuple[str, RequestFacts, dict[str, str], bytes]:
        """The receipt the proxy would write, `submitted`, before it sends the write."""
        policy = self.config.policy_for("127.0.0.1", self.world.port)
        body = b"" if document is None else json.dumps(document).encode()
        sent = {**({"content-type": "application/json"} if body else {}), **headers}
        operation_id = new_operation_id()
        key = next((v for k, v in sent.items() if k.lower() == policy.idempotency_key_header.lower()), None)
        if key is None and policy.inject_idempotency_key:
            key = sent[policy.idempotency_key_header] = operation_id
        path_only, query = split_query(path)
        facts = RequestFacts(method, "http", "127.0.0.1", self.world.port, path_only, query, list(sent.items()),
                             sent.get("content-type"), body, url=self.world.base + path)
        hasher = AccountHasher(load_or_create_key(self.config.secret_file))
        intent, _ = build_intent(facts, policy, hasher, AS_IF_PROXY, self.config.proxy.max_stored_body, key, operation_id)
        self.store.receipts.record_and_submit(intent, policy.after_success, AS_IF_PROXY)
        return operation_id, facts, sent, body

    def reconcile(self, worker_id: str | None = None) -> PassReport:
        return asyncio.run(Reconciler(self.config, self.store, worker_id).run_once())


def _send_and_forget(method: str, url: str, headers: dict[str, str], body: bytes) -> None:
    """The write the proxy sent; the world hangs on it until it stops, and nobody waits for the answer."""
    try:
        httpx.request(method, url, headers=headers, content=body, timeout=30, trust_env=False)
    except httpx.HTTPError:
        pass


def emptied(database_url: str) -> str:
    """The database with no receipt and no proxy instance left."""
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            for table in ("receipt_transitions", "receipts", "proxy_instances", "verifier_controls"):
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()
    return database_url


def env_factory(db_url: str, tmp_path: Path, through_proxy: bool) -> Iterator[Callable[..., Env]]:
    """For a fixture: `make_env(operations, reconcile=None, **host_settings)` -> Env; afterwards every receipt's
    history is checked whole."""
    envs: list[Env] = []
    with ExitStack() as stack:

        def make(operations: list[dict[str, Any]], reconcile: dict[str, Any] | None = None, **host: Any) -> Env:
            world = start_world()
            stack.callback(world.stop)
            config_path = tmp_path / "config.yaml"
            settings = {"backoff": "50ms", "lease": "30s", "per_host_rate": 1000, "concurrency": 4, "batch_size": 10}
            config_path.write_text(
                yaml.safe_dump(
                    {
                        "secret_file": str(tmp_path / "secret"),
                        "defaults": {"upstream_timeout": PROXY_TIMEOUT, "connect_timeout": "2s"},
                        "reconcile": {**settings, **(reconcile or {})},
                        "logging": {"level": "warning", "format": "json"},
                        "hosts": {world.netloc: {"operations": operations, **host}},
                    }
                )
            )
            engine = make_engine(db_url)
            stack.callback(engine.dispose)
            env = Env(world, ReceiptStore(engine), load_config(config_path), config_path, db_url)
            if through_proxy:
                env.proxy = start_inprocess_proxy(config_path, db_url, tmp_path / "confdir")
                stack.callback(env.proxy.stop)
                env.client = stack.enter_context(httpx.Client(proxy=env.proxy.url, trust_env=False, timeout=15))
            envs.append(env)
            return env

        yield make
        for env in envs:
            if env.proxy is not None:
                env.proxy.stop()  # its last verdicts committed: none moves while the histories are read
            assert_history_is_whole(env.store)


PROXY_TIMEOUT = "0.3s"
PROBLEM_JSON = "application/problem+json"
ARTICLES_URL = "{scheme}://{netloc}/api/articles?per_page=30"


def assert_history_is_whole(store: ReceiptStore) -> None:
    """After every test: each receipt's history chains from planned to its state, every verdict of a
    worker names it and says why, and nothing was reconciled that had not been outcome_unknown first."""
    for receipt in store.receipts.list(limit=None):
        history = store.receipts.history(receipt.operation_id)
        states = [t.to_state for t in history]
        assert [t.from_state for t in history] == [None, *states[:-1]], states
        assert states[-1] == receipt.state
        for i, t in enumerate(history):
            if t.from_state == "reconciling":
                assert t.detail.get("who") and (t.detail.get("result") or t.detail.get("reason")), t.detail
            if t.to_state == "reconciling":
                assert states[i - 1] == "outcome_unknown" and "submitted" in states[:i]


def outcome_unknown(r: httpx.Response) -> str:
    assert r.status_code == 504, r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    assert r.json()["type"].endswith("outcome-unknown")
    assert r.headers["X-Receipt-State"] == "outcome_unknown"
    return r.headers["X-Receipt-Id"]


def steps(store: ReceiptStore, op: str) -> list[tuple[str | None, str]]:
    return [(t.from_state, t.to_state) for t in store.receipts.history(op)]


def verdict(store: ReceiptStore, op: str) -> TransitionRecord:
    """The last transition, which must be a reconciler's verdict."""
    last = store.receipts.history(op)[-1]
    assert last.from_state == "reconciling", steps(store, op)
    return last


UNKNOWN_THEN = [(None, "planned"), ("planned", "submitted"), ("submitted", "outcome_unknown"), ("outcome_unknown", "reconciling")]


def assert_unknown_kept(store: ReceiptStore, op: str) -> None:
    """The history still says the receipt was unknown, and why: nothing was overwritten."""
    history = store.receipts.history(op)
    unknown = [t for t in history if t.to_state == "outcome_unknown" and t.from_state == "submitted"]
    assert len(unknown) == 1
    assert [(t.from_state, t.to_state) for t in history[:4]] == UNKNOWN_THEN
    assert store.receipts.get(op).error_code == "upstream_timeout"


def title() -> str:
    return f"Receipts are durable {uuid.uuid4().hex[:8]}"


# -- rules ----------------------------------------------------------------------------------------------------


def articles_rule(reconcile: dict[str, Any], retry_safe: bool = True, **kw: Any) -> dict[str, Any]:
    return {
        "name": "articles.create",
        "method": "POST",
        "path": "/api/articles",
        "fingerprint": {"fields": ["$.title", "$.body_markdown"]},
        "external_id": "$.id",
        "retry_safe": retry_safe,
        "reconcile": reconcile,
        **kw,
    }


def search(**kw: Any) -> dict[str, Any]:
    return {
        "strategy": "search",
        "url": ARTICLES_URL,
        "items": "$.items",
        "match": {"$.title": "$.title"},
        "id": "$.id",
        "settle": "0s",
        **kw,
    }


def lookup(url: str = "{scheme}://{netloc}/api/articles/{body.id}", **kw: Any) -> dict[str, Any]:
    return {"strategy": "lookup", "url": url, "match": {"$.title": "$.title"}, "id": "$.id", "settle": "0s", **kw}


REFUND_RULE = {
    "name": "refunds.create",
    "method": "POST",
    "path": "/api/charges/{charge_id}/refunds",
    "external_id": "$.id",
    "retry_safe": True,
    "reconcile": {
        "strategy": "search",
        "url": "{scheme}://{netloc}/api/refunds?charge={path.charge_id}",
        "items": "$.items",
        "match": {"$.amount": "$.amount"},
        "id": "$.id",
        "settle": "0s",
    },
}


def _wait_due(env: Env, op: str, limit: float = 3.0) -> None:
    due = env.store.receipts.get(op).next_attempt_at
    assert due is not None
    deadline = time.monotonic() + limit
    while datetime.now(UTC) <= due:
        assert time.monotonic() < deadline, "backoff longer than the test allows"
        time.sleep(0.02)


def delete_rule(absent_means: str, retry_safe: bool = False) -> dict[str, Any]:
    return {
        "name": "articles.delete",
        "method": "DELETE",
        "path": "/api/articles/{id}",
        "retry_safe": retry_safe,
        "reconcile": {
            "strategy": "lookup",
            "url": "{scheme}://{netloc}/api/articles/{path.id}",
            "settle": "0s",
            "absent_means": absent_means,
        },
    }


PAYMENT_RULE = {
    "name": "payments.create",
    "method": "POST",
    "path": "/api/payments",
    "external_id": "$.id",
    "reconcile": {"strategy": "resend_with_key"},
}
