"""The log (log.py): JSON lines, or a console when the stream is a terminal, at the level configured, each line
with its level, UTC time and the request's bound context, and no secret in any value. The configuration is
global: each test puts back the one it found."""

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from proxy_addon.log import configure_logging, get_logger, scrub_standard_logging


@pytest.fixture(autouse=True)
def kept_configuration() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_has_the_event_its_level_utc_time_and_fields():
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    get_logger("receipts.test").info("receipt_succeeded", status=201, external_id="ch_1")
    [line] = lines(stream)
    assert (line["event"], line["level"], line["status"], line["external_id"]) == ("receipt_succeeded", "info", 201, "ch_1")
    assert line["timestamp"].endswith("Z")


def test_lines_below_the_level_are_dropped():
    stream = io.StringIO()
    configure_logging("warning", "json", stream)
    log = get_logger("receipts.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [line["event"] for line in lines(stream)] == ["w", "e"]


def test_the_requests_bound_context_is_on_each_of_its_lines():
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    with structlog.contextvars.bound_contextvars(operation_id="op_7"):
        get_logger("receipts.test").info("inside")
    get_logger("receipts.test").info("outside")
    inside, outside = lines(stream)
    assert inside["operation_id"] == "op_7" and "operation_id" not in outside


def test_auto_is_a_console_on_a_terminal_and_json_elsewhere():
    terminal = Terminal()
    configure_logging("info", "auto", terminal)
    get_logger("receipts.test").info("hello", n=1)
    text = terminal.getvalue()
    assert "hello" in text and "n=1" in text and not text.startswith("{")
    piped = io.StringIO()
    configure_logging("info", "auto", piped)
    get_logger("receipts.test").info("hello", n=1)
    assert lines(piped)[0]["n"] == 1


def test_a_secret_in_any_text_value_is_scrubbed_and_other_values_kept():
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    get_logger("receipts.test").error("upstream_failed", url="https://u:pw-91f@h/x?api_key=k-91f", attempts=3, ok=False)
    [line] = lines(stream)
    assert "91f" not in stream.getvalue() and (line["attempts"], line["ok"]) == (3, False)


def test_pythons_logging_is_scrubbed_too(caplog):
    scrub_standard_logging()
    scrub_standard_logging()  # once is enough: a second call wraps nothing again
    with caplog.at_level(logging.INFO):
        logging.getLogger("mitmproxy.test").info("Bad HTTP request line: %r", b"GET http://u:pw-4c1@h/ HTTP/1.1")
        logging.getLogger("mitmproxy.test").info("plain %s", "words")
    assert "pw-4c1" not in caplog.text and "Bad HTTP request line" in caplog.text
    assert (caplog.records[-1].msg, caplog.records[-1].args) == ("plain %s", ("words",))  # nothing to scrub: as it was
