"""OpenTelemetry: one span per journaled write, one per reconcile verdict linked to it. Off unless asked for.

Asked for the standard way, by the `OTEL_*` variables: an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; OTLP over HTTP/protobuf), or `OTEL_TRACES_EXPORTER=console`. Off when
none is set, when `OTEL_SDK_DISABLED=true`, or when `OTEL_TRACES_EXPORTER=none`. The SDK reads the rest itself
(headers, timeouts, `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, whose default here is `receipts`).

Off costs nothing: the SDK is not even imported, and the hot path checks the module-level `enabled` flag only.

The write span is a child of the agent's `traceparent` (which goes upstream unchanged: the request is forwarded
byte for byte) and is current while the handler runs, so the verdict path can write its context (a W3C
`traceparent`, not a secret) into the verdict row's detail: the reconcile worker, in whatever process, links
its verdict span to it from there. No attribute holds a header, a body or a query: what they say is secret is
rules/redaction.py's, and none of it is read here.
"""

import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from proxy_addon.log import get_logger
from proxy_addon.rules.redaction import scrub_text

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from proxy_addon.protocols.facts import RequestFacts
    from proxy_addon.rules.answers import Answer
    from proxy_addon.rules.records import ReceiptRecord, TransitionRecord

log = get_logger("receipts.tracing")

enabled = False  # what the hot path checks: True only once set_up() has made a tracer
DEFAULT_SERVICE_NAME = "receipts"
TRACEPARENT = "traceparent"  # the key of a verdict row's detail that holds its write span's context
MCP_TOOL_SPAN = "execute_tool"  # OpenTelemetry's GenAI conventions name a tool call's span so
_EXPORTERS = frozenset({"otlp", "console"})
_tracer: "Tracer | None" = None
_provider: Any = None  # the SDK's TracerProvider (typed Any: the SDK is not imported while tracing is off)


def wanted(environ: Mapping[str, str]) -> list[str]:
    """The exporters these `OTEL_*` variables ask for; empty: tracing stays off (the default)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    if "none" in names:
        return []
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return [n for n in dict.fromkeys(names) if n in _EXPORTERS and (n != "otlp" or endpoint)]


def set_up(environ: Mapping[str, str] | None = None) -> bool:
    """Make the tracer if the environment asks for one (once per process until `shut_down`); whether on."""
    global enabled, _tracer, _provider
    if _provider is not None:
        return True
    exporters = wanted(os.environ if environ is None else environ)
    if not exporters:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(exporters):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider, _tracer, enabled = provider, provider.get_tracer("receipts"), True
    log.info("tracing_on", exporters=exporters, service=resource.attributes.get(SERVICE_NAME))
    return True


def _exporters(names: Sequence[str]) -> list[Any]:
    exporters: list[Any] = []
    if "otlp" in names:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter())  # endpoint, headers, timeout, compression: from OTEL_EXPORTER_OTLP_*
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporters.append(ConsoleSpanExporter())
    return exporters


def shut_down() -> None:
    """Export what is still queued, then stop: at the proxy's `done` and at the end of `reconcile --once`."""
    global enabled, _tracer, _provider
    if _provider is None:
        return
    provider, _provider, _tracer, enabled = _provider, None, None, False
    provider.shutdown()  # flushes every BatchSpanProcessor first


class WriteOutcome(Protocol):
    """What became of a write, as the span tells it (request/handled.py's Handled): the answer the agent got (None:
    forwarded without a receipt) and the handler's note (operation_id, state, refused, approval_id, fail_open)."""

    @property
    def answer(self) -> "Answer | None": ...

    @property
    def note(self) -> dict[str, Any]: ...


# -- the write span -------------------------------------------------------------------------------------------


async def traced_write[Outcome: WriteOutcome](
    facts: "RequestFacts", handle: Callable[["RequestFacts"], Awaitable[Outcome]]
) -> Outcome:
    """`handle(facts)` inside the write's span, a child of the agent's `traceparent`, current while it runs."""
    from opentelemetry import context, trace

    assert _tracer is not None
    span = _tracer.start_span(
        _write_name(facts, None),
        context=_agent_context(facts),
        kind=trace.SpanKind.CLIENT,
        attributes=_request_attributes(facts),
    )
    token = context.attach(trace.set_span_in_context(span))
    try:
        outcome = await handle(facts)
        span.set_attributes(_outcome_attributes(outcome))
        return outcome
    except BaseException as e:
        span.record_exception(e)
        span.set_status(trace.StatusCode.ERROR, type(e).__name__)
        raise
    finally:
        context.detach(token)
        span.end()


def name_write(facts: "RequestFacts", operation: str) -> None:
    """Name the current write span by its operation, once the handler knows it (from the request's rule)."""
    from opentelemetry import trace

    span = trace.get_current_span()
    span.update_name(_write_name(facts, operation))
    span.set_attribute("receipts.operation", scrub_text(operation))


def write_traceparent() -> str | None:
    """The current write span's context as a W3C `traceparent`, for the verdict row's detail; None outside one."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)  # the current span's; nothing when there is none
    return carrier.get(TRACEPARENT)


def _write_name(facts: "RequestFacts", operation: str | None) -> str:
    tool = getattr(facts.call, "tool", None)
    if tool:
        return f"{MCP_TOOL_SPAN} {tool}"
    return f"receipts {scrub_text(operation) if operation else facts.method}"


def _agent_context(facts: "RequestFacts") -> Any:
    """The agent's trace context: its `traceparent` (and `tracestate`) header, else what its protocol carries
    (an MCP call's `params._meta`); None: a root span."""
    carrier: dict[str, str] = {}
    for name, value in facts.headers:
        lower = name.lower()
        if lower in ("traceparent", "tracestate") and lower not in carrier:
            carrier[lower] = value
    if "traceparent" not in carrier:
        carrier = dict(getattr(facts.call, "trace_context", ()))
    if "traceparent" not in carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def _request_attributes(facts: "RequestFacts") -> dict[str, Any]:
    """What the span says of the request: its method and target, never a header, the query or the body."""
    attributes: dict[str, Any] = {
        "http.request.method": facts.method,
        "server.address": facts.host,
        "server.port": facts.port,
        "url.path": scrub_text(facts.path),
        "receipts.protocol": facts.call.protocol,
    }
    if facts.agent is not None:  # its name (agents/identity.py), never its token
        attributes["gen_ai.agent.name"] = facts.agent
    tool = getattr(facts.call, "tool", None)
    if tool:
        attributes.update({"gen_ai.operation.name": MCP_TOOL_SPAN, "gen_ai.tool.name": tool, "mcp.method.name": "tools/call"})
    return attributes


def _outcome_attributes(outcome: WriteOutcome) -> dict[str, Any]:
    """What became of it: the receipt, its state, whether refused or replayed, and the status the agent got."""
    note = outcome.note
    reason = note.get("refused")
    replayed = reason == "duplicate_succeeded_replay"
    attributes: dict[str, Any] = {"receipts.refused": bool(reason) and not replayed, "receipts.replayed": replayed}
    if reason and not replayed:
        attributes["receipts.refusal_reason"] = reason
    for key in ("operation_id", "state"):
        if note.get(key) is not None:
            attributes[f"receipts.{key}"] = note[key]
    # `receipts.approval_id`: the approval a write is held for (the handler's note names it with the 403)
    if note.get("approval_id") is not None:
        attributes["receipts.approval_id"] = note["approval_id"]
    if note.get("fail_open"):
        attributes["receipts.fail_open"] = True
    if outcome.answer is not None:
        attributes["http.response.status_code"] = outcome.answer.status
    return attributes


# -- the verdict span -----------------------------------------------------------------------------------------


@contextmanager
def verdict_span(receipt: "ReceiptRecord", history: Sequence["TransitionRecord"], worker: str) -> Iterator["Span"]:
    """The span of one reconcile verdict, linked to the write span whose context the verdict row kept."""
    from opentelemetry import trace
    from opentelemetry.context import Context

    assert _tracer is not None
    links = [trace.Link(c) for c in (_span_context(t.detail.get(TRACEPARENT)) for t in history) if c is not None]
    attributes: dict[str, Any] = {
        "receipts.operation_id": receipt.operation_id,
        "receipts.operation": scrub_text(receipt.operation),
        "receipts.worker": worker,
        "http.request.method": receipt.method,
        "server.address": receipt.host,
        "server.port": receipt.port,
        "url.path": scrub_text(receipt.path),
    }
    if receipt.agent is not None:  # the agent whose write it settles
        attributes["gen_ai.agent.name"] = receipt.agent
    name = f"receipts reconcile {scrub_text(receipt.operation)}"
    root = Context()  # a trace of its own: it happens long after the agent's, which its link leads to
    kind = trace.SpanKind.INTERNAL
    with _tracer.start_as_current_span(name, context=root, kind=kind, attributes=attributes, links=links) as span:
        yield span


def end_verdict(span: "Span", state: str, detail: Mapping[str, Any]) -> None:
    """What the verdict said: its state, and how the read went (strategy, result), never what was read."""
    span.set_attribute("receipts.state", state)
    for key in ("strategy", "result"):
        if isinstance(detail.get(key), str):
            span.set_attribute(f"receipts.reconcile.{key}", detail[key])


def _span_context(traceparent: Any) -> Any:
    """The span context a stored `traceparent` names; None if it names none."""
    if not isinstance(traceparent, str):
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None
