"""A `receipts proxy` process SIGKILLed under load, on SQLite and on PostgreSQL.

Six agents send 24 intents at random (so several send the same one at once: duplicate-prone), mixed
success, slow, reset and reject, through the proxy. While a slow write is in the upstream's hands the
proxy is killed; nothing in it can say what it was doing. It is started again: within 30 s every receipt
the dead instance left `submitted` is `outcome_unknown` (`proxy_interrupted`) and every `planned` one
`rejected`; the agents retry through it, and the interrupted intents are refused, not sent again.
Then the invariants hold (invariants.py): nothing lost, nothing forwarded twice, no half-written history.
"""

import json
import signal
import time

from support.e2e import open_store, stop_process, wait_for
from support.proxy import start_proxy_process
from support.recording_upstream import SLOW

from faults.fault_harness import MIXED, Agents, answered_ids, fault_config, intent_pool, proxy_client, send, unsettled
from faults.invariants import check_scenario

RECOVERY_LIMIT = 30.0  # the contract: a dead instance's receipts are recovered within 30 s of a restart


def test_proxy_sigkilled_under_load_loses_nothing_and_forwards_nothing_twice(database, upstream, tmp_path):
    backend = database.split(":")[0].split("+")[0]
    config = fault_config(tmp_path, upstream)
    intents = intent_pool(24, MIXED, seed=7)
    confdir = tmp_path / "confdir"
    first, port = start_proxy_process(config, database, confdir, tmp_path / "first.log")
    second = None
    sent = []
    agents = Agents([f"http://127.0.0.1:{port}"], upstream.items_url, intents, threads=6, per_thread=80, seconds=20)
    try:
        agents.start()
        loaded = wait_for(lambda: upstream.count() >= 12 and upstream.busy(SLOW) > 0, 15, 0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        sent += agents.stop()
        assert loaded, f"no load before the kill: upstream saw {upstream.count()} writes"
        assert any(s.status is None for s in sent), "no agent lost its connection: the kill landed on an idle proxy"
        at_kill = upstream.count()

        restarted = time.monotonic()
        second, port = start_proxy_process(config, database, confdir, tmp_path / "second.log")
        recovered = wait_for(lambda: not unsettled(database), RECOVERY_LIMIT, 0.2)
        took = time.monotonic() - restarted
        assert recovered, f"still unsettled {RECOVERY_LIMIT:.0f} s after the restart: {unsettled(database)}"

        with open_store(database) as store:
            interrupted = [r for r in store.receipts.list(limit=None) if r.error_code == "proxy_interrupted"]
        assert interrupted, "the write in flight at the kill was not recovered as proxy_interrupted"
        assert all(r.state == "outcome_unknown" for r in interrupted)
        # an interrupted intent sent again is refused: it may have happened
        proxy = f"http://127.0.0.1:{port}"
        with proxy_client(proxy) as client:
            for receipt in interrupted:
                intent = next(i for i in intents if i.tag == _tag(receipt))
                again = send(client, proxy, upstream.items_url, intent)
                sent.append(again)
                assert (again.status, again.problem, again.receipt_id) == (409, "duplicate-open", receipt.operation_id)
        assert upstream.count() == at_kill

        # and the agents carry on through the restarted proxy, with the same intents
        sent += Agents([proxy], upstream.items_url, intents, threads=6, per_thread=25, seconds=2.0, seed=8).start().join()
        assert wait_for(lambda: not unsettled(database), 10, 0.1), unsettled(database)
    finally:
        agents.stop()
        stop_process(first)
        if second is not None:
            stop_process(second)
    assert took <= RECOVERY_LIMIT
    check_scenario(f"proxy SIGKILL under load ({backend})", database, upstream.received(), len(sent), answered_ids(sent))


def _tag(receipt) -> str:
    return json.loads(receipt.request_body)["tag"]
