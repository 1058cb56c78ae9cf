"""The proxy as the operator runs it: `receipts proxy` and plain `mitmdump -s` as real processes, HTTPS
through mitmproxy's CA to a TLS upstream, and recovery after a SIGKILL in the middle of a write."""

import os
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from support.e2e import (
    PROBLEM_JSON,
    open_store,
    proxy_client,
    receipts_for,
    self_signed_server_context,
    stop_process,
    tag,
    wait_for,
)
from support.e2e import migrate as migrate_url
from support.proxy import REPO, process_gone, start_inprocess_proxy, start_proxy_process, writer_pid
from support.server import free_port, listens
from support.upstream import start_upstream

MITMDUMP = Path(sys.executable).parent / "mitmdump"


@pytest.fixture
def upstream():
    up = start_upstream()
    try:
        yield up
    finally:
        up.stop()


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"secret_file: {tmp_path / 'secret'}\n{extra}")
    return path


def run_proxy_command(config: Path, database_url: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECEIPTS_DATABASE_URL": database_url}
    return subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "proxy", "--config", str(config),
         "--listen-port", str(free_port()), "--confdir", str(tmp_path / "confdir")],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60,
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


# -- refusing to start --------------------------------------------------------------------------------------


def test_proxy_refuses_an_unmigrated_database(db_url, tmp_path):
    result = run_proxy_command(write_config(tmp_path), db_url, tmp_path)
    assert result.returncode != 0
    assert "receipts db upgrade" in one_line(result)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("defaults:\n  upstream_timeout: soon\n", "defaults.upstream_timeout"),
        ("proxy:\n  colour: blue\n", "proxy.colour"),
        ('hosts:\n  "api.example.com":\n    operations:\n      - {name: x, method: "GE T", path: /x}\n', "operations.0.method"),
        ("proxy:\n  methods: [POST, 'NOT A TOKEN']\n", "proxy.methods"),
    ],
)
def test_proxy_refuses_an_invalid_config(extra, key, sqlite_url, tmp_path):
    migrate_url(sqlite_url)
    result = run_proxy_command(write_config(tmp_path, extra), sqlite_url, tmp_path)
    assert result.returncode == 2
    assert key in one_line(result)


def test_proxy_refuses_a_database_it_cannot_open(tmp_path):
    result = run_proxy_command(write_config(tmp_path), f"sqlite:///{tmp_path / 'missing-dir' / 'receipts.db'}", tmp_path)
    assert result.returncode == 1
    assert "cannot open the database" in one_line(result)


# -- plain mitmdump -----------------------------------------------------------------------------------------


def test_mitmdump_with_the_addon_script_journals_a_post(sqlite_url, upstream, tmp_path):
    migrate_url(sqlite_url)
    config = write_config(tmp_path)
    port = free_port()
    log_path = tmp_path / "mitmdump.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(MITMDUMP), "-q", "--listen-host", "127.0.0.1", "-p", str(port),
             "--set", f"confdir={tmp_path / 'confdir'}", "-s", str(REPO / "proxy_addon" / "addon.py"),
             "--set", f"receipts_config={config}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
            env={**os.environ, "RECEIPTS_DATABASE_URL": sqlite_url},
        )
    try:
        assert wait_for(lambda: listens(proc.pid, port) or proc.poll() is not None, 30), "mitmdump did not start"
        assert proc.poll() is None, log_path.read_text()
        path = f"/mitmdump/{tag()}"
        with proxy_client(f"http://127.0.0.1:{port}") as client:
            r = client.post(upstream.base + path, json={"via": "mitmdump"})
            assert r.status_code == 201, r.text
            assert r.headers["X-Receipt-State"] == "succeeded"
            assert "X-Receipt-Id" not in client.get(upstream.base + path).headers
        writer = writer_pid(proc.pid)  # the addon started its journal writer under plain mitmdump too
        assert writer is not None
    finally:
        stop_process(proc)
    assert wait_for(lambda: process_gone(writer), 10), "the journal writer outlived mitmdump"
    with open_store(sqlite_url) as store:
        [receipt] = receipts_for(store, path)
    assert receipt.operation_id == r.headers["X-Receipt-Id"]
    assert receipt.state == "succeeded"
    assert upstream.count("POST", path) == 1


# -- HTTPS --------------------------------------------------------------------------------------------------


@pytest.fixture
def tls_upstream(tmp_path):
    up = start_upstream(ssl_context=self_signed_server_context(tmp_path))
    try:
        yield up
    finally:
        up.stop()


def test_https_through_the_proxy_is_journaled(sqlite_url, tls_upstream, tmp_path):
    migrate_url(sqlite_url)
    confdir = tmp_path / "confdir"
    proxy = start_inprocess_proxy(write_config(tmp_path), sqlite_url, confdir, ssl_insecure=True)
    path = f"/secure/{tag()}"
    url = f"https://127.0.0.1:{tls_upstream.port}{path}"
    try:
        trust = ssl.create_default_context(cafile=str(confdir / "mitmproxy-ca-cert.pem"))
        with proxy_client(proxy.url, verify=trust) as client:
            r = client.post(url, json={"over": "tls"})
            assert r.status_code == 201, r.text
            assert r.headers["X-Receipt-State"] == "succeeded"
            op = r.headers["X-Receipt-Id"]
            assert "X-Receipt-Id" not in client.get(url).headers
    finally:
        proxy.stop()
    with open_store(sqlite_url) as store:
        receipt = store.receipts.get(op)
    assert (receipt.scheme, receipt.port, receipt.path, receipt.state) == ("https", tls_upstream.port, path, "succeeded")
    assert tls_upstream.count("POST", path) == 1


def test_https_upstream_with_an_untrusted_certificate_is_not_sent(sqlite_url, tls_upstream, tmp_path):
    """Without ssl_insecure the upstream's self-signed certificate fails the handshake: 502, retry allowed."""
    migrate_url(sqlite_url)
    confdir = tmp_path / "confdir"
    proxy = start_inprocess_proxy(write_config(tmp_path), sqlite_url, confdir)
    path = f"/untrusted/{tag()}"
    try:
        trust = ssl.create_default_context(cafile=str(confdir / "mitmproxy-ca-cert.pem"))
        with proxy_client(proxy.url, verify=trust) as client:
            r = client.post(f"https://127.0.0.1:{tls_upstream.port}{path}", json={"over": "tls"})
    finally:
        proxy.stop()
    assert r.status_code == 502, r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    assert r.json()["type"].endswith("not-sent")
    with open_store(sqlite_url) as store:
        receipt = store.receipts.get(r.headers["X-Receipt-Id"])
    assert (receipt.state, receipt.error_code) == ("rejected", "not_sent")
    assert tls_upstream.count(path=path) == 0


# -- crash recovery -----------------------------------------------------------------------------------------


def test_sigkill_mid_request_is_recovered_as_outcome_unknown(db_url, upstream, tmp_path):
    migrate_url(db_url)
    config = write_config(tmp_path, "proxy:\n  heartbeat_interval: 1s\n  instance_dead_after: 3s\n")
    confdir = tmp_path / "confdir"
    path = f"/held/{tag()}"  # answered only once the proxy is dead
    proc, port = start_proxy_process(config, db_url, confdir, tmp_path / "first.log")
    outcome: dict = {}

    def agent() -> None:
        try:
            with proxy_client(f"http://127.0.0.1:{port}", timeout=20) as client:
                outcome["response"] = client.post(upstream.base + path, json={"crash": path})
        except httpx.HTTPError as e:
            outcome["error"] = e

    thread = threading.Thread(target=agent, daemon=True)
    try:
        thread.start()
        assert wait_for(lambda: upstream.count("POST", path) == 1, 10), "the upstream never received the write"
        with open_store(db_url) as store:
            [receipt] = receipts_for(store, path, timeout=0)  # held upstream: still in flight
        assert receipt.state == "submitted"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
        upstream.release(path)
    thread.join(10)
    assert "error" in outcome, outcome  # the agent lost its connection; it never got an answer

    second, _ = start_proxy_process(config, db_url, confdir, tmp_path / "second.log")
    try:
        with open_store(db_url) as store:
            recovered = wait_for(lambda: store.receipts.get(receipt.operation_id).state == "outcome_unknown", 30, 0.25)
            after = store.receipts.get(receipt.operation_id)
            history = store.receipts.history(receipt.operation_id)
    finally:
        stop_process(second)
    assert recovered, f"receipt still {after.state} after 30 s"
    assert after.error_code == "proxy_interrupted"
    assert [(t.from_state, t.to_state) for t in history][-1] == ("submitted", "outcome_unknown")
    assert upstream.count("POST", path) == 1
