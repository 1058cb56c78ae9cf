"""receipts installed like any Python tool: the sdist and the wheel built from a copy of the checkout, the wheel
installed into a fresh venv outside it, then, from an empty directory, `receipts init`, `receipts db upgrade`,
`receipts proxy`, one journaled POST through it to an upstream on loopback, and its receipt read back with
`receipts ls --json`.

The fresh venv takes the wheel's dependencies from the project venv, linked without the index (support/install.py
says how and why that installs nothing but what the wheel declares); the probe below shows that the code running
there is the wheel's, not a checkout's. Every subprocess runs with no PYTHONPATH, from a directory of its own.
"""

import json
import os
import subprocess
import tarfile
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from support.e2e import proxy_client, stop_process, tag
from support.install import REPO, build_dists, copy_build_inputs, install_wheel, run
from support.server import free_port, listens
from support.upstream import start_upstream

from proxy_addon import __version__

START_TIMEOUT = 60  # the proxy's start on a loaded two-core machine
VERDICT_WAIT = 15  # the verdict commits while the answer travels (proxy.answer_first)
MIGRATIONS = sorted(p.name for p in (REPO / "migrations" / "versions").glob("*.py"))
TEMPLATES = sorted(p.name for p in (REPO / "proxy_addon" / "templates").glob("*.html"))
PRESETS = sorted(p.name for p in (REPO / "proxy_addon" / "presets").glob("*.yaml"))

# Run by the fresh venv's python from an empty directory: where its code, migrations and default config come from,
# and the addon file loaded as `mitmdump -s` loads it.
PROBE = """
import importlib.metadata, json, sys
import proxy_addon, proxy_addon.resources as resources
path = list(sys.path)
from mitmproxy.addons.script import load_script
script = load_script(str(resources.ADDON_SCRIPT))
print(json.dumps({
    "package": proxy_addon.__file__,
    "path": path,
    "meta_path": [repr(finder) for finder in sys.meta_path],
    "distribution": str(importlib.metadata.distribution("agent-receipts").locate_file("")),
    "migrations": str(resources.MIGRATIONS_DIR),
    "example_config": str(resources.EXAMPLE_CONFIG),
    "addon_classes": [type(addon).__name__ for addon in script.addons],
    "addon_module": sys.modules[type(script.addons[0]).__module__].__file__,
}))
"""


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel), built once for the module."""
    root = tmp_path_factory.mktemp("build")
    source = copy_build_inputs(root / "source")
    (root / "dist").mkdir()
    return build_dists(source, root / "dist", root / "build-venv")


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> Path:
    """The fresh venv with the wheel installed; its directory."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    install_wheel(dists[1], venv)
    return venv


def clean_env(home: Path, venv: Path) -> dict[str, str]:
    """What a user's shell would pass: no PYTHONPATH, no RECEIPTS_* of the test run; a HOME of its own."""
    return {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "HOME": str(home), "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1"}


def test_the_sdist_and_the_wheel_carry_what_the_commands_read(dists):
    sdist, wheel = dists
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta = HeaderParser().parsestr(archive.read(f"agent_receipts-{__version__}.dist-info/METADATA").decode())
        scripts = archive.read(f"agent_receipts-{__version__}.dist-info/entry_points.txt").decode()
    assert {f"proxy_addon/migrations/versions/{m}" for m in MIGRATIONS} | {"proxy_addon/migrations/env.py"} <= names
    assert {f"proxy_addon/templates/{t}" for t in TEMPLATES} <= names
    assert PRESETS and {f"proxy_addon/presets/{p}" for p in PRESETS} <= names  # `preset: NAME` reads them
    assert {"proxy_addon/config.example.yaml", "proxy_addon/addon.py", "proxy_addon/resources.py"} <= names
    assert not any(n.startswith(("migrations/", "tests/")) for n in names)  # nothing but proxy_addon at the top
    assert "receipts = proxy_addon.cli:main" in scripts
    assert meta["Name"] == "agent-receipts" and meta["Version"] == __version__
    assert meta["Requires-Python"] == ">=3.12" and meta["License-Expression"] and meta["Summary"]
    assert any(c.startswith("Programming Language :: Python :: 3.12") for c in meta.get_all("Classifier"))
    assert {url.split(",")[0] for url in meta.get_all("Project-URL")} >= {"Homepage", "Source", "Issues"}
    # the sdist keeps the repository's layout: migrations/ at the top, beside config.yaml
    with tarfile.open(sdist) as archive:
        top = f"agent_receipts-{__version__}"
        members = set(archive.getnames())
    assert {f"{top}/migrations/versions/{m}" for m in MIGRATIONS} | {f"{top}/config.yaml", f"{top}/LICENSE"} <= members


def test_the_installed_package_is_the_wheel_not_a_checkout(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    python = installed / "bin" / "python"
    probe = json.loads(run([str(python), "-c", PROBE], cwd=empty, env=clean_env(tmp_path, installed)).stdout)
    package_dir = Path(probe["package"]).parent
    assert package_dir.is_relative_to(installed), probe["package"]
    assert Path(probe["distribution"]).is_relative_to(installed)
    assert Path(probe["migrations"]) == package_dir / "migrations"
    assert Path(probe["example_config"]) == package_dir / "config.example.yaml"
    assert not [p for p in probe["path"] if p and Path(p).resolve().is_relative_to(REPO)]
    assert not [f for f in probe["meta_path"] if "editable" in f.lower()]  # the project venv's finder did not run
    assert probe["addon_classes"][0] == "Receipts" and Path(probe["addon_module"]).is_relative_to(installed)


def test_from_an_empty_directory_a_write_gets_its_receipt(installed, tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = clean_env(home, installed)

    def receipts(*args: str) -> str:
        return run([str(installed / "bin" / "receipts"), *args], cwd=work, env=env).stdout

    assert receipts("--version").strip() == f"receipts {__version__}"
    assert "receipts db upgrade --config config.yaml" in receipts("init", "--config", "config.yaml")
    assert (work / "config.yaml").read_text() == (REPO / "config.yaml").read_text()
    assert "database at migration head" in receipts("db", "upgrade", "--config", "config.yaml")

    upstream = start_upstream()
    port = free_port()
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        proxy = subprocess.Popen(
            [str(installed / "bin" / "receipts"), "proxy", "--config", "config.yaml", "--listen-port", str(port),
             "--confdir", str(home / "confdir")],
            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not listens(proxy.pid, port):
            assert proxy.poll() is None, f"receipts proxy exited {proxy.returncode}: {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"nothing listens on {port}: {log_path.read_text()[-3000:]}"
            time.sleep(0.1)
        path = f"/installed/{tag()}"
        with proxy_client(f"http://127.0.0.1:{port}") as agent:
            answer = agent.post(upstream.base + path, json={"title": "from the wheel"})
        assert answer.status_code == 201, answer.text
        operation_id = answer.headers["X-Receipt-Id"]
        receipt = _receipt_once_settled(receipts, operation_id)
    finally:
        stop_process(proxy)
        upstream.stop()
    assert (receipt["path"], receipt["state"], receipt["status_code"]) == (path, "succeeded", 201)
    assert upstream.count("POST", path) == 1
    assert (work / "receipts.db").exists()  # the default config's SQLite file, beside it


def _receipt_once_settled(receipts, operation_id: str) -> dict:
    """The receipt as `receipts ls --json` shows it, once its verdict is committed (or as it is after the wait)."""
    deadline = time.monotonic() + VERDICT_WAIT
    while True:
        [receipt] = [r for r in json.loads(receipts("ls", "--json", "--config", "config.yaml"))
                     if r["operation_id"] == operation_id]
        if receipt["state"] != "submitted" or time.monotonic() > deadline:
            return receipt
        time.sleep(0.2)
