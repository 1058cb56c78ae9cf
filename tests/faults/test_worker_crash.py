"""A `receipts reconcile --loop` process SIGKILLed while it holds leases, on SQLite and on PostgreSQL.

Writes that the upstream stored and then reset become `outcome_unknown` receipts through a real proxy. A
worker leases them all and starts reading the upstream, whose reads are slowed so that the kill lands while
every read is in flight. A second worker, started at once, takes nothing until the dead worker's leases
expire (`reconcile.lease`), then releases them (reconciling -> outcome_unknown, "lease expired"), reads
each item once and settles it: every receipt gets exactly one verdict, from the second worker.
"""

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta

from support.e2e import open_store, stop_process, wait_for
from support.proxy import start_proxy_process
from support.recording_upstream import RESET

from faults.fault_harness import Intent, answered_ids, fault_config, proxy_client, send
from faults.invariants import check_scenario, read_journal

RECEIPTS = 6
LEASE = 3.0
VERDICTS = {"succeeded", "safe_to_retry", "manual_review"}


def start_worker(config, database: str, log_path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "proxy_addon.cli", "reconcile", "--loop", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(config.parent),
            env={**os.environ, "RECEIPTS_DATABASE_URL": database, "PYTHONUNBUFFERED": "1"},
        )


def test_worker_killed_mid_lease_each_receipt_is_reconciled_once_by_another(database, upstream, tmp_path):
    backend = database.split(":")[0].split("+")[0]
    config = fault_config(tmp_path, upstream, reconcile={"lease": f"{LEASE}s", "concurrency": RECEIPTS})
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "proxy.log")
    proxy = f"http://127.0.0.1:{port}"
    try:
        with proxy_client(proxy) as client:
            sent = [send(client, proxy, upstream.items_url, Intent(f"lease-{i}-{os.getpid()}", RESET)) for i in range(RECEIPTS)]
    finally:
        stop_process(proc)
    assert all((s.status, s.receipt_state) == (504, "outcome_unknown") for s in sent), sent
    ops = {s.receipt_id for s in sent}

    upstream.read_delay = 10.0  # the first worker's reads hang until it is killed
    first = start_worker(config, database, tmp_path / "worker-1.log")
    second = None
    try:
        with open_store(database) as store:
            def leased_by_first() -> bool:
                rs = [store.receipts.get(op) for op in ops]
                return all(r.state == "reconciling" and r.lease_owner and f"-{first.pid}-" in r.lease_owner for r in rs)

            assert wait_for(lambda: leased_by_first() and upstream.read_count() >= RECEIPTS, 20, 0.05), (
                f"the first worker did not lease and read them all: {[store.receipts.get(op).state for op in ops]}, "
                f"{upstream.read_count()} reads"
            )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        reads_at_kill = upstream.read_count(probes=False)
        upstream.read_delay = 0.0
        second = start_worker(config, database, tmp_path / "worker-2.log")
        with open_store(database) as store:
            done = wait_for(lambda: all(store.receipts.get(op).state in VERDICTS for op in ops), LEASE + 20, 0.1)
            assert done, f"not settled after the lease expired: {[store.receipts.get(op).state for op in ops]}"
    finally:
        stop_process(first)
        if second is not None:
            stop_process(second)

    journal = read_journal(database)
    for op in ops:
        steps = journal.history[op]
        claims = [t for t in steps if t["to_state"] == "reconciling"]
        verdicts = [t for t in steps if t["from_state"] == "reconciling" and t["to_state"] in VERDICTS]
        releases = [t for t in steps if t["from_state"] == "reconciling" and t["to_state"] == "outcome_unknown"]
        assert len(verdicts) == 1, f"{op} reconciled {len(verdicts)} times: {steps}"
        assert journal.receipts[op]["state"] == "succeeded" and verdicts[0]["detail"]["result"] == "present"
        dead, alive = claims[0]["detail"]["who"], verdicts[0]["detail"]["who"]
        assert f"-{first.pid}-" in dead and f"-{second.pid}-" in alive, (dead, alive)
        assert len(claims) == 2 and claims[-1]["detail"]["who"] == alive
        assert [(t["detail"]["reason"], t["detail"]["lease_owner"]) for t in releases] == [("lease expired", dead)]
        expired_at = datetime.fromisoformat(claims[0]["detail"]["lease_expires_at"])
        assert releases[0]["recorded_at"] >= expired_at - timedelta(milliseconds=50), "released before the lease expired"
    assert upstream.read_count(probes=False) - reads_at_kill == RECEIPTS, "the second worker did not read each item exactly once"
    check_scenario(f"reconcile worker SIGKILL mid-lease ({backend})", database, upstream.received(), len(sent),
                   answered_ids(sent))
