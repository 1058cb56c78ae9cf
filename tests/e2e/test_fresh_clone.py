"""A newcomer's first command, from a fresh clone: `git clone` of this repository into a temporary directory,
`make run PORT=<free port>` there, one write through the proxy it starts journaled in the clone's own SQLite
file (beside its config.yaml), then the proxy stopped.

To stay fast, the clone reuses this test's virtualenv through the Makefile's `VENV=` instead of creating and
filling its own, and `make -o <venv>/.installed` marks that venv's install stamp as done, so that pip never
installs the clone into the shared venv; PYTHONPATH points at the clone, so the clone's code is what runs. The
install step itself (`make venv`) is therefore not exercised here. The clone holds what is committed, not the
working tree's uncommitted changes. Every wait is bounded: the port is polled, no fixed sleep.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.e2e import open_store, tag
from support.proxy import REPO
from support.server import free_port, listens
from support.upstream import start_upstream

from tests.conftest import IN_CI

START_TIMEOUT = 120  # migrate and start, on a loaded two-core machine


def need(problem: str) -> None:
    if IN_CI:
        pytest.fail(problem, pytrace=False)
    pytest.skip(problem)


@pytest.fixture
def clone(tmp_path) -> Path:
    inside = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--git-dir"], capture_output=True, text=True, timeout=30)
    if inside.returncode != 0:
        need(f"{REPO} is not a git checkout: {inside.stderr.strip()}")
    target = tmp_path / "receipts"
    done = subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return target


def test_make_run_in_a_fresh_clone_journals_a_write(clone, tmp_path):
    venv = Path(sys.prefix)
    stamp = venv / ".installed"
    if not (venv / "bin" / "receipts").exists() or not stamp.exists():
        need(f"{venv} is not a virtualenv made by `make venv` (no bin/receipts or .installed)")
    port = free_port()
    home = tmp_path / "home"  # mitmproxy creates its CA in ~/.mitmproxy: not the user's own
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(clone), "LANG": "C.UTF-8"}
    log_path = tmp_path / "make-run.log"
    upstream = start_upstream()
    with open(log_path, "wb") as log:
        make = subprocess.Popen(
            ["make", "run", f"PORT={port}", f"VENV={venv}", "-o", str(stamp)],
            cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not listens(make.pid, port):
            assert make.poll() is None, f"make run exited with {make.returncode}: {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"nothing listens on {port} after {START_TIMEOUT} s: {log_path.read_text()[-3000:]}"
            time.sleep(0.1)
        path = f"/fresh-clone/{tag()}"
        with httpx.Client(proxy=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as agent:
            answer = agent.post(upstream.base + path, json={"title": "my first receipt"})
        assert answer.status_code == 201 and answer.headers["X-Receipt-State"] == "succeeded", answer.text
    finally:
        os.killpg(make.pid, signal.SIGTERM)  # make and the proxy it started: the session this test created
        try:
            make.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(10)
        upstream.stop()
    output = log_path.read_text()
    assert f"receipts env --listen-port {port}" in output  # the clone's Makefile told how to point an agent at it
    assert f"listening at 127.0.0.1:{port}" in output
    assert (clone / ".receipts-secret").exists()  # secret_file, relative to the clone's config.yaml
    with open_store(f"sqlite:///{clone / 'receipts.db'}") as store:
        receipt = store.receipts.get(answer.headers["X-Receipt-Id"])
    assert (receipt.path, receipt.state, receipt.status_code) == (path, "succeeded", 201)
    assert upstream.count("POST", path) == 1
