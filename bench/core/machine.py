"""Where and on what the numbers were measured: the machine, the versions, the git commit."""

import argparse
import contextlib
import os
import platform
import sqlite3
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench.core.databases import pg_server_version, pg_unavailable
from bench.core.processes import REPO

VERSIONED_PACKAGES = ("mitmproxy", "httpx", "sqlalchemy", "psycopg", "structlog")


def machine(args: argparse.Namespace, run_id: str, seconds: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(seconds, 1),
        "cpu": proc_file_value("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(int((proc_file_value("/proc/meminfo", "MemTotal") or "0 kB").split()[0]) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(args),
        "git": git_state(),
        "durability": "SQLite WAL + synchronous=FULL; PostgreSQL synchronous_commit default (on)",
    }


def proc_file_value(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.partition(":")[2].strip()
    return None


def versions(args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in VERSIONED_PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    if "postgres" in args.targets and not pg_unavailable(args.pg_admin_url):
        with contextlib.suppress(Exception):
            found["postgresql"] = pg_server_version(args.pg_admin_url)
    return found


def git_state() -> dict[str, Any]:
    """The commit, and whether proxy_addon/ differs from it."""
    state: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        state["commit"] = git("rev-parse", "--short", "HEAD")
        state["dirty"] = bool(git("status", "--porcelain", "--", "proxy_addon"))
    return state


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, timeout=10, check=False)
    return done.stdout.strip()
