"""The journal writer process SIGKILLed under load, three times, on SQLite and on PostgreSQL.

Six agents send 30 intents at random (mixed success, slow, reset and reject) through a `receipts proxy`.
Each round stops the proxy's journal writer (SIGSTOP) and waits until every agent waits on it (the
`receipts_journal_writer_pending` gauge), then kills it. The writes it held are answered 503
`journal-unavailable` at once, exactly as many as the proxy's log says it held, and none of them reaches the
upstream; the verdicts it held (answered already) go first to the next writer, started for them at once; a receipt it may have committed for a
write that was never sent is closed as not sent, so nothing stays open. The proxy starts a new writer and
journals again. Then the invariants hold (invariants.py): nothing lost, nothing forwarded twice, no
half-written history.
"""

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import yaml
from support.e2e import stop_process, wait_for
from support.proxy import start_proxy_process, writer_pid
from support.server import free_port

from faults.fault_harness import MIXED, Agents, answered_ids, fault_config, intent_pool, journaled_since, unsettled
from faults.invariants import check_scenario

ROUNDS = 3
AGENTS = 6


def pending(admin: str) -> float:
    text = httpx.get(f"{admin}/metrics", timeout=5).text
    found = re.search(r"^receipts_journal_writer_pending (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def log_events(path: Path) -> list[dict]:
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def test_journal_writer_killed_under_load_fails_closed_and_loses_nothing(database, upstream, tmp_path):
    backend = database.split(":")[0].split("+")[0]
    config = fault_config(tmp_path, upstream)
    document = yaml.safe_load(config.read_text())
    admin_port = free_port()
    document["admin"] = {"enabled": True, "listen_host": "127.0.0.1", "listen_port": admin_port}
    config.write_text(yaml.safe_dump(document))
    admin = f"http://127.0.0.1:{admin_port}"
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "proxy.log")
    intents = intent_pool(30, {**MIXED, "slow": 0.1}, seed=5, slow_seconds=0.3)
    agents = Agents([f"http://127.0.0.1:{port}"], upstream.items_url, intents, threads=AGENTS, per_thread=400, seconds=80, seed=9)
    killed: list[int] = []
    try:
        agents.start()
        assert wait_for(lambda: upstream.count() >= 10, 20, 0.02), "no load before the first kill"
        for _round in range(ROUNDS):
            pid = wait_for(lambda: writer_pid(proc.pid), 20, 0.02)
            assert pid and pid not in killed, f"no new journal writer after {len(killed)} kills"
            os.kill(pid, signal.SIGSTOP)
            try:
                assert wait_for(lambda: pending(admin) >= AGENTS, 20, 0.02), f"the stopped writer held {pending(admin)}"
            finally:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            after = time.monotonic()
            again = wait_for(lambda after=after: journaled_since(agents, after), 20, 0.02)
            assert again, f"the proxy did not journal again: {agents.results()[-5:]}"
        sent = agents.stop()
        assert wait_for(lambda: not unsettled(database), 15, 0.1), unsettled(database)
    finally:
        agents.stop()
        stop_process(proc)

    stops = [e for e in log_events(tmp_path / "proxy.log") if e.get("event") == "journal_writer_stopped"]
    assert len(stops) == ROUNDS and all(e["how"] == "killed by SIGKILL" for e in stops), stops
    # each agent waits on one receipt at most; the verdicts held were answered already (the store wrote them)
    assert all(e["unanswered_records"] <= AGENTS <= e["unanswered_records"] + e["unanswered_verdicts"] for e in stops), stops
    lost = [s for s in sent if s.problem == "journal-unavailable"]
    assert len(lost) == sum(e["unanswered_records"] for e in stops), (len(lost), stops)
    for s in lost:
        assert s.status == 503 and "journal writer stopped (killed by SIGKILL)" in (s.detail or ""), s
    forwarded = {r.send_id for r in upstream.received()}
    assert not forwarded & {s.send_id for s in lost}, "a write the dead writer held reached the upstream"
    check_scenario(f"journal writer SIGKILL under load ({backend})", database, upstream.received(), len(sent), answered_ids(sent))
