"""A journal that stops answering, on SQLite and on PostgreSQL: no write waits longer than
`proxy.journal_timeout` (2 s here), nothing refused is ever forwarded, no receipt stays open, and the next
writes are journaled.

- The journal writer SIGSTOPped under load (six agents, mixed success, slow, reset and reject): every write
  it held is answered 503 `journal-unavailable` within the bound; the proxy kills it and starts a new one
  with the next write. The old writer is then resumed (SIGCONT): it is gone, and nothing it held reaches the
  upstream, then or later.
- A lock held on the receipts table by another session (PostgreSQL: LOCK TABLE; SQLite: another
  connection's write transaction) for longer than the bound: the writes are answered 503 within it, none is
  forwarded, and writes are journaled again once the lock is released.

Event-driven: the tests wait on the proxy's metrics, on answers and on the database, never for a set time.
"""

import contextlib
import json
import os
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import psycopg
import yaml
from support.e2e import stop_process, wait_for
from support.proxy import process_gone, start_proxy_process, writer_pid
from support.server import free_port

from faults.fault_harness import (
    MIXED,
    Agents,
    Intent,
    answered_ids,
    fault_config,
    intent_pool,
    journaled_since,
    proxy_client,
    send,
    unsettled,
)
from faults.invariants import check_scenario

JOURNAL_TIMEOUT = 2.0
SLACK = 5.0  # an answer within JOURNAL_TIMEOUT + SLACK counts as within the bound (a loaded machine)
AGENTS = 6
# what a write the stopped writer held is answered: its own time ran out, or the writer was killed for another's
HELD = r"did not answer within proxy.journal_timeout|journal writer stopped \(killed: it held a write longer than"


def metric(admin: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{admin}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def log_events(path: Path, event: str) -> list[dict]:
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            document = json.loads(line)
            if document.get("event") == event:
                events.append(document)
    return events


def start(database: str, upstream, tmp_path: Path):
    config = fault_config(tmp_path, upstream, proxy={"journal_timeout": f"{JOURNAL_TIMEOUT:g}s"})
    document = yaml.safe_load(config.read_text())
    admin_port = free_port()
    document["admin"] = {"enabled": True, "listen_host": "127.0.0.1", "listen_port": admin_port}
    config.write_text(yaml.safe_dump(document))
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "proxy.log")
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"


def journaled_again(proxy: str, url: str, prefix: str, seconds: float = 30) -> float:
    """Send new intents until one is journaled and answered by the upstream (the first after a restart may
    wait for the new writer's start; one journaled before the proxy's first heartbeat after a stall as long
    as the lock is not sent, rightly: a replica may have taken the proxy for dead meanwhile, handler.py);
    returns how long that took."""
    began = time.monotonic()
    with proxy_client(proxy) as client:
        for i in range(200):
            s = send(client, proxy, url, Intent(f"{prefix}-{i}", "success"))
            if s.receipt_id and s.status == 201:
                return time.monotonic() - began
            assert (s.status, s.problem) in ((503, "journal-unavailable"), (502, "not-sent")), s
            assert s.problem == "journal-unavailable" or "stalled" in (s.detail or ""), s
            assert time.monotonic() - began < seconds, f"not journaled again within {seconds}s: {s}"
    raise AssertionError("not journaled again")


def test_a_stopped_journal_writer_is_killed_within_the_bound_and_what_it_held_is_never_forwarded(database, upstream, tmp_path):
    backend = database.split(":")[0].split("+")[0]
    proc, proxy, admin = start(database, upstream, tmp_path)
    intents = intent_pool(30, {**MIXED, "slow": 0.1}, seed=7, slow_seconds=0.3)
    agents = Agents([proxy], upstream.items_url, intents, threads=AGENTS, per_thread=400, seconds=80, seed=11)
    try:
        agents.start()
        assert wait_for(lambda: upstream.count() >= 10, 30, 0.02), "no load before the stop"
        pid = wait_for(lambda: writer_pid(proc.pid), 20, 0.02)
        assert pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            assert wait_for(lambda: metric(admin, "receipts_journal_writer_pending") >= AGENTS, 20, 0.02), "no write held"
            # the proxy finds it unresponsive and kills it, within the bound
            assert wait_for(lambda: process_gone(pid), JOURNAL_TIMEOUT + SLACK, 0.02), "the stopped writer was not killed"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # resumed: were it alive, it would now act on what it held
        replaced = time.monotonic()
        again = wait_for(lambda: journaled_since(agents, replaced), 30, 0.02)
        assert again, f"the proxy did not journal again: {agents.results()[-5:]}"
        next_ok = min(s.ended for s in journaled_since(agents, replaced)) - replaced
        sent = agents.stop()
        assert wait_for(lambda: not unsettled(database), 15, 0.1), unsettled(database)
        restarts = metric(admin, "receipts_journal_writer_restarts_total", '{cause="unresponsive"}')
    finally:
        agents.stop()
        stop_process(proc)

    stops = log_events(tmp_path / "proxy.log", "journal_writer_stopped")
    assert len(stops) == 1 and stops[0]["how"].startswith("killed: it held a write longer than proxy.journal_timeout"), stops
    assert restarts == 1
    held = [s for s in sent if s.problem == "journal-unavailable" and re.search(HELD, s.detail or "")]
    # each of the stopped writer's records is answered 503; so may be, on a loaded machine, records queued for its
    # replacement that waited past their bound meanwhile (the replacement refuses them unwritten: "expired")
    expired = sum(e["requests"] for e in log_events(tmp_path / "proxy.log", "journal_writes_expired"))
    assert 1 <= stops[0]["unanswered_records"] <= len(held) <= stops[0]["unanswered_records"] + expired, (len(held), expired, stops)
    slow = [s for s in sent if s.ended - s.started > JOURNAL_TIMEOUT + SLACK]
    assert not slow, f"answered after more than the bound: {slow}"
    forwarded = {r.send_id for r in upstream.received()}
    refused = {s.send_id for s in sent if s.status == 503}
    assert not forwarded & refused, "a write answered 503 reached the upstream"
    waits = sorted(round(s.ended - s.started, 2) for s in held)
    print(f"\n[{backend}] writes held by the stopped writer: {len(held)}, answered 503 after {waits} s "
          f"(stopped at +0, killed by +{replaced - stopped:.2f} s); next write journaled {next_ok:.2f} s after the kill")
    check_scenario(f"journal writer SIGSTOP, replaced ({backend})", database, upstream.received(), len(sent), answered_ids(sent))


@contextlib.contextmanager
def receipts_locked(database: str):
    """Another session holds the receipts table: PostgreSQL LOCK TABLE (ACCESS EXCLUSIVE); SQLite, a write
    transaction of another connection (the file's write lock)."""
    if database.startswith("sqlite"):
        conn = sqlite3.connect(database.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return
    with psycopg.connect(database.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("LOCK TABLE receipts IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def test_a_lock_held_on_the_receipts_table_past_the_bound_is_answered_503_and_forwards_nothing(database, upstream, tmp_path):
    backend = database.split(":")[0].split("+")[0]
    proc, proxy, admin = start(database, upstream, tmp_path)
    results = []
    try:
        journaled_again(proxy, upstream.items_url, "warm")  # the writer is up
        with receipts_locked(database):
            locked = time.monotonic()

            def one(i: int) -> None:
                with proxy_client(proxy) as client:
                    results.append(send(client, proxy, upstream.items_url, Intent(f"locked-{i}", "success")))

            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(JOURNAL_TIMEOUT + SLACK + 10)
            answered_in = time.monotonic() - locked
            assert len(results) == 4, "a write was not answered"
        next_ok = journaled_again(proxy, upstream.items_url, "after")
        assert wait_for(lambda: not unsettled(database), 15, 0.1), unsettled(database)
    finally:
        stop_process(proc)

    for s in results:
        assert s.status == 503 and s.problem == "journal-unavailable", s
        assert s.ended - s.started <= JOURNAL_TIMEOUT + SLACK, s
    forwarded = {r.send_id for r in upstream.received()}
    assert not forwarded & {s.send_id for s in results}, "a write refused under the lock reached the upstream"
    assert not [r for r in upstream.received() if (r.tag or "").startswith("locked-")]
    waits = sorted(round(s.ended - s.started, 2) for s in results)
    print(f"\n[{backend}] writes under the lock answered 503 after {waits} s (all within {answered_in:.2f} s): "
          f"{sorted({s.detail for s in results})}; next write journaled {next_ok:.2f} s after the release")
    check_scenario(f"receipts table locked past journal_timeout ({backend})", database, upstream.received(), len(results),
                   answered_ids(results))

