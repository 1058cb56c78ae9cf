"""Which OTEL_* settings turn tracing on (off by default), and what a write span says of a handled request."""

import pytest

from proxy_addon import tracing
from proxy_addon.request.handler import Handled
from proxy_addon.rules.answers import answer

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, []),  # off by default
        ({"OTEL_SERVICE_NAME": "agents"}, []),  # other variables alone: still off
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp,none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, []),  # otlp, but no endpoint named
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "zipkin"}, []),  # not one of ours
    ],
)
def test_which_settings_turn_tracing_on(environ, exporters):
    assert tracing.wanted(environ) == exporters


def test_set_up_with_nothing_set_stays_off():
    assert tracing.set_up({}) is False and tracing.enabled is False


OK = answer(201, b"{}", {})


@pytest.mark.parametrize(
    ("note", "said"),
    [
        ({"operation_id": "op", "state": "succeeded"},
         {"receipts.operation_id": "op", "receipts.state": "succeeded", "receipts.refused": False, "receipts.replayed": False}),
        ({"operation_id": "op", "state": "succeeded", "refused": "duplicate_succeeded_replay"},
         {"receipts.operation_id": "op", "receipts.state": "succeeded", "receipts.refused": False, "receipts.replayed": True}),
        ({"operation_id": "op", "state": "outcome_unknown", "refused": "duplicate_open"},
         {"receipts.operation_id": "op", "receipts.state": "outcome_unknown", "receipts.refused": True,
          "receipts.replayed": False, "receipts.refusal_reason": "duplicate_open"}),
        ({"operation_id": "op", "state": "succeeded", "approval_id": "ap-1"},  # once writes go out under approvals
         {"receipts.operation_id": "op", "receipts.state": "succeeded", "receipts.refused": False,
          "receipts.replayed": False, "receipts.approval_id": "ap-1"}),
    ],
)
def test_what_a_write_span_says_of_the_outcome(note, said):
    assert tracing._outcome_attributes(Handled(OK, note)) == {**said, "http.response.status_code": 201}


def test_a_write_forwarded_without_a_receipt_says_so():
    attributes = tracing._outcome_attributes(Handled(None, {"fail_open": True}))
    assert attributes == {"receipts.refused": False, "receipts.replayed": False, "receipts.fail_open": True}
