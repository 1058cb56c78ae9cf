"""Shared fixtures: a migrated SQLite file and a migrated, throw-away PostgreSQL database per test.

PostgreSQL is the real server named by RECEIPTS_TEST_POSTGRES_URL (default: the local one). Locally a test
that needs it is skipped when it is down; under CI=true it fails instead, because skipping would hide it.
"""

import os
from collections.abc import Iterator

import psycopg
import pytest
import structlog
from alembic import command
from support.pg import fresh_database, libpq_url

from proxy_addon.db import alembic_config, make_engine
from proxy_addon.store import ReceiptStore

PG_URL = os.environ.get("RECEIPTS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _pg_available() -> str | None:
    try:
        psycopg.connect(libpq_url(PG_URL), connect_timeout=3).close()
        return None
    except psycopg.Error as e:
        return str(e).strip().splitlines()[0]


@pytest.fixture(autouse=True)
def _structlog_config_restored() -> Iterator[None]:
    """A test that configures logging (an addon under taddons at `level: error`, say) leaves structlog as it was:
    otherwise a later test in the same worker would not see the log lines it captures."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def pg_server() -> str:
    problem = _pg_available()
    if problem:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_URL} is required under CI=true: {problem}", pytrace=False)
        pytest.skip(f"PostgreSQL not reachable: {problem}")
    return PG_URL


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database on the PostgreSQL server, dropped afterwards."""
    with fresh_database(pg_server) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'receipts.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Each test that takes this runs twice: on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


def migrate(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_db_url(request, tmp_path_factory) -> Iterator[str]:
    """One migrated database per backend for a whole module, for modules that share one proxy or world
    (creating one per test costs more than the test)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('module_db') / 'receipts.db'}"
        migrate(url)
        yield url
        return
    with fresh_database(request.getfixturevalue("pg_server"), prefix="receipts_mod") as url:
        migrate(url)
        yield url


@pytest.fixture
def migrated_url(db_url: str) -> str:
    migrate(db_url)
    return db_url


@pytest.fixture
def store(migrated_url: str) -> Iterator[ReceiptStore]:
    engine = make_engine(migrated_url)
    try:
        yield ReceiptStore(engine)
    finally:
        engine.dispose()
