"""Helpers for the end-to-end tests: module-wide databases, upstreams on chosen ports or over TLS,
httpx clients through the proxy, reading receipts back, and stopping processes started by a test."""

import datetime
import ipaddress
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from alembic import command

from proxy_addon.db import alembic_config, make_engine
from proxy_addon.rules.records import ReceiptRecord, TransitionRecord
from proxy_addon.store import ReceiptStore
from support.pg import fresh_database, libpq_url
from support.upstream import Received, Upstream

PROBLEM_JSON = "application/problem+json"
SHA256_PREFIX = "sha256:"


def tag() -> str:
    return uuid.uuid4().hex[:12]


def migrate(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


def pg_database(server_url: str):
    """A fresh database on the PostgreSQL server for a whole module, dropped afterwards."""
    return fresh_database(server_url, prefix="receipts_e2e")


def pg_rows_as_text(url: str) -> str:
    """Every row of every receipts table, as PostgreSQL renders it to text; bytea columns (shown as hex
    there) also in escape form, so that text inside stored bodies can be searched."""
    with psycopg.connect(libpq_url(url)) as conn:
        chunks = []
        for table in ("receipts", "receipt_transitions", "proxy_instances"):
            chunks += [row[0] for row in conn.execute(f"SELECT t::text FROM {table} t")]
        for row in conn.execute(
            "SELECT coalesce(encode(request_body, 'escape'), ''), coalesce(encode(response_body, 'escape'), '') FROM receipts"
        ):
            chunks += list(row)
    return "\n".join(chunks)


@contextmanager
def open_store(url: str) -> Iterator[ReceiptStore]:
    engine = make_engine(url)
    try:
        yield ReceiptStore(engine)
    finally:
        engine.dispose()


# How long a read waits for a verdict the proxy is still committing: it answers first and commits the verdict
# while the answer travels (request/handler.py), so right after an answer its receipt may still be `submitted`.
VERDICT_WAIT = 15.0


def settled(store: ReceiptStore, operation_id: str, timeout: float = VERDICT_WAIT) -> ReceiptRecord:
    """The receipt once it has moved on from `submitted` (its verdict committed), or as it is after `timeout`."""
    return once_moved_on(lambda: [store.receipts.get(operation_id)], timeout)[0]


def receipts_for(store: ReceiptStore, path: str, timeout: float = VERDICT_WAIT) -> list[ReceiptRecord]:
    """The receipts of requests to `path`, once none is `submitted` any more (or as they are after `timeout`)."""
    return once_moved_on(lambda: [r for r in store.receipts.list(limit=None) if r.path == path], timeout)


def once_moved_on(read: Callable[[], list[ReceiptRecord]], timeout: float = VERDICT_WAIT) -> list[ReceiptRecord]:
    """What `read` returns once none of it is `submitted` any more (or after `timeout`)."""
    return read_until(read, lambda receipts: all(r.state != "submitted" for r in receipts), timeout)


def read_until[T](read: Callable[[], T], done: Callable[[T], bool], timeout: float, interval: float = 0.01) -> T:
    """`read()` again until `done` says so of what it read, bounded in time; the last read."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(interval)
        value = read()
    return value


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    """Poll `condition` until it returns something truthy; bounded in time. Returns the last value."""
    deadline = time.monotonic() + timeout
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = condition()
    return value


def proxy_client(proxy_url: str, **kw) -> httpx.Client:
    kw.setdefault("timeout", 30.0)
    return httpx.Client(proxy=proxy_url, trust_env=False, **kw)


def received(up: Upstream, path: str) -> list[Received]:
    with up.lock:
        return [r for r in up.received if r.path.split("?")[0] == path]


def self_signed_server_context(directory: Path) -> ssl.SSLContext:
    """A TLS server context with a fresh self-signed certificate for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "upstream-cert.pem", directory / "upstream-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited in time; only ever the process this test started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def failing_receipt_writes(url: str, event: str, when: str | None = None, table: str = "receipts") -> Iterator[None]:
    """While inside, the database itself refuses `event` (INSERT or UPDATE) on `table` rows matching
    `when` (SQL on NEW), through a trigger: a journal that cannot be written, on SQLite or PostgreSQL."""
    engine = make_engine(url)
    name = "receipts_test_refuse_write"
    condition = f"WHEN ({when})" if when else ""
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} {condition} "
                    "BEGIN SELECT RAISE(ABORT, 'simulated journal failure'); END"
                )
            else:
                conn.exec_driver_sql(
                    f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'simulated journal failure'; END $$"
                )
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW {condition} EXECUTE FUNCTION {name}()"
                )
        yield
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}" + ("" if engine.dialect.name == "sqlite" else f" ON {table}"))
            if engine.dialect.name != "sqlite":
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {name}()")
        engine.dispose()


def settled_history(store: ReceiptStore, operation_id: str) -> list[TransitionRecord]:
    """The receipt's history once it has moved on from `submitted` (see `settled`)."""
    settled(store, operation_id)
    return store.receipts.history(operation_id)
