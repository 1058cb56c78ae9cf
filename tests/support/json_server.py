"""json-server (typicode's fake REST API, from npm: a real server nobody here wrote) on 127.0.0.1, and the
verdict the reconciler gives with a read rule against it, for a write that the server committed or never saw.

The server holds `posts` (three seeds first, so that a page of three never reaches a new post), an empty
`comments` collection, and a catch-all route (`/spa/*`, as a single-page app's fallback answers any path with
200). A write is journaled as the proxy journals it (the intent from the proxy's own code), then either sent to
the server, which commits it, or never sent; either way the receipt is made `outcome_unknown` as a timeout
would leave it. A known success (a post created and answered) is made first, for the positive control.
"""

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy_addon.config import ReceiptsConfig, parse_config
from proxy_addon.keyfiles import load_or_create_key
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.records import new_operation_id
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from support.e2e import stop_process, wait_for
from support.proxy import REPO
from support.server import free_port, listens

JSON_SERVER = REPO / ".node" / "node_modules" / ".bin" / "json-server"
SEEDS = [{"id": f"seed-{i}", "title": f"seed {i}", "body": "seed"} for i in range(3)]
AS_IF_PROXY = "test-proxy-instance"


@dataclass
class JsonServer:
    port: int
    proc: subprocess.Popen

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, document: dict[str, Any], path: str = "/posts") -> dict[str, Any]:
        r = httpx.post(f"{self.base}{path}", json=document, timeout=10, trust_env=False)
        assert r.status_code == 201, r.text
        return r.json()


@contextmanager
def json_server(directory: Path) -> Iterator[JsonServer]:
    """json-server on a free loopback port, with its database in `directory`; stopped afterwards."""
    if not JSON_SERVER.exists():
        raise RuntimeError(f"{JSON_SERVER} is missing: run scripts/ensure-json-server (make test does)")
    (directory / "db.json").write_text(json.dumps({"posts": SEEDS, "comments": [], "profile": {"name": "an app"}}))
    (directory / "routes.json").write_text(json.dumps({"/spa/*": "/profile"}))
    port = free_port()
    log = open(directory / "json-server.log", "wb")  # closed with the process, below
    argv = [str(JSON_SERVER), "--host", "127.0.0.1", "--port", str(port), "--routes", "routes.json", "--quiet", "db.json"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    try:
        up = wait_for(lambda: proc.poll() is not None or listens(proc.pid, port), 20, 0.05)
        assert up and proc.poll() is None, (directory / "json-server.log").read_text()[-2000:]
        yield JsonServer(port, proc)
    finally:
        stop_process(proc)
        log.close()


def create_rule(reconcile: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "posts.create",
        "method": "POST",
        "path": "/posts",
        "fingerprint": {"fields": ["$.title", "$.body"]},
        "external_id": "$.id",
        "retry_safe": True,
        "reconcile": {"settle": "0s", "attempts": 1, **reconcile},
    }


def config_text(server: JsonServer, directory: Path, reconcile: dict[str, Any], *more: dict[str, Any]) -> str:
    """config.yaml with the create rule reading by `reconcile`, and any other operation rules."""
    return yaml.safe_dump(
        {
            "secret_file": str(directory / "secret"),
            "reconcile": {"per_host_rate": 1000, "backoff": "50ms"},
            "logging": {"level": "warning", "format": "json"},
            "hosts": {f"127.0.0.1:{server.port}": {"operations": [create_rule(reconcile), *more]}},
        }
    )


def config_for(server: JsonServer, directory: Path, reconcile: dict[str, Any]) -> ReceiptsConfig:
    return parse_config(config_text(server, directory, reconcile))


class Writes:
    """Writes to the server's posts, journaled as the proxy journals them."""

    def __init__(self, server: JsonServer, store: ReceiptStore, config: ReceiptsConfig):
        self.server, self.store, self.config = server, store, config

    def journaled(self, document: dict[str, Any], path: str = "/posts") -> str:
        """The receipt the proxy writes (`submitted`) before it sends the write."""
        policy = self.config.policy_for("127.0.0.1", self.server.port)
        body = json.dumps(document).encode()
        headers = [("content-type", "application/json")]
        facts = RequestFacts("POST", "http", "127.0.0.1", self.server.port, path, [], headers, "application/json",
                             body, url=f"{self.server.base}{path}")  # fmt: skip
        hasher = AccountHasher(load_or_create_key(self.config.secret_file))
        operation_id = new_operation_id()
        intent, _ = build_intent(facts, policy, hasher, AS_IF_PROXY, self.config.proxy.max_stored_body, None, operation_id)
        self.store.receipts.record_and_submit(intent, policy.after_success, AS_IF_PROXY)
        return operation_id

    def succeeded(self, document: dict[str, Any]) -> str:
        """A write the server committed and answered: a known success, with the id it gave."""
        op = self.journaled(document)
        created = self.server.post(document)
        self.store.receipts.transition(
            op, State.SUBMITTED, State.SUCCEEDED, {"who": AS_IF_PROXY}, status_code=201, external_id=str(created["id"])
        )
        return op

    def unknown(self, document: dict[str, Any], committed: bool, path: str = "/posts") -> str:
        """A write whose answer never came: the server committed it, or never saw it."""
        op = self.journaled(document, path)
        if committed:
            self.server.post(document, path)
        self.store.receipts.transition(
            op, State.SUBMITTED, State.OUTCOME_UNKNOWN, {"who": AS_IF_PROXY, "end": "upstream_timeout"},
            error_code="upstream_timeout",
        )  # fmt: skip
        return op


def post(tag: str) -> dict[str, Any]:
    """A post with a client-chosen id (json-server keeps it), so that a lookup can find it by its body."""
    key = uuid.uuid4().hex[:8]
    return {"id": f"p-{key}", "title": f"{tag} {key}", "body": "a post"}
