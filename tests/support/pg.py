"""Throw-away PostgreSQL databases on the test server: one helper for every test module."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as psycopg's own connect() takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def fresh_database(server_url: str, prefix: str = "receipts_t", template: str | None = None) -> Iterator[str]:
    """A new database on the server at `server_url`, empty or a copy of the database named `template` (which
    nobody may be connected to); its connections are ended and it is dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(libpq_url(server_url), autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()
