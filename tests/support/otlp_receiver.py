"""A real OTLP/HTTP trace receiver on 127.0.0.1: `POST /v1/traces`, an `ExportTraceServiceRequest` in protobuf,
decoded with opentelemetry-proto (as a collector would), each span kept flat for the tests to ask about."""

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from support.server import Served, serve, stop


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: str  # SPAN_KIND_CLIENT, ...
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id) of each linked span
    resource: dict[str, Any]
    scope: str


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def _flat(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        kind=Span.SpanKind.Name(s.kind),
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        resource=resource,
                        scope=ss.scope.name,
                    )
                )
    return spans


class OtlpReceiver(Served):
    """Start with `start()`, stop with `stop()`; `wait_for(predicate)` returns the spans received once one matches."""

    def __init__(self) -> None:
        self.server = None
        self.thread: threading.Thread | None = None
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.changed = threading.Condition()

    @property
    def endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT is set to (the exporter adds /v1/traces)."""
        return f"http://{self.netloc}"

    def start(self) -> "OtlpReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(_flat(request))
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server, self.thread = serve(Handler)
        return self

    def stop(self) -> None:
        stop(self.server, self.thread)

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self.changed:
            self.spans.extend(spans)
            self.requests += 1
            self.changed.notify_all()

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.changed:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, predicate: Any, timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans that match `predicate`, waiting (on each export received, bounded) until there is one."""
        with self.changed:
            self.changed.wait_for(lambda: any(predicate(s) for s in self.spans), timeout)
            return [s for s in self.spans if predicate(s)]
