"""Server-sent events as far as the proxy reads them (protocols/sse.py): the events of a whole answer, however its
lines end, the JSON its `message` events carry, and one event written back."""

import pytest

from proxy_addon.protocols import sse


def test_server_sent_events_are_parsed_as_the_spec_frames_them():
    body = b"event: message\ndata: {\"a\":\ndata: 1}\n\n: comment\n\nevent: other\ndata: x\n\ndata: {\"b\": 2}\r\n\r\n"
    assert list(sse.events(body)) == [("message", '{"a":\n1}'), ("other", "x"), ("message", '{"b": 2}')]
    assert sse.json_messages(body) == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_the_spec_allows_frames_events(end):
    body = end.join([b"event: a", b"data: 1", b"", b"data: 2", b"data: 3", b"", b""])
    assert list(sse.events(body)) == [("a", "1"), ("message", "2\n3")]


def test_one_space_after_the_colon_is_dropped_and_no_more():
    assert list(sse.events(b"data:x\n\ndata:  y\n\n")) == [("message", "x"), ("message", " y")]


def test_comments_unknown_fields_and_events_without_data_are_left_out():
    body = b": keep-alive\n\nid: 7\nretry: 100\n\nevent: ping\n\nid: 8\ndata: kept\n\n"
    assert list(sse.events(body)) == [("message", "kept")]


def test_only_message_events_that_are_json_are_messages():
    body = b"data: {\"ok\": 1}\n\nevent: log\ndata: {\"no\": 1}\n\ndata: not json\n\ndata: [1, 2]\n\n"
    assert sse.json_messages(body) == [{"ok": 1}, [1, 2]]


def test_bytes_that_are_not_utf8_do_not_stop_the_rest():
    body = b"data: \xff\xfe\n\ndata: {\"after\": true}\n\n"
    assert list(sse.events(body)) == [("message", "\ufffd\ufffd"), ("message", '{"after": true}')]
    assert sse.json_messages(body) == [{"after": True}]


def test_an_event_written_back_reads_back_as_the_same_document():
    document = {"jsonrpc": "2.0", "id": 1, "result": {"text": "line one\nline two"}}
    encoded = sse.encode(document)
    assert encoded.startswith(b"event: message\r\ndata: ") and encoded.endswith(b"\r\n\r\n")
    assert sse.json_messages(encoded + sse.encode([1])) == [document, [1]]


@pytest.mark.parametrize(
    ("content_type", "stream"),
    [("text/event-stream", True), ("Text/Event-Stream; charset=utf-8", True), (" text/event-stream ", True),
     ("application/json", False), ("text/event-stream-x", False), ("", False), (None, False)],
)
def test_what_is_an_event_stream(content_type, stream):
    assert sse.is_event_stream(content_type) is stream
