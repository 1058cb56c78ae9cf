"""Engines and schema checks: where the database is, how to connect durably, whether it is migrated.

SQLite is opened in WAL mode with synchronous=FULL (a commit is on disk when it returns) and every write
transaction starts with BEGIN IMMEDIATE, so concurrent writers queue on the lock instead of failing with
a deadlock when a read would later upgrade to a write.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from proxy_addon.exceptions import DatabaseURLError, JournalUnavailableError, SchemaNotMigratedError
from proxy_addon.resources import MIGRATIONS_DIR

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

DATABASE_URL_ENV = "RECEIPTS_DATABASE_URL"
DEFAULT_DATABASE_URL = "sqlite:///receipts.db"
SQLITE_BUSY_TIMEOUT_MS = 10_000
SQLITE_READONLY = 8  # primary result code; the extended SQLITE_READONLY_* codes share its low byte
# A transaction of ours never waits on the client between statements for more than a few milliseconds.
# One that does belongs to a process that is frozen (SIGSTOP, a paused VM) or lost: PostgreSQL ends its
# session, so that the row locks it holds do not stall the replica that recovers the frozen instance's receipts.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000
# The proxy's own waits on the database (its journal writer's, its store's) are this share of
# proxy.journal_timeout (10 s of the default 15 s): a lock held elsewhere (a migration, `receipts prune`, an
# operator's LOCK TABLE) fails the write with time left to answer it 503 before the journal_timeout passes.
DATABASE_WAIT_SHARE = 2 / 3


def milliseconds(seconds: float) -> int:
    """A wait in whole milliseconds, as the databases take it: rounded down (never past its end), 1 at least."""
    return max(1, int(seconds * 1000))


def database_wait(journal_timeout: float) -> float:
    """The longest the proxy's statements wait on a lock (and, in its journal writer, run) for this timeout."""
    return journal_timeout * DATABASE_WAIT_SHARE


def resolve_database_url(configured: str | None) -> str:
    """The URL the contract names: `RECEIPTS_DATABASE_URL`, else `database.url` in the config, else the default."""
    return os.environ.get(DATABASE_URL_ENV) or configured or DEFAULT_DATABASE_URL


def anchor_sqlite_url(raw: str, base_dir: Path) -> str:
    """A SQLite URL with a relative file path made absolute against `base_dir` (a config file's directory);
    any other URL, or one that does not parse (parse_database_url reports it later), unchanged."""
    try:
        url = make_url(raw)
    except ArgumentError:
        return raw
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return raw
    if Path(database).is_absolute():
        return raw
    return url.set(database=str(base_dir / database)).render_as_string(hide_password=False)


def parse_database_url(raw: str) -> URL:
    """Validate a URL and pick the psycopg 3 driver for a bare `postgresql://`."""
    try:
        url = make_url(raw)
    except ArgumentError as e:
        raise DatabaseURLError(f"database url {_masked(raw)!r} is not a valid URL") from e
    backend = url.get_backend_name()
    if backend == "postgresql":
        if url.get_driver_name() in ("psycopg2", "default") or "+" not in url.drivername:
            url = url.set(drivername="postgresql+psycopg")
        if not url.database:
            raise DatabaseURLError(f"database url {_masked(raw)!r} names no database")
    elif backend == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise DatabaseURLError("database url must name a SQLite file (an in-memory database keeps no receipt)")
    else:
        raise DatabaseURLError(f"database url {_masked(raw)!r}: only sqlite and postgresql are supported")
    return url


def _masked(raw: str) -> str:
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except ArgumentError:
        return raw.split("@")[-1]


def make_engine(raw_url: str, **kwargs: Any) -> Engine:
    """An engine set up durably (module docstring). `lock_wait` (seconds): the longest a statement waits for a
    lock (SQLite's busy timeout, 10 s when not given; PostgreSQL's lock_timeout, none when not given);
    `statement_wait`: PostgreSQL's statement_timeout (SQLite's statements run in-process, and end with it)."""
    url = parse_database_url(raw_url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, **kwargs)
    return _postgres_engine(url, **kwargs)


def _postgres_engine(url: URL, lock_wait: float | None = None, statement_wait: float | None = None, **kwargs: Any) -> Engine:
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("connect_timeout", 5)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    wanted: dict[str, int | str | None] = {
        "idle_in_transaction_session_timeout": PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
        "lock_timeout": None if lock_wait is None else milliseconds(lock_wait),
        "statement_timeout": None if statement_wait is None else milliseconds(statement_wait),
        # The journal's statements are short index lookups; a cost estimate past jit_above_cost (a subquery the
        # planner prices over a large table, even when it never runs) would compile each plan on every
        # execution: 35-40 ms per write at a million receipts, against 0.2 ms without.
        "jit": "off",
    }
    options = str(url.query.get("options", ""))
    settings = {name: value for name, value in wanted.items() if value is not None and name not in options}  # the URL's own value wins

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # a SET on each new connection, not a startup `options` parameter: PgBouncer refuses unknown ones
        with dbapi_conn.cursor() as cur:
            for name, value in settings.items():
                cur.execute(f"SET {name} = {value}")
        dbapi_conn.commit()

    return engine


class _SQLiteCompiler(SQLiteCompiler):
    """SQLite's compiler, with a table's hint (`Select.with_hint(table, "INDEXED BY ix_...", "sqlite")`) written
    after its name, which SQLAlchemy's leaves out: where SQLite's planner, without statistics, would pick an
    index that sorts the whole table (store/retention.py)."""

    def get_from_hint_text(self, table: Any, text: str | None) -> str | None:
        return text


def _sqlite_engine(url: URL, lock_wait: float | None = None, statement_wait: float | None = None, **kwargs: Any) -> Engine:
    busy_ms = SQLITE_BUSY_TIMEOUT_MS if lock_wait is None else milliseconds(lock_wait)
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("check_same_thread", False)
    connect_args.setdefault("timeout", busy_ms / 1000)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    engine.dialect.statement_compiler = _SQLiteCompiler

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let the begin event below issue BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        # A connection opened while the file could not be written (read-only mount, immutable file, full
        # disk) stays read-only after the file is writable again. Discard it like a dropped connection, so
        # that the pool opens a fresh one instead of failing every later write on it.
        code = getattr(context.original_exception, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == SQLITE_READONLY:
            context.is_disconnect = True

    return engine


# Alembic is imported where it is used: it is half a second of start-up that the journal writer process,
# which only writes receipts, should not pay (it imports this module for make_engine).


def alembic_config(raw_url: str | None = None) -> "AlembicConfig":
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if raw_url is not None:
        cfg.set_main_option("sqlalchemy.url", parse_database_url(raw_url).render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


# The head of migrations/, which every command checks the database against at its start: written here, kept
# equal to Alembic's head by tests/unit/test_migrations.py, because asking Alembic imports it and every migration
# script (0.4 s of each command's start on an idle machine, 1.2 s on a busy one: most of `receipts stats`).
SCHEMA_HEAD = "0010"


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    return heads[0]


def check_schema(engine: Engine) -> None:
    """Refuse to run on a database that is not at the migration head."""
    try:
        with engine.connect() as conn:
            current = _revision(conn)
    except SQLAlchemyError as e:
        raise JournalUnavailableError(f"cannot open the database: {_one_line(e)}") from e
    head = SCHEMA_HEAD
    if current != head:
        raise SchemaNotMigratedError(
            f"database is at migration {current or 'none'}, this code needs {head}: run `receipts db upgrade`"
        )


def _revision(conn: Connection) -> str | None:
    """The database's migration (Alembic's `alembic_version` row), None before the first."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _one_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e)
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__
