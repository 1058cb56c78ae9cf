"""The journal cannot be written while agents send: the proxy fails closed, then journals again.

- PostgreSQL: a private server of this test's own (initdb into a temporary directory owned by the postgres
  user, started with pg_ctl on a free loopback port, through `runuser -u postgres --` because the tests run
  as root; skipped, with the reason, where that is impossible) is stopped (`pg_ctl stop -m fast`) in the
  middle of the load, then started again.
- SQLite: the database file, its write-ahead log and their directory are made immutable with `chattr +i`,
  which root cannot write through either (a plain chmod would not stop root); where chattr is impossible a
  trigger refusing new receipts stands in (see fault_harness.unwritable_sqlite). Then the flag is removed.
While the journal is down every write is answered 503 problem+json `journal-unavailable` with the store's
reason, and none of them reaches the upstream; once it is back writes are journaled and forwarded again,
the receipts whose verdict could not be written are settled by the live proxy, and the invariants hold.
With `proxy.fail_open: true` the writes are forwarded instead, and each one is logged loudly.
"""

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from support.e2e import migrate, stop_process, wait_for
from support.proxy import start_proxy_process
from support.recording_upstream import SUCCESS, RecordingUpstream

from faults.fault_harness import (
    MIXED,
    Agents,
    Intent,
    PrivatePostgres,
    Sent,
    answered_ids,
    fault_config,
    intent_pool,
    journaled_since,
    private_postgres_problem,
    proxy_client,
    send,
    unsettled,
)
from faults.invariants import check_scenario

FAIL_OPEN_EVENT = "journal_unavailable_forwarding_without_receipt"


def outage_under_load(
    scenario: str,
    database: str,
    outage: Callable[[], AbstractContextManager[object]],
    upstream: RecordingUpstream,
    tmp_path: Path,
) -> None:
    """Agents send mixed writes; the journal goes down, then comes back; check what they were answered."""
    config = fault_config(tmp_path, upstream)
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "proxy.log")
    proxy = f"http://127.0.0.1:{port}"
    intents = intent_pool(40, {**MIXED, "slow": 0.1}, seed=11, slow_seconds=0.3)
    agents = Agents([proxy], upstream.items_url, intents, threads=4, per_thread=150, seconds=40, seed=3)
    try:
        agents.start()
        assert wait_for(lambda: upstream.count() >= 8, 15, 0.02), "no load before the outage"
        with outage():
            down_at = time.monotonic()

            def refused() -> list[Sent]:
                return [s for s in agents.results() if s.started > down_at and s.problem == "journal-unavailable"]

            assert wait_for(lambda: len(refused()) >= 8, 20, 0.05), f"no journal-unavailable answers: {agents.results()[-5:]}"
            received_while_down = [r for r in upstream.received() if r.at > down_at + 0.5]
        up_at = time.monotonic()
        again = wait_for(lambda: journaled_since(agents, up_at), 20, 0.05)
        assert again, f"the proxy did not journal again: {agents.results()[-5:]}"
        sent = agents.stop()
        assert wait_for(lambda: not unsettled(database), 15, 0.1), unsettled(database)
    finally:
        agents.stop()
        stop_process(proc)

    during = [s for s in sent if s.problem == "journal-unavailable"]
    for s in during:
        assert s.status == 503 and s.receipt_id is None, s
        assert "could not be written (cannot write the journal: " in (s.detail or ""), s.detail
        assert "not forwarded" in (s.detail or "")
    forwarded = {r.send_id for r in upstream.received()}
    assert not forwarded & {s.send_id for s in during}, "a write the journal refused reached the upstream"
    # what reached the upstream while the journal was down had been journaled before it went down
    assert all(r.operation_id for r in received_while_down)
    check_scenario(scenario, database, upstream.received(), len(sent), answered_ids(sent))


# -- PostgreSQL ---------------------------------------------------------------------------------------------


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    problem = private_postgres_problem()
    if problem:
        pytest.skip(f"no private PostgreSQL server: {problem}")
    pg = PrivatePostgres()
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.destroy()


def test_postgres_stopped_mid_run_fails_closed_and_recovers(private_postgres, upstream, tmp_path):
    migrate(private_postgres.url)

    @contextmanager
    def stopped() -> Iterator[None]:
        private_postgres.stop("fast")
        try:
            yield
        finally:
            private_postgres.start()

    outage_under_load("journal down: PostgreSQL stopped", private_postgres.url, stopped, upstream, tmp_path)


# -- SQLite -------------------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_file(tmp_path) -> Path:
    (tmp_path / "db").mkdir()
    path = tmp_path / "db" / "receipts.db"
    migrate(f"sqlite:///{path}")
    return path


def test_sqlite_file_unwritable_fails_closed_and_recovers(sqlite_file, upstream, tmp_path):
    from faults.fault_harness import unwritable_sqlite

    how: list[str] = []

    @contextmanager
    def unwritable() -> Iterator[None]:
        with unwritable_sqlite(sqlite_file) as method:
            how.append(method)
            yield

    outage_under_load("journal down: SQLite read-only", f"sqlite:///{sqlite_file}", unwritable, upstream, tmp_path)
    print(f"SQLite made unwritable with {how[0]}")


def test_fail_open_forwards_and_logs_every_unjournaled_write_loudly(sqlite_file, upstream, tmp_path):
    from faults.fault_harness import unwritable_sqlite

    database = f"sqlite:///{sqlite_file}"
    config = fault_config(tmp_path, upstream, proxy={"fail_open": True})
    log_path = tmp_path / "proxy.log"
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", log_path)
    proxy = f"http://127.0.0.1:{port}"
    sent: list[Sent] = []
    try:
        with proxy_client(proxy) as client:
            sent.append(send(client, proxy, upstream.items_url, Intent("open-before", SUCCESS)))
            with unwritable_sqlite(sqlite_file):
                open_sends = [send(client, proxy, upstream.items_url, Intent(f"open-{i}", SUCCESS)) for i in range(5)]
            sent += open_sends
            after = send(client, proxy, upstream.items_url, Intent("open-after", SUCCESS))
            sent.append(after)
    finally:
        stop_process(proc)

    assert sent[0].status == 201 and sent[0].receipt_id
    for s in open_sends:  # forwarded, the upstream's own answer, and no receipt claimed
        assert (s.status, s.receipt_id, s.problem) == (201, None, None), s
    assert after.status == 201 and after.receipt_id, "the proxy did not journal again once the file was writable"
    received = {r.send_id: r for r in upstream.received()}
    assert all(s.send_id in received and received[s.send_id].operation_id is None for s in open_sends)

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    loud = [line for line in lines if line.get("event") == FAIL_OPEN_EVENT]
    assert len(loud) == len(open_sends), f"{len(loud)} fail-open log lines for {len(open_sends)} unjournaled writes"
    assert all(line["level"] == "error" and line["fail_open"] is True and line["error"] for line in loud)
    check_scenario(
        "fail open: SQLite read-only", database, upstream.received(), len(sent), answered_ids(sent),
        unjournaled_sends=[s.send_id for s in open_sends],
    )
