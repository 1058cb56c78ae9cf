"""docs/agents.md's agent loop that asks before it retries, run as written (its `<!-- tested: ask-before-retry -->`
block, its URL pointed at a local upstream), as a process of its own behind a real proxy, with the environment an
agent gets (the proxy variables and the CA file).

Its first write reaches the upstream, which makes the article and never answers: the agent gets a 504. It asks
`POST /check` before sending again (refused: the write may have happened), waits on the receipt, and the
proxy's own reconciler reads the upstream meanwhile and settles it as succeeded: the loop ends with that receipt,
and the article exists once.
"""

import os
import subprocess
import sys
import threading

import yaml
from support.e2e import open_store, wait_for
from support.proxy import start_inprocess_proxy
from support.reconcile import articles_rule, search
from support.world import COMMIT_THEN_HANG, start_world

from tests.conftest import migrate
from tests.e2e.test_agent_clients import OP_ID, PLACEHOLDER, snippet


def test_the_documented_loop_asks_before_it_retries_and_ends_with_the_reconcilers_verdict(tmp_path):
    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    migrate(url)
    world = start_world()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "secret_file": str(tmp_path / "secret"),
        "logging": {"level": "warning"},
        "defaults": {"upstream_timeout": "1s"},
        "reconcile": {"in_proxy": True, "interval": "500ms", "backoff": "50ms", "per_host_rate": 1000},
        "hosts": {world.netloc: {"operations": [articles_rule(search())]}},
    }))
    proxy = start_inprocess_proxy(config, url, tmp_path / "confdir")
    world.article_mode = COMMIT_THEN_HANG

    def answer_again_once_the_first_write_is_made() -> None:
        wait_for(lambda: world.settled_writes >= 1, 30)
        world.article_mode = "ok"

    threading.Thread(target=answer_again_once_the_first_write_is_made, daemon=True).start()
    code = snippet("ask-before-retry").replace(PLACEHOLDER, f"{world.base}/api/articles")
    env = {"PATH": os.environ["PATH"], "HTTP_PROXY": proxy.url, "HTTPS_PROXY": proxy.url,
           "SSL_CERT_FILE": str(tmp_path / "confdir" / "mitmproxy-ca-cert.pem")}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        [operation_id] = OP_ID.findall(done.stdout)
        with open_store(url) as store:
            receipts = [r for r in store.receipts.list(limit=None) if r.path == "/api/articles"]
            assert [r.operation_id for r in receipts] == [operation_id]  # one write, never sent again
            assert receipts[0].state == "succeeded"
            assert [t.to_state for t in store.receipts.history(operation_id)][2:] == [
                "outcome_unknown", "reconciling", "succeeded"
            ]
        assert len(world.article_ids_titled("hello")) == 1
        assert len(world.received("POST", "/api/articles")) == 1
    finally:
        proxy.stop()
        world.stop()
