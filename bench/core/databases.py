"""Fresh, migrated databases for the receipts targets, and the checks of what the proxy wrote into them."""

import contextlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from bench.core.processes import REPO, BenchError, bench_env, receipts_cmd

VERDICT_WAIT = 30.0  # seconds for the last verdicts of a load to be committed


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pg_url_for(admin_url: str, database: str) -> str:
    url = make_url(admin_url).set(drivername="postgresql+psycopg", database=database)
    return url.render_as_string(hide_password=False)


def pg_unavailable(admin_url: str) -> str | None:
    """Why PostgreSQL cannot be reached at `admin_url`, or None if it can."""
    try:
        psycopg.connect(libpq_url(admin_url), connect_timeout=3).close()
        return None
    except psycopg.Error as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def pg_server_version(admin_url: str) -> str:
    with psycopg.connect(libpq_url(admin_url), connect_timeout=3) as conn:
        return conn.execute("SHOW server_version").fetchall()[0][0]


def pg_drop(admin_url: str, database: str) -> None:
    with psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=5) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (database,)
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')


def pg_fresh(admin_url: str, database: str) -> str:
    pg_drop(admin_url, database)
    with psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    return pg_url_for(admin_url, database)


def migrate(config: Path, database_url: str) -> None:
    migrated = subprocess.run(
        [*receipts_cmd(), "db", "upgrade", "--config", str(config)],
        capture_output=True,
        timeout=180,
        cwd=REPO,
        env=bench_env(database_url),
        check=False,
    )
    if migrated.returncode != 0:
        output = (migrated.stderr or migrated.stdout).decode(errors="replace")
        raise BenchError(f"receipts db upgrade failed: {output[-600:]}")


@dataclass(frozen=True)
class Db:
    """Read-only checks, with the drivers directly (independent of proxy_addon internals)."""

    kind: str  # sqlite | postgres
    url: str
    sqlite_path: Path | None = None

    @classmethod
    def fresh_sqlite(cls, path: Path) -> "Db":
        for old in path.parent.glob(path.name + "*"):
            old.unlink()
        return cls("sqlite", f"sqlite:///{path}", path)

    @classmethod
    def fresh_postgres(cls, admin_url: str, database: str) -> "Db":
        return cls("postgres", pg_fresh(admin_url, database))

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        if self.kind == "sqlite":
            sqlite_conn = sqlite3.connect(str(self.sqlite_path), timeout=30)
            try:
                yield sqlite_conn
            finally:
                sqlite_conn.close()
        else:
            with psycopg.connect(libpq_url(self.url), connect_timeout=5) as pg_conn:
                yield pg_conn

    def analyze(self) -> None:
        """Statistics for the receipts tables (PostgreSQL), as autovacuum would gather them."""
        with self.connect() as conn:
            for table in ("receipts", "receipt_transitions"):
                conn.execute(f"ANALYZE {table}")
            conn.commit()

    @property
    def name(self) -> str:
        """The PostgreSQL database's name, or the SQLite file's."""
        return make_url(self.url).database or ""

    def with_placeholders(self, sql: str) -> str:
        return sql if self.kind == "sqlite" else sql.replace("?", "%s")

    def states_under(self, prefix: str) -> tuple[dict[str, int], int]:
        """Receipt counts per state, and the transition count, for paths starting with `prefix/`."""
        like = prefix + "/%"
        states_sql = "SELECT state, count(*) FROM receipts WHERE path LIKE ? GROUP BY state"
        transitions_sql = (
            "SELECT count(*) FROM receipt_transitions t JOIN receipts r ON r.operation_id = t.operation_id WHERE r.path LIKE ?"
        )
        with self.connect() as conn:
            states = conn.execute(self.with_placeholders(states_sql), (like,)).fetchall()
            transitions = conn.execute(self.with_placeholders(transitions_sql), (like,)).fetchone()[0]
        return {str(k): int(v) for k, v in states}, int(transitions)

    def reused_connection_unknowns_under(self, prefix: str) -> int:
        """Receipts under `prefix/` that the proxy made outcome_unknown on a reused upstream connection (what
        `receipts_reused_connection_unknowns_total` counts): their verdict's detail says `connection: reused`."""
        sql = (
            "SELECT t.detail FROM receipt_transitions t JOIN receipts r ON r.operation_id = t.operation_id "
            "WHERE r.path LIKE ? AND t.from_state = 'submitted' AND t.to_state = 'outcome_unknown'"
        )
        with self.connect() as conn:
            details = [row[0] for row in conn.execute(self.with_placeholders(sql), (prefix + "/%",)).fetchall()]
        return sum(1 for d in details if (json.loads(d) if isinstance(d, str) else d or {}).get("connection") == "reused")

    def states_not_seeded(self) -> dict[str, int]:
        sql = "SELECT state, count(*) FROM receipts WHERE path NOT LIKE '/seed/%' GROUP BY state"
        with self.connect() as conn:
            rows = conn.execute(sql).fetchall()
        return {str(k): int(v) for k, v in rows}

    def size_bytes(self) -> int:
        if self.sqlite_path is not None:
            files = self.sqlite_path.parent.glob(self.sqlite_path.name + "*")
            return sum(p.stat().st_size for p in files)
        with self.connect() as conn:
            return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def settled[T](read: Callable[[], T], states_of: Callable[[T], dict[str, int]], timeout: float = VERDICT_WAIT) -> T:
    """`read()` once no receipt in it is `submitted`, or as it is after `timeout`: the proxy answers before it
    has committed the verdict (proxy_addon/request/handler.py), so the last verdicts of a load land just after it."""
    deadline = time.monotonic() + timeout
    value = read()
    while states_of(value).get("submitted") and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value
