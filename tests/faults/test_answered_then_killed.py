"""A `receipts proxy` SIGKILLed after it answered writes whose verdicts its journal writer still held, on SQLite
and on PostgreSQL: the journal must end in the states the agents were told.

The writer is stopped (SIGSTOP: a slow disk, a loaded machine) while slow writes are at the upstream; the
upstream answers 201, and the proxy answers the agents at once (answer first), the verdicts waiting in the
stopped writer's socket. Then the proxy is killed. Two orders of what follows:
- `writer first`: the writer resumes, finds itself orphaned, commits the verdicts it holds (and no record), and
  exits; then the proxy starts again, and its recovery has nothing to guess.
- `recovery first`: the proxy starts again and its recovery, finding the dead instance's receipts `submitted`,
  makes them `outcome_unknown` (`proxy_interrupted`); then the writer resumes, and each verdict its agent was
  told replaces that guess.
Either way each receipt ends `succeeded`, as its answer said, and the invariants hold (invariants.py, 6. too).
"""

import os
import signal
import threading

import pytest
from support.e2e import open_store, stop_process, wait_for
from support.proxy import process_gone, start_proxy_process, writer_pid
from support.recording_upstream import SLOW

from faults.fault_harness import Intent, Sent, answered_ids, fault_config, proxy_client, send
from faults.invariants import check_scenario

WRITES = 3


def send_all(proxy: str, url: str, intents: list[Intent]) -> tuple[list[Sent], list[threading.Thread]]:
    results: list[Sent] = []
    lock = threading.Lock()

    def one(intent: Intent) -> None:
        with proxy_client(proxy) as client:
            result = send(client, proxy, url, intent)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in intents]
    for t in threads:
        t.start()
    return results, threads


@pytest.mark.parametrize("order", ["writer first", "recovery first"])
def test_writes_answered_before_the_proxy_died_end_in_the_state_their_agents_were_told(database, upstream, tmp_path, order):
    backend = database.split(":")[0].split("+")[0]
    config = fault_config(tmp_path, upstream)
    confdir = tmp_path / "confdir"
    first, port = start_proxy_process(config, database, confdir, tmp_path / "first.log")
    proxy = f"http://127.0.0.1:{port}"
    second = None
    writer = None
    intents = [Intent(f"told-{order[0]}-{i}-{os.getpid()}", SLOW, 0.5) for i in range(WRITES)]
    try:
        warm = send(proxy_client(proxy), proxy, upstream.items_url, Intent(f"warm-{order[0]}-{os.getpid()}", "success"))
        assert warm.status == 201, warm
        writer = wait_for(lambda: writer_pid(first.pid), 20, 0.02)
        assert writer, "no journal writer"
        results, threads = send_all(proxy, upstream.items_url, intents)
        # each receipt is committed (the upstream has the write) before the writer is stopped
        assert wait_for(lambda: all(upstream.count(i.tag) == 1 for i in intents), 20, 0.01), "the writes did not arrive"
        os.kill(writer, signal.SIGSTOP)
        for t in threads:
            t.join(20)
        assert len(results) == WRITES and all((s.status, s.receipt_state) == (201, "succeeded") for s in results), results
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        with open_store(database) as store:
            ops = [s.receipt_id for s in results]
            assert all(store.receipts.get(op).state == "submitted" for op in ops)  # the verdicts are in the stopped writer
            if order == "writer first":
                os.kill(writer, signal.SIGCONT)
                assert wait_for(lambda: process_gone(writer), 20, 0.02), "the orphaned writer did not exit"
                second, _ = start_proxy_process(config, database, confdir, tmp_path / "second.log", port=port)
            else:
                second, _ = start_proxy_process(config, database, confdir, tmp_path / "second.log", port=port)
                guessed = wait_for(lambda: all(store.receipts.get(op).state == "outcome_unknown" for op in ops), 30, 0.05)
                assert guessed, [store.receipts.get(op).state for op in ops]
                os.kill(writer, signal.SIGCONT)
            told = wait_for(lambda: all(store.receipts.get(op).state == "succeeded" for op in ops), 30, 0.05)
            assert told, [(store.receipts.get(op).state, store.receipts.get(op).error_code) for op in ops]
            if order == "recovery first":
                history = [t.to_state for t in store.receipts.history(ops[0])]
                assert history == ["planned", "submitted", "outcome_unknown", "succeeded"], history
    finally:
        if writer is not None and not process_gone(writer):
            os.kill(writer, signal.SIGCONT)
        stop_process(first)
        if second is not None:
            stop_process(second)
    check_scenario(f"proxy SIGKILL after answering, its writer stopped, {order} ({backend})", database,
                   upstream.received(), WRITES + 1, answered_ids([warm, *results]))
