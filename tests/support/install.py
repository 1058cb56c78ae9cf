"""The package as a user gets it: the sdist and wheel built as `python -m build` builds them, and the wheel installed
into a fresh virtualenv outside the checkout (tests/e2e/test_wheel_install.py; the Dockerfile's check in
tests/unit/test_compose.py shares BUILD_INPUTS).

The fresh venv gets the wheel from pip and its dependencies from the project venv, without the index: each
distribution the wheel needs at run time (its requirements and theirs, extras followed, markers evaluated), found
installed here, has its top-level files symlinked into the fresh venv's site-packages, dist-info included, so that
pip and importlib.metadata see it installed. Nothing else is linked: not the test tools, not the project venv's
editable install of a checkout (a .pth file that only the project venv's own site directory runs), so what runs is
the wheel and what it declares. `pip check` then proves every declared requirement satisfied there.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = "agent-receipts"
# What setup.py and pyproject.toml read to build the sdist: the Dockerfile's build stage copies the same.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "config.yaml", "proxy_addon", "migrations")
# how a build frontend calls a PEP 517 hook: the backend module, the hook, its output directory
_HOOK = "import importlib, sys; print(getattr(importlib.import_module(sys.argv[1]), sys.argv[2])(sys.argv[3]))"
_TIMEOUT = 300


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """A command that must succeed: its output in the failure when it does not."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, **kw)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def make_venv(directory: Path) -> Path:
    """An empty venv (no pip of its own: the project venv's pip installs into it); returns its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(directory)])
    return directory / "bin" / "python"


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "pip", "--python", str(python), *args])


def site_packages(python: Path) -> Path:
    return Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())


# -- building -----------------------------------------------------------------------------------------------


def copy_build_inputs(target: Path) -> Path:
    """The files a build reads, copied out of the checkout: a build in it would leave build/ there, and setuptools
    puts what build/ still holds (modules deleted since, say) into every later wheel."""
    target.mkdir(parents=True)
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / name)
    return target


def build_system() -> tuple[list[str], str]:
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    return table["requires"], table["build-backend"]


def build_dists(source: Path, out: Path, build_venv: Path) -> tuple[Path, Path]:
    """The sdist from `source`, then the wheel from the unpacked sdist, through the backend's hooks in a venv
    holding what pyproject.toml's build-system requires: what `python -m build` does, so the wheel can only hold
    what the sdist carried."""
    requires, backend = build_system()
    python = make_venv(build_venv)
    pip(python, "install", "--quiet", *requires)
    sdist = out / run([str(python), "-c", _HOOK, backend, "build_sdist", str(out)], cwd=source).stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(out / "unpacked", filter="data")
    [unpacked] = (out / "unpacked").iterdir()
    wheel = out / run([str(python), "-c", _HOOK, backend, "build_wheel", str(out)], cwd=unpacked).stdout.split()[-1]
    return sdist, wheel


# -- installing ---------------------------------------------------------------------------------------------


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A fresh venv with the wheel installed by pip and its dependencies linked from the project venv; returns
    its python once `pip check` finds every requirement satisfied."""
    python = make_venv(venv)
    pip(python, "install", "--quiet", "--no-index", "--no-deps", str(wheel))
    site = site_packages(python)
    [ours] = metadata.distributions(name=DISTRIBUTION, path=[str(site)])  # the wheel's requirements, not the checkout's
    for dist in runtime_dependencies(ours):
        link_distribution(dist, site)
    pip(python, "check")
    return python


def runtime_dependencies(root: metadata.Distribution) -> list[metadata.Distribution]:
    """The distributions `root` needs at run time, as installed here: its requirements, theirs, and so on."""
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = _requirements(root, frozenset())
    while pending:
        requirement = pending.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(requirement.name)  # PackageNotFoundError: the project venv lacks it
        found[key[0]] = dist
        pending += _requirements(dist, key[1])
    return list(found.values())


def _requirements(dist: metadata.Distribution, extras: frozenset[str]) -> list[Requirement]:
    """What `dist` requires here (this interpreter, this platform), with these extras of it asked for."""
    wanted = []
    for text in dist.requires or ():
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            wanted.append(requirement)
    return wanted


def link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Its top-level files and folders (its dist-info too) symlinked into `site`, where pip would have put them.
    A folder that several distributions share (a namespace package: opentelemetry/) is linked once, whole."""
    root = Path(str(dist.locate_file("")))
    assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD: cannot tell its files"
    tops = {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}
    for top in sorted(tops):
        if not os.path.lexists(site / top):
            (site / top).symlink_to(root / top)
