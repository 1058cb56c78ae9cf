"""README, "Point an agent at it", and docs/agents.md, run as written: the exports `receipts env` prints, evaluated
by a real shell, point real clients at a real proxy, and every write they make is journaled.

Each snippet of those pages marked `<!-- tested: NAME -->` is taken from them as it is and run against a
local upstream (its `https://api.example.com` replaced), over HTTPS through mitmproxy's CA and over plain
HTTP: curl (a subprocess), Python's requests, httpx and aiohttp (subprocesses of this interpreter), and Node.js
with undici's EnvHttpProxyAgent (`npm install undici@7` into a temporary directory). The README's one-line check
is run too, with and without the exports. `NODE_USE_ENV_PROXY=1` needs Node 24: the `node` on PATH when it is
new enough, else npm's `node-<platform>@24` package in a temporary directory.

npm must reach its registry: when it cannot, the Node tests are skipped with the reason, except under CI=true,
where they fail.
"""

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.e2e import migrate as migrate_url
from support.e2e import open_store, self_signed_server_context, settled, tag
from support.proxy import REPO, start_inprocess_proxy
from support.upstream import start_upstream

from tests.conftest import IN_CI

PAGES = (REPO / "README.md", REPO / "docs" / "agents.md")  # the short version and the whole one
PLACEHOLDER = "https://api.example.com/articles"
OP_ID = re.compile(r"op_[0-9a-f]{32}")
PYTHON_CLIENTS = ("requests", "httpx", "aiohttp")


def snippet(name: str) -> str:
    """The code block marked `<!-- tested: NAME -->`; a block shown on both pages must read the same on both."""
    marked = rf"<!-- tested: {re.escape(name)} -->\s*```[a-z]*\n(.*?)```"
    found = [block for page in PAGES for block in re.findall(marked, page.read_text(), re.S)]
    assert found, f"no block marked <!-- tested: {name} --> in {', '.join(page.name for page in PAGES)}"
    assert len(set(found)) == 1, f"the blocks marked <!-- tested: {name} --> differ between the pages"
    return found[0]


def need(problem: str) -> None:
    if IN_CI:
        pytest.fail(problem, pytrace=False)
    pytest.skip(problem)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A migrated SQLite journal, a real proxy (trusting the self-signed upstream: ssl_insecure), an HTTP and an
    HTTPS upstream, and the environment `eval "$(receipts env ...)"` gives a shell."""
    tmp = tmp_path_factory.mktemp("agents")
    url = f"sqlite:///{tmp / 'receipts.db'}"
    migrate_url(url)
    config = tmp / "config.yaml"
    config.write_text(f"secret_file: {tmp / 'secret'}\n")
    confdir = tmp / "confdir"
    plain, tls = start_upstream(), start_upstream(ssl_context=self_signed_server_context(tmp))
    proxy = start_inprocess_proxy(config, url, confdir, ssl_insecure=True)
    home = tmp / "home"
    home.mkdir()
    bare = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    script = (f'eval "$({sys.executable} -m proxy_addon.cli env --listen-port {proxy.port} --confdir {confdir})" '
              "&& env -0")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**bare, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    env = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    env.pop("PYTHONPATH")  # the clients get only what `receipts env` exports
    try:
        yield {"url": url, "proxy": proxy, "env": env, "bare": bare, "tmp": tmp,
               "bases": {"https": f"https://127.0.0.1:{tls.port}", "http": f"http://127.0.0.1:{plain.port}"}}
    finally:
        proxy.stop()
        plain.stop()
        tls.stop()


def assert_journaled(world, path: str, output: str) -> None:
    """The client printed the X-Receipt-Id of a succeeded receipt for exactly this request."""
    ids = OP_ID.findall(output)
    assert ids, f"no X-Receipt-Id in the client's output: {output!r}"
    with open_store(world["url"]) as store:
        receipt = settled(store, ids[0])
    assert (receipt.method, receipt.path, receipt.state, receipt.status_code) == ("POST", path, "succeeded", 201)


def run(command: list[str], env: dict, cwd: Path | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def target(world, scheme: str, client: str) -> tuple[str, str]:
    path = f"/{client}/{tag()}/articles"
    return world["bases"][scheme] + path, path


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_curl(world, scheme):
    url, path = target(world, scheme, "curl")
    command = snippet("curl").replace(PLACEHOLDER, url)
    assert_journaled(world, path, run(["bash", "-c", command], world["env"]))


@pytest.mark.parametrize("scheme", ["https", "http"])
@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_python_clients(world, client, scheme):
    url, path = target(world, scheme, client)
    code = snippet(client).replace(PLACEHOLDER, url)
    assert_journaled(world, path, run([sys.executable, "-c", code], world["env"]))


def test_the_one_line_check(world):
    """Through the proxy it prints the receipt's id (the proxy answered for an address that never resolves);
    without the exports, nothing."""
    check = snippet("check").strip()
    out = run(["bash", "-c", check], world["env"])
    assert re.fullmatch(r"x-receipt-id: op_[0-9a-f]{32}\s*", out, re.I), out
    with open_store(world["url"]) as store:
        receipt = settled(store, OP_ID.search(out).group(0))
    assert (receipt.host, receipt.state, receipt.error_code) == ("receipts-check.invalid", "rejected", "not_sent")
    bypassed = subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=60, env=world["bare"])
    assert bypassed.stdout == ""


# -- Node.js -------------------------------------------------------------------------------------------------


def npm_install(prefix: Path, package: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        need("npm is not installed")
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        need(f"npm install {package} failed (is the npm registry reachable?): {done.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def undici(tmp_path_factory) -> Path:
    """A directory with undici 7 in its node_modules (undici 8 needs Node 22.19)."""
    if shutil.which("node") is None:
        need("node is not installed")
    prefix = tmp_path_factory.mktemp("undici")
    npm_install(prefix, "undici@7")
    return prefix


def node_version(node: str) -> tuple[int, ...]:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    return tuple(int(p) for p in out.strip().lstrip("v").split("."))


@pytest.fixture(scope="module")
def node24(tmp_path_factory) -> str:
    """A Node.js of 24 or later: the one on PATH, else npm's prebuilt `node-<os>-<arch>@24`."""
    node = shutil.which("node")
    if node and node_version(node) >= (24, 5):
        return node
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if arch is None or sys.platform not in ("linux", "darwin"):
        pytest.skip(f"no prebuilt Node.js 24 package for {sys.platform} {platform.machine()}")
    package = f"node-{sys.platform}-{arch}"
    prefix = tmp_path_factory.mktemp("node24")
    npm_install(prefix, f"{package}@24")
    return str(prefix / "node_modules" / package / "bin" / "node")


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_node_with_undici(world, undici, scheme):
    url, path = target(world, scheme, "node")
    agent = undici / f"agent-{scheme}.mjs"  # beside node_modules, so that `import 'undici'` finds it
    agent.write_text(snippet("node").replace(PLACEHOLDER, url))
    assert_journaled(world, path, run(["node", str(agent)], world["env"], cwd=undici))


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_node_use_env_proxy(world, node24, tmp_path, scheme):
    """Node 24 and later: the same agent without undici, run with NODE_USE_ENV_PROXY=1."""
    url, path = target(world, scheme, "node24")
    code = "\n".join(line for line in snippet("node").splitlines() if "undici" not in line and "Dispatcher" not in line)
    agent = tmp_path / "agent.mjs"
    agent.write_text(code.replace(PLACEHOLDER, url))
    assert_journaled(world, path, run([node24, str(agent)], {**world["env"], "NODE_USE_ENV_PROXY": "1"}))
