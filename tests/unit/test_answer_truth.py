"""The journal never contradicts what the agent was told (request/recording.py), in-process with a real SQLite
journal and its writer's own loop on a thread: which verdicts commit before their answers, a verdict held past
the writer's old deadline, a failure after the send, and a handler replaced at run time."""

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from mitmproxy import ctx
from support.handler import created, post, states

from proxy_addon.addons.heartbeat import Heartbeat
from proxy_addon.addons.receipts import Receipts
from proxy_addon.journal.messages import Advance
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse

HOLD = 30.0  # the longest a held verdict waits for the test to release it


def answered(status: int, body: bytes) -> SendResult:
    return SendResult(SendEnd.ANSWERED, UpstreamResponse(status, "", [(b"content-type", b"application/json")], body))


def mcp_call() -> Any:
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "send_mail", "arguments": {"to": "a"}}}
    return post(json.dumps(body).encode(), path=b"/mcp")


INPUT_REQUIRED = answered(200, json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"resultType": "input_required", "requestState": "s"}}).encode())


class HeldVerdicts:
    """The writer holds each batch with a verdict until `release`; `holding` once it holds one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, to: str | None = None):
        self.holding, self.release = threading.Event(), threading.Event()
        run_batch = JournalWriter.run

        def run(writer: JournalWriter, batch: list) -> list:
            if any(isinstance(r, Advance) and (to is None or r.to == to) for _, r in batch):
                self.holding.set()
                self.release.wait(HOLD)
            return run_batch(writer, batch)

        monkeypatch.setattr(JournalWriter, "run", run)


class HeldAtUpstream:
    """The fake sender's writes wait at the upstream until `answer()`; `arrived` is set as each one gets there.
    Its events are made on first use, inside the test's event loop. And a second config file, for a runtime
    change of receipts_config."""

    def __init__(self, sender: Any, tmp_path: Any):
        self._events: tuple[asyncio.Event, asyncio.Event] | None = None
        scripted = sender.send_once

        async def held(*args: Any) -> SendResult:
            arrived, answers = self.events()
            arrived.set()
            await answers.wait()
            return await scripted(*args)

        sender.send_once = held
        self.other_config = tmp_path / "other.yaml"
        self.other_config.write_text(f"secret_file: {tmp_path / 'secret'}\nlogging: {{level: error}}\n")

    def events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._events is None:
            self._events = (asyncio.Event(), asyncio.Event())
        return self._events

    async def arrival(self) -> None:
        arrived, _ = self.events()
        await asyncio.wait_for(arrived.wait(), HOLD)
        arrived.clear()

    def answer(self) -> None:
        self.events()[1].set()


@pytest.mark.parametrize(
    ("flow", "result", "config", "state"),
    [
        (post, answered(409, b'{"error": "conflict"}'), "", "rejected"),
        (post, SendResult(SendEnd.NOT_SENT, error="refused"), "", "rejected"),
        (mcp_call, INPUT_REQUIRED, "", "rejected"),
        (post, created(), "proxy: {answer_first: false}", "succeeded"),
    ],
    ids=["upstream-409", "not-sent", "mcp-input-required", "success-answer-first-off"],
)
def test_a_verdict_that_releases_the_intent_commits_before_its_answer(journal, monkeypatch, flow, result, config, state):
    """While `submitted`, such a receipt would refuse the retry its answer invites (on another replica) and end
    the windows of earlier successes on its target; so when its answer exists, the journal holds its verdict."""
    held = HeldVerdicts(monkeypatch)
    run, addon, _ = journal(result, config=config)
    f = flow()
    at_answer: list[str] = []

    async def script(addon: Receipts) -> None:
        assert addon.store is not None
        request = asyncio.ensure_future(addon.request(f))
        request.add_done_callback(lambda _: at_answer.append(addon.store.receipts.get(op_of(f)).state))
        await asyncio.to_thread(held.holding.wait, HOLD)
        assert not request.done()  # the answer waits for the verdict
        held.release.set()
        await asyncio.wait_for(request, HOLD)

    run(f, script=script)
    assert f.response.headers["X-Receipt-State"] == state == at_answer[0]


def op_of(flow: Any) -> str:
    return flow.response.headers["X-Receipt-Id"]


def test_a_success_answers_first_and_its_receipt_stays_open_until_the_verdict_commits(journal, monkeypatch):
    held = HeldVerdicts(monkeypatch)
    run, addon, _ = journal(created())
    f = post()

    async def script(addon: Receipts) -> None:
        assert addon.store is not None
        await asyncio.wait_for(addon.request(f), HOLD)  # answered while the writer holds its verdict
        assert addon.store.receipts.get(op_of(f)).state == "submitted"
        held.release.set()
        await addon.handler.drain()  # type: ignore[union-attr]

    run(f, script=script)
    assert f.response.headers["X-Receipt-State"] == "succeeded" == states(addon, op_of(f))[-1]


def test_patch_a_then_a_rejected_patch_b_whose_verdict_is_held_past_the_writers_deadline_then_a_is_replayed(journal, monkeypatch):
    """PATCH A (200), PATCH B (409), PATCH A: B did not happen, so A's success still stands and its repeat is
    replayed, not sent again. The writer holds B's verdict past what was its deadline (80 % of journal_timeout:
    a verdict was expired then, and went through the store while the repeat, queued behind it, committed
    first and found B `submitted`, which ends A's window). Held 1.7 s, past the old 1.6 s for certain."""
    release_after = 1.7
    run_batch = JournalWriter.run

    def run(writer: JournalWriter, batch: list) -> list:
        if any(isinstance(r, Advance) and r.to == "rejected" for _, r in batch):
            threading.Event().wait(release_after)  # a slow disk or a loaded machine, for the verdict alone
        return run_batch(writer, batch)

    monkeypatch.setattr(JournalWriter, "run", run)
    run_flows, addon, sender = journal(created(b'{"v": "A"}', 200), answered(409, b'{"error": "stale"}'), created(b'{"v": "A"}', 200),
                                       config="proxy: {journal_timeout: 2s}")
    a, b, a_again = post(b'{"v": "A"}', method=b"PATCH", path=b"/doc/1"), post(b'{"v": "B"}', method=b"PATCH", path=b"/doc/1"), \
        post(b'{"v": "A"}', method=b"PATCH", path=b"/doc/1")  # fmt: skip
    run_flows(a, b, a_again)
    assert (a.response.status_code, b.response.status_code) == (200, 409)
    assert b.response.headers["X-Receipt-State"] == "rejected"
    assert a_again.response.headers.get("X-Receipt-Replayed") == "true", a_again.response.headers
    assert a_again.response.headers["X-Receipt-Id"] == op_of(a)
    assert [body for _, _, body in sender.sent] == [b'{"v": "A"}', b'{"v": "B"}']  # the upstream saw A once


def test_a_failure_after_the_send_is_an_unknown_outcome_never_a_503_not_sent(journal, monkeypatch):
    """The request reached the upstream: whatever fails after, the agent must not hear "nothing forwarded"
    (503 journal-unavailable), which invites a retry. It hears outcome-unknown, as the journal says."""

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug between the send and the answer")

    monkeypatch.setattr("proxy_addon.request.handler.send_verdict", broken)
    run, addon, sender = journal(created())
    f = run(post())
    assert len(sender.sent) == 1
    assert f.response.status_code == 504
    assert json.loads(f.response.content)["type"].endswith("outcome-unknown")
    assert addon.store is not None
    receipt = addon.store.receipts.get(op_of(f))
    assert (receipt.state, receipt.error_code) == ("outcome_unknown", "proxy_error") == (f.response.headers["X-Receipt-State"], "proxy_error")


def test_a_handler_replaced_at_run_time_finishes_its_writes_which_the_heartbeat_still_counts(journal, monkeypatch, tmp_path):
    """A runtime change of receipts_config replaces the handler while a write of the old one is at its upstream:
    that write's verdict is still committed (its journal stays open until then), and meanwhile the heartbeat's
    orphan sweep counts it, and the new handler's writes, as in flight."""
    run, addon, sender = journal(created(), created(b'{"id": 8}'))
    upstream = HeldAtUpstream(sender, tmp_path)
    old_write, new_write = post(b'{"n": 1}'), post(b'{"n": 2}')
    seen: dict[str, frozenset[str]] = {}

    async def script(addon: Receipts) -> None:
        heartbeat = Heartbeat(addon)
        await heartbeat.running()
        try:
            first = asyncio.ensure_future(addon.request(old_write))
            await upstream.arrival()
            old_handler = addon.handler
            ctx.options.update(receipts_config=str(upstream.other_config))
            assert addon.handler is not old_handler and addon.handler is not None
            addon.handler.sender = sender
            second = asyncio.ensure_future(addon.request(new_write))
            await upstream.arrival()
            assert heartbeat.liveness is not None
            seen["in_flight"] = heartbeat.liveness.in_flight()  # type: ignore[misc]
            upstream.answer()
            await asyncio.wait_for(asyncio.gather(first, second), HOLD)
            await addon.done()
        finally:
            await heartbeat.done()

    run(old_write, script=script)
    assert seen["in_flight"] >= {op_of(old_write), op_of(new_write)}, seen
    assert addon.store is not None
    deadline = time.monotonic() + HOLD
    while addon.store.receipts.get(op_of(old_write)).state == "submitted" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert addon.store.receipts.get(op_of(old_write)).state == "succeeded"
    assert addon.store.receipts.get(op_of(new_write)).state == "succeeded"


@pytest.mark.parametrize("recovered_first", [False, True])
@pytest.mark.parametrize("frozen_at", ["before the send", "at the last look"])
def test_a_proxy_that_stalled_past_half_of_dead_after_does_not_send(journal, recovered_first, frozen_at):
    """Frozen (SIGSTOP, a paused VM) between its receipt and its send, long enough that a replica may recover that
    receipt (outcome_unknown, then a read that finds nothing: safe_to_retry): sent after waking, the write would
    reach the upstream while the journal says a retry is safe. So it is not sent: its receipt is closed as not
    sent, or, when a recovery took it first, left to the reconciler, and the agent is told which. Frozen "at the
    last look": after the check that follows the receipt (while it connected), caught by the sender's last look
    before the first byte."""
    run, addon, sender = journal(created())
    f = post()
    looks = []

    class Frozen:
        """Its heartbeats stopped after the mark (as InstanceLiveness says once a heartbeat came too late)."""

        def mark(self) -> int:
            return 0

        def lost_since(self, mark: int) -> bool:
            looks.append(mark)
            if frozen_at == "at the last look" and len(looks) == 1:
                return False  # alive when its receipt was written; frozen before the sender's last look
            assert addon.store is not None
            submitted = addon.store.receipts.list(states=["submitted"], limit=None)
            if recovered_first and submitted:  # the replica's recovery, once
                addon.store.receipts.transition(submitted[0].operation_id, "submitted", "outcome_unknown",
                                                {"who": "replica", "error": "proxy_interrupted"}, error_code="proxy_interrupted")
            return True

    async def script(addon: Receipts) -> None:
        addon.liveness = Frozen()
        await addon.request(f)

    run(f, script=script)
    assert sender.sent == []
    state = "outcome_unknown" if recovered_first else "rejected"
    assert (f.response.status_code, f.response.headers["X-Receipt-State"]) == (504 if recovered_first else 502, state)
    assert states(addon, op_of(f))[-1] == state


def test_a_verdict_that_finds_its_receipt_moved_on_answers_the_state_the_journal_holds(journal, monkeypatch):
    """A rejection (committed before its answer) finds its receipt no longer `submitted`: someone else moved it
    on first (a recovery that took the proxy for dead made it `outcome_unknown`). Theirs stands, and the agent
    is told that state, not the verdict the journal refused: only a refusal naming the verdict's own state is
    the verdict committed already (a writer that died before it answered)."""
    held = HeldVerdicts(monkeypatch, to="rejected")
    run, addon, _ = journal(answered(409, b'{"error": "conflict"}'))
    f = post()

    async def script(addon: Receipts) -> None:
        assert addon.store is not None and addon.handler is not None
        request = asyncio.ensure_future(addon.request(f))
        await asyncio.to_thread(held.holding.wait, HOLD)
        [op] = addon.handler.verdicts.recording
        addon.store.receipts.transition(op, "submitted", "outcome_unknown", {"who": "recovery", "error": "proxy_interrupted"},
                                        error_code="proxy_interrupted")  # fmt: skip
        held.release.set()
        await asyncio.wait_for(request, HOLD)

    run(f, script=script)
    assert addon.store is not None
    assert f.response.status_code == 409
    assert f.response.headers["X-Receipt-State"] == "outcome_unknown" == addon.store.receipts.get(op_of(f)).state


def test_shutdown_waits_for_the_verdicts_of_a_handler_replaced_at_run_time(journal, monkeypatch, tmp_path):
    """A runtime change of receipts_config replaced the handler while a verdict it answered first is still being
    committed; the proxy then stops. Shutdown (the addon's `done`) waits for that verdict too, as for the
    current handler's, before its writer is stopped: when `done` returns, the verdict is in the journal."""
    held = HeldVerdicts(monkeypatch)
    run, addon, _ = journal(created())
    other = tmp_path / "other.yaml"
    other.write_text(f"secret_file: {tmp_path / 'secret'}\nlogging: {{level: error}}\n")
    f = post()
    at_done: list[str] = []

    async def script(addon: Receipts) -> None:
        assert addon.store is not None
        await asyncio.wait_for(addon.request(f), HOLD)  # answered first: its verdict is held by the writer
        store = addon.store
        assert store.receipts.get(op_of(f)).state == "submitted"
        ctx.options.update(receipts_config=str(other))
        threading.Timer(0.3, held.release.set).start()  # committed a moment after the shutdown began
        await addon.done()
        at_done.append(store.receipts.get(op_of(f)).state)

    run(f, script=script)
    assert f.response.headers["X-Receipt-State"] == "succeeded"
    assert at_done == ["succeeded"]


def test_a_handler_replaced_at_run_time_stops_its_writer_once_its_writes_are_done(journal, tmp_path):
    """Not only at shutdown: the replaced handler waits for the write it still has at its upstream, then (its
    verdict committed) stops its journal writer and is no longer counted; it is not left running."""
    run, addon, sender = journal(created())
    upstream = HeldAtUpstream(sender, tmp_path)
    f = post()
    seen: dict[str, Any] = {}

    async def script(addon: Receipts) -> None:
        request = asyncio.ensure_future(addon.request(f))
        await upstream.arrival()
        old_handler = addon.handler
        assert old_handler is not None
        ctx.options.update(receipts_config=str(upstream.other_config))
        upstream.answer()
        await asyncio.wait_for(request, HOLD)
        for _ in range(1000):  # before any shutdown (bounded: 10 s)
            if old_handler.journal.closed:
                break
            await asyncio.sleep(0.01)
        seen["closed"], seen["in_flight"] = old_handler.journal.closed, addon.in_flight()
        seen["state"] = old_handler.store.receipts.get(op_of(f)).state

    run(f, script=script)
    assert seen == {"closed": True, "in_flight": frozenset(), "state": "succeeded"}, seen


def test_a_failure_after_the_verdict_was_handed_over_names_the_verdicts_state(journal, monkeypatch):
    """The upstream answered 201 and its verdict was handed over, then building the answer failed: the agent gets
    504 (it cannot have the upstream's answer), with the state the journal ends in, not a guessed outcome_unknown
    the journal never reaches (fault invariant 6)."""

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug while the answer was made")

    monkeypatch.setattr("proxy_addon.request.handler._answer", broken)
    run, addon, sender = journal(created())
    f = run(post())
    assert len(sender.sent) == 1 and f.response.status_code == 504
    assert f.response.headers["X-Receipt-State"] == "succeeded" == json.loads(f.response.content)["state"]
    assert states(addon, op_of(f))[-1] == "succeeded"
