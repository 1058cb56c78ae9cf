"""The journal addon and its handler in-process, as mitmproxy's own addons are tested: `taddons` configures the
addon, `tflow` makes the flows, and a fake sender stands in for the upstream, so that every case of the request
path runs in milliseconds against a real SQLite journal."""

import asyncio
import json
import threading
from typing import Any

import pytest
from support.handler import created, post, states

from proxy_addon import metrics
from proxy_addon.addons.receipts import METADATA_KEY, Receipts
from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.journal.messages import Advance, Record
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.request.sender import SendEnd, SendResult


def counted(name: str, **labels: str) -> float:
    """A counter's value now, as /metrics would serve it."""
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_success_is_the_upstreams_answer_with_the_receipt(journal):
    run, addon, sender = journal(created())
    before = counted("receipts_writes_total", host="api.example.com", state="succeeded")
    flow = run(post())
    assert counted("receipts_writes_total", host="api.example.com", state="succeeded") == before + 1
    assert flow.response.status_code == 201 and flow.response.content == b'{"id": 7}'
    op = flow.response.headers["X-Receipt-Id"]
    assert flow.response.headers["X-Receipt-State"] == "succeeded" == flow.metadata[METADATA_KEY]["state"]
    assert sender.sent == [("POST", "https://api.example.com/api/articles", b'{"title": "hello"}')]
    assert states(addon, op) == ["planned", "submitted", "succeeded"]


def test_a_resend_of_a_refused_stream_and_a_reused_connection_are_in_the_verdicts_history(journal):
    answered = created()
    result = SendResult(answered.end, answered.answer, reused=True, resent="refused_stream")
    run, addon, _ = journal(result)
    flow = run(post())
    assert addon.store is not None
    verdict = addon.store.receipts.history(flow.response.headers["X-Receipt-Id"])[-1]
    assert verdict.to_state == "succeeded"
    assert (verdict.detail["resent"], verdict.detail["connection"]) == ("refused_stream", "reused")


@pytest.mark.parametrize(
    ("result", "status", "problem", "state"),
    [
        (SendResult(SendEnd.TIMEOUT, error="read timeout (30s)"), 504, "outcome-unknown", "outcome_unknown"),
        (SendResult(SendEnd.RESET, error="reset"), 504, "outcome-unknown", "outcome_unknown"),
        (created(b"{}", 503), 504, "outcome-unknown", "outcome_unknown"),
        (SendResult(SendEnd.NOT_SENT, error="refused"), 502, "not-sent", "rejected"),
    ],
)
def test_endings_the_proxy_answers_itself(journal, result, status, problem, state):
    run, addon, _ = journal(result)
    flow = run(post())
    assert flow.response.status_code == status
    assert flow.response.headers["Content-Type"] == "application/problem+json"
    document = json.loads(flow.response.content)
    assert document["type"].endswith(problem) and document["operation_id"] == flow.response.headers["X-Receipt-Id"]
    assert states(addon, document["operation_id"])[-1] == state == flow.response.headers["X-Receipt-State"]


def test_a_repeat_while_the_outcome_is_unknown_is_refused_and_not_sent(journal):
    run, _, sender = journal(SendResult(SendEnd.TIMEOUT, error="read timeout"))
    first = run(post())
    again = run(post())
    assert again.response.status_code == 409 and json.loads(again.response.content)["type"].endswith("duplicate-open")
    assert again.response.headers["X-Receipt-Id"] == first.response.headers["X-Receipt-Id"]
    assert len(sender.sent) == 1 and again.metadata[METADATA_KEY]["refused"] == "duplicate_open"


def test_under_refuse_a_repeat_of_an_original_still_in_flight_is_refused_at_once(journal, monkeypatch):
    """`in_flight: refuse` (the default): a repeat is not held to wait for its original's verdict."""
    from proxy_addon.request.waiters import VerdictWaiters

    gate = asyncio.Event()  # the original stays in flight until the repeat has its answer, or waits
    waited: list[str] = []
    real_wait, real_request = VerdictWaiters.wait, Receipts.request

    async def wait(self: VerdictWaiters, operation_id: str, *args: Any) -> None:
        waited.append(operation_id)
        gate.set()
        await real_wait(self, operation_id, *args)

    async def request(self: Receipts, flow: Any) -> None:
        await real_request(self, flow)
        gate.set()

    monkeypatch.setattr(VerdictWaiters, "wait", wait)
    monkeypatch.setattr(Receipts, "request", request)
    run, _, sender = journal(created())
    scripted = sender.send_once

    async def held(*args: Any) -> SendResult:
        result = await scripted(*args)
        await gate.wait()
        return result

    sender.send_once = held  # type: ignore[method-assign]
    flows = [post(), post()]
    run(*flows, together=True)
    assert waited == []
    original, repeat = sorted(flows, key=lambda f: f.response.status_code)  # whichever was journaled first
    assert original.response.status_code == 201 and len(sender.sent) == 1
    assert repeat.response.status_code == 409 and json.loads(repeat.response.content)["type"].endswith("duplicate-open")


def test_a_repeat_after_success_is_replayed(journal):
    run, _, sender = journal(created())
    first = run(post())
    again = run(post())
    assert (again.response.status_code, again.response.content) == (201, b'{"id": 7}')  # byte for byte
    assert again.response.headers["X-Receipt-Replayed"] == "true"
    assert again.response.headers["X-Receipt-Id"] == first.response.headers["X-Receipt-Id"]
    assert len(sender.sent) == 1


def test_the_answer_leaves_before_its_verdict_commits_and_a_repeat_after_it_is_replayed(journal, monkeypatch):
    """The verdict is handed to the writer, then the agent is answered at once; the verdict commits while the
    answer travels. The receipt stays open until then, and a repeat is written after the verdict (one writer,
    in order): it gets the replay, not a second send. Shutdown waits for the verdict."""
    commit_verdicts = threading.Event()
    run_batch = JournalWriter.run

    def held_verdicts(self: JournalWriter, batch: list) -> list:
        if any(isinstance(request, Advance) for _, request in batch):
            commit_verdicts.wait(30)
        return run_batch(self, batch)

    monkeypatch.setattr(JournalWriter, "run", held_verdicts)
    run, addon, sender = journal(created())
    first, again = post(), post()

    async def script(addon: Receipts) -> None:
        assert addon.handler is not None and addon.store is not None
        await asyncio.wait_for(addon.request(first), 10)  # answered while its verdict cannot commit
        op = first.response.headers["X-Receipt-Id"]
        assert (first.response.status_code, first.response.headers["X-Receipt-State"]) == (201, "succeeded")
        assert addon.store.receipts.get(op).state == "submitted" and op in addon.handler.in_flight
        repeat = asyncio.ensure_future(addon.request(again))
        draining = asyncio.ensure_future(addon.handler.drain())
        done, _ = await asyncio.wait([draining], timeout=0.2)
        assert not done  # shutdown waits for the verdict: it cannot have committed
        commit_verdicts.set()
        await asyncio.wait_for(asyncio.gather(repeat, draining), 10)
        assert addon.store.receipts.get(op).state == "succeeded" and op not in addon.handler.in_flight

    run(first, script=script)
    assert again.response.headers["X-Receipt-Replayed"] == "true"
    assert again.response.headers["X-Receipt-Id"] == first.response.headers["X-Receipt-Id"]
    assert len(sender.sent) == 1


def test_a_verdict_whose_writer_dies_after_the_answer_is_handed_to_the_next_writer(journal, monkeypatch):
    """The answer has left; the writer dies holding its verdict (not committed): the next writer, started for
    it, writes it, and the receipt holds the state the agent was told."""
    run_batch = JournalWriter.run
    died: list[Any] = []

    def die_on_the_first_verdict(self: JournalWriter, batch: list[Any]) -> Any:
        if not died and any(isinstance(request, Advance) for _, request in batch):
            died.append(batch)
            raise SystemExit("the writer died before it committed the verdict")
        return run_batch(self, batch)

    monkeypatch.setattr(JournalWriter, "run", die_on_the_first_verdict)
    run, addon, sender = journal(created())
    flow = run(post())
    assert died and (flow.response.status_code, flow.response.headers["X-Receipt-State"]) == (201, "succeeded")
    assert states(addon, flow.response.headers["X-Receipt-Id"]) == ["planned", "submitted", "succeeded"]
    assert addon.handler is not None and not addon.handler.verdicts.recording and not addon.handler.in_flight


def test_reads_and_unjournaled_methods_pass_through(journal):
    run, addon, sender = journal()
    flow = run(post(b"", method=b"GET"))
    assert flow.response is None and sender.sent == [] and METADATA_KEY not in flow.metadata
    assert addon.store is not None and addon.store.receipts.list() == []


def test_a_journal_that_cannot_be_written_fails_closed(journal, monkeypatch):
    run, addon, sender = journal()

    async def down(*_a: Any, **_kw: Any) -> None:
        raise JournalUnavailableError("cannot write the journal: disk I/O error")

    monkeypatch.setattr("proxy_addon.journal.client.JournalClient.record", down)
    before = counted("receipts_journal_unavailable_total", action="refused")
    flow = run(post())
    assert flow.response.status_code == 503 and sender.sent == []
    assert json.loads(flow.response.content)["type"].endswith("journal-unavailable")
    assert counted("receipts_journal_unavailable_total", action="refused") == before + 1  # ReceiptsJournalUnavailable


def test_fail_open_forwards_without_a_receipt(journal, monkeypatch):
    run, _, sender = journal(config="proxy: {fail_open: true}\n")

    async def down(*_a: Any, **_kw: Any) -> None:
        raise JournalUnavailableError("cannot write the journal: disk I/O error")

    monkeypatch.setattr("proxy_addon.journal.client.JournalClient.record", down)
    before = counted("receipts_journal_unavailable_total", action="forwarded")
    flow = run(post())
    assert flow.response is None and flow.metadata[METADATA_KEY] == {"fail_open": True} and sender.sent == []
    assert counted("receipts_journal_unavailable_total", action="forwarded") == before + 1


def test_a_bug_in_the_handler_fails_closed_too(journal, monkeypatch):
    run, _, sender = journal()

    def broken(*_a: Any, **_kw: Any) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("proxy_addon.request.handler.write_intent", broken)
    before = counted("receipts_journal_unavailable_total", action="refused")
    flow = run(post())
    assert flow.response.status_code == 503 and "internal error: KeyError" in json.loads(flow.response.content)["detail"]
    assert counted("receipts_journal_unavailable_total", action="refused") == before + 1
    assert sender.sent == []


def test_the_injected_idempotency_key_is_the_operation_id(journal):
    run, _, sender = journal(created(), config="hosts: {api.example.com: {inject_idempotency_key: true}}\n")
    flow = run(post())
    assert flow.response.status_code == 201
    assert sender.headers[0][b"idempotency-key"] == flow.response.headers["X-Receipt-Id"].encode()


def test_a_write_the_writer_committed_before_it_died_is_closed_as_not_sent(journal, monkeypatch):
    """The writer commits the receipt, then dies before it answers: the proxy cannot know it was recorded, so
    it answers 503, sends nothing, and closes that receipt as not sent, so that the retry is not refused."""
    from proxy_addon.journal.writer import JournalWriter

    commit = JournalWriter.run
    batches: list[Any] = []

    def commit_then_die(self: JournalWriter, batch: list[Any]) -> Any:
        records = any(isinstance(request, Record) for _, request in batch)
        if records:
            batches.append(batch)
        replies = commit(self, batch)
        if records and len(batches) == 2:  # the warm-up's record was answered; this record (with its verdict, maybe) is not
            raise SystemExit("the writer died before it answered")
        return replies

    monkeypatch.setattr(JournalWriter, "run", commit_then_die)
    run, addon, sender = journal(created(), created())
    warm, flow = post(b'{"warm": 1}'), post()
    run(warm, flow)
    assert warm.response.status_code == 201 and len(sender.sent) == 1
    assert flow.response.status_code == 503 and len(sender.sent) == 1
    assert "journal writer stopped" in json.loads(flow.response.content)["detail"]
    assert addon.store is not None
    [receipt] = [r for r in addon.store.receipts.list() if r.operation_id != warm.response.headers["X-Receipt-Id"]]
    assert (receipt.state, receipt.error_code) == ("rejected", "not_sent")
    assert states(addon, receipt.operation_id) == ["planned", "submitted", "rejected"]
    monkeypatch.undo()
    again = run(post())
    assert again.response.status_code == 201 and len(sender.sent) == 2


def test_a_write_whose_agent_left_before_its_receipt_was_committed_is_not_sent(journal):
    """Nobody waits for its answer any more, and the agent may already be retrying: it is closed as not sent."""
    from mitmproxy.connection import ConnectionState

    run, addon, sender = journal(created())
    flow = post()
    flow.client_conn.state = ConnectionState.CLOSED
    run(flow)
    assert sender.sent == []
    assert addon.store is not None
    [receipt] = addon.store.receipts.list()
    assert (receipt.state, receipt.error_code) == ("rejected", "not_sent")
    assert states(addon, receipt.operation_id) == ["planned", "submitted", "rejected"]
