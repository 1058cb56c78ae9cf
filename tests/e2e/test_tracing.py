"""Tracing end to end: a real `receipts proxy` process with the standard OTEL_* variables exports its spans to a
real OTLP/HTTP receiver (support/otlp_receiver.py); agents (httpx, the official MCP SDK) send their writes with
a `traceparent`. One span per journaled write, a child of the agent's span, named by the operation (or the MCP
tool), saying what became of the write and nothing secret; `receipts reconcile --once` exports one span per
verdict, linked to the write's. Without the variables nothing of OpenTelemetry is even imported.

One receiver, one proxy, one world and one MCP server for the module, on SQLite.
"""

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.asgi import AsgiServer, serve_asgi
from support.e2e import migrate, open_store, proxy_client, stop_process, tag
from support.mcp_server import TicketDesk, mcp_client
from support.otlp_receiver import OtlpReceiver, ReceivedSpan
from support.proxy import REPO, start_proxy_process
from support.reconcile import PROXY_TIMEOUT, articles_rule, outcome_unknown, search
from support.world import COMMIT_THEN_HANG, OK, World, start_world

from proxy_addon.store import ReceiptStore

SECRET_TOKEN = f"sk-live-{secrets.token_hex(12)}"
SECRET_PASSWORD = f"hunter2-{secrets.token_hex(8)}"
OTEL_NAMES = ("OTEL_",)


@dataclass
class Env:
    receiver: OtlpReceiver
    world: World
    mcp: AsgiServer
    client: httpx.Client
    proxy_url: str
    config: Path
    database_url: str
    store: ReceiptStore
    otel: dict[str, str]


def without_otel() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(OTEL_NAMES)}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("tracing")
    database_url = f"sqlite:///{tmp / 'receipts.db'}"
    migrate(database_url)
    receiver, world, mcp = OtlpReceiver().start(), start_world(), serve_asgi(TicketDesk().app())
    config = tmp / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "secret_file": str(tmp / "secret"),
                "logging": {"level": "warning", "format": "json"},
                "reconcile": {"backoff": "50ms", "per_host_rate": 1000},
                "hosts": {world.netloc: {"upstream_timeout": PROXY_TIMEOUT, "operations": [articles_rule(search())]}},
            }
        )
    )
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", "NO_PROXY": "*"}
    proc, port = start_proxy_process(
        config, database_url, tmp / "confdir", tmp / "proxy.log", env={**without_otel(), **otel}
    )
    try:
        with open_store(database_url) as store, proxy_client(f"http://127.0.0.1:{port}") as client:
            yield Env(receiver, world, mcp, client, f"http://127.0.0.1:{port}", config, database_url, store, otel)
    finally:
        stop_process(proc)
        world.stop()
        mcp.stop()
        receiver.stop()


def agent_trace() -> tuple[str, str, str]:
    """A fresh agent span: (trace id, span id, its traceparent header)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@contextmanager
def agent_span(trace_id: str, span_id: str) -> Iterator[None]:
    """The agent's span current (OpenTelemetry's API only, no SDK in this process), as an instrumented agent has it."""
    span = NonRecordingSpan(SpanContext(int(trace_id, 16), int(span_id, 16), False, TraceFlags(TraceFlags.SAMPLED)))
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        context.detach(token)


def the_span_of(env: Env, trace_id: str) -> ReceivedSpan:
    """The one span the proxy exported in this agent's trace."""
    spans = env.receiver.wait_for(lambda s: s.trace_id == trace_id)
    assert len(spans) == 1, spans
    return spans[0]


def post(env: Env, document: dict, traceparent: str, **headers: str) -> httpx.Response:
    return env.client.post(f"{env.world.base}/api/articles", json=document, headers={"traceparent": traceparent, **headers})


def assert_nothing_secret(span: ReceivedSpan) -> None:
    said = json.dumps([span.name, span.attributes, span.resource])
    assert SECRET_TOKEN not in said and SECRET_PASSWORD not in said, said


def test_a_rest_write_is_one_span_child_of_the_agents_with_nothing_secret(env: Env):
    env.world.article_mode = OK
    trace_id, parent, traceparent = agent_trace()
    document = {"title": f"traced {tag()}", "body_markdown": "hi", "password": SECRET_PASSWORD}

    r = post(env, document, traceparent, Authorization=f"Bearer {SECRET_TOKEN}")

    assert r.status_code == 201, r.text
    span = the_span_of(env, trace_id)
    assert (span.name, span.parent_span_id, span.kind) == ("receipts articles.create", parent, "SPAN_KIND_CLIENT")
    assert span.attributes == {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": env.world.port,
        "url.path": "/api/articles",
        "receipts.protocol": "rest",
        "receipts.operation": "articles.create",
        "receipts.operation_id": r.headers["X-Receipt-Id"],
        "receipts.state": "succeeded",
        "receipts.refused": False,
        "receipts.replayed": False,
        "http.response.status_code": 201,
    }
    assert span.resource["service.name"] == "receipts"
    assert_nothing_secret(span)
    (sent,) = [q for q in env.world.received("POST", "/api/articles") if q.json()["title"] == document["title"]]
    assert sent.headers["traceparent"] == traceparent  # forwarded as the agent sent it


@pytest.mark.parametrize("carried", ["header", "_meta"])
def test_an_mcp_tool_call_is_an_execute_tool_span(env: Env, carried: str):
    """The agent's trace context in a `traceparent` header, or where the MCP SDK itself puts it: `params._meta`."""
    trace_id, parent, traceparent = agent_trace()
    headers = {"traceparent": traceparent} if carried == "header" else None

    async def call() -> None:
        async with mcp_client(env.proxy_url, f"{env.mcp.base}/mcp", headers=headers) as client:
            await client.list_tools()  # passes through: no span
            await client.call_tool("create_ticket", {"title": f"ticket {tag()}"})

    if carried == "header":
        asyncio.run(call())
    else:
        with agent_span(trace_id, parent):  # the SDK injects the current span's context into each request's _meta
            asyncio.run(call())

    span = the_span_of(env, trace_id)
    assert (span.name, span.parent_span_id) == ("execute_tool create_ticket", parent)
    a = span.attributes
    assert (a["gen_ai.tool.name"], a["mcp.method.name"], a["receipts.protocol"]) == ("create_ticket", "tools/call", "mcp")
    assert (a["receipts.state"], a["http.response.status_code"], a["url.path"]) == ("succeeded", 200, "/mcp")
    assert a["receipts.operation"] == "mcp tools/call create_ticket"


def test_a_replay_and_a_refused_duplicate_say_so(env: Env):
    env.world.article_mode = OK
    done = {"title": f"replayed {tag()}", "body_markdown": "once"}
    first = post(env, done, agent_trace()[2])
    replay_trace, _, traceparent = agent_trace()
    again = post(env, done, traceparent)
    env.world.article_mode = COMMIT_THEN_HANG
    unknown = {"title": f"unknown {tag()}", "body_markdown": "maybe"}
    original = outcome_unknown(post(env, unknown, agent_trace()[2]))
    refused_trace, _, traceparent = agent_trace()
    refused = post(env, unknown, traceparent)

    assert again.headers["X-Receipt-Replayed"] == "true" and refused.status_code == 409, refused.text
    a = the_span_of(env, replay_trace).attributes
    assert (a["receipts.replayed"], a["receipts.refused"]) == (True, False)
    assert (a["receipts.operation_id"], a["receipts.state"], a["http.response.status_code"]) == (
        first.headers["X-Receipt-Id"], "succeeded", 201)
    a = the_span_of(env, refused_trace).attributes
    assert (a["receipts.replayed"], a["receipts.refused"], a["receipts.refusal_reason"]) == (False, True, "duplicate_open")
    assert (a["receipts.operation_id"], a["receipts.state"], a["http.response.status_code"]) == (original, "outcome_unknown", 409)


def test_a_reconcile_verdict_span_is_linked_to_the_write_span(env: Env):
    env.world.article_mode = COMMIT_THEN_HANG
    trace_id, _, traceparent = agent_trace()
    op = outcome_unknown(post(env, {"title": f"settled later {tag()}", "body_markdown": "x"}, traceparent))
    write = the_span_of(env, trace_id)
    assert write.attributes["receipts.state"] == "outcome_unknown"

    done = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "reconcile", "--once", "--config", str(env.config)],
        env={**without_otel(), **env.otel, "RECEIPTS_DATABASE_URL": env.database_url, "PYTHONPATH": str(REPO)},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert env.store.receipts.get(op).state == "succeeded"
    (verdict,) = env.receiver.wait_for(lambda s: s.attributes.get("receipts.operation_id") == op and s.links)
    assert verdict.links == [(trace_id, write.span_id)]
    assert (verdict.name, verdict.parent_span_id, verdict.trace_id != trace_id) == (
        "receipts reconcile articles.create", "", True)
    a = verdict.attributes
    assert (a["receipts.state"], a["receipts.reconcile.strategy"], a["receipts.reconcile.result"]) == (
        "succeeded", "search", "present")
    assert verdict.resource["service.name"] == "receipts"


OFF_SCRIPT = """
import json, sys
from pathlib import Path
import httpx
from support.proxy import start_inprocess_proxy
from proxy_addon import tracing
config, database_url, confdir, url, traceparent = sys.argv[1:]
proxy = start_inprocess_proxy(Path(config), database_url, Path(confdir))
try:
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=30) as client:
        r = client.post(url, json={"title": traceparent, "body_markdown": "off"}, headers={"traceparent": traceparent})
finally:
    proxy.stop()
print(json.dumps({"status": r.status_code, "enabled": tracing.enabled,
                  "imported": sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))}))
"""


def test_off_by_default_neither_the_sdk_nor_an_exporter_is_imported(env: Env, tmp_path: Path):
    """A whole proxy, a write through it, and no OTEL_* variable (which of them turn it off: tests/unit/test_tracing.py).
    OpenTelemetry's API alone may be there: the MCP SDK (the agent API's /mcp) imports it for its own no-op spans."""
    env.world.article_mode = OK
    trace_id, _, traceparent = agent_trace()
    done = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT, str(env.config), env.database_url, str(tmp_path / "confdir"),
         f"{env.world.base}/api/articles", traceparent],
        env={**without_otel(), "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )

    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"status": 201, "enabled": False, "imported": []}
    assert env.receiver.of_trace(trace_id) == []  # the process has ended: whatever it would have exported, it had
