"""Server-sent events (text/event-stream), as far as the proxy reads them: the messages of an MCP server's
answer to a POST. Pure."""

import json
import re
from collections.abc import Iterator
from typing import Any

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_END = re.compile(r"\r\n|\n|\r")


def is_event_stream(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "text/event-stream"


def events(body: bytes) -> Iterator[tuple[str, str]]:
    """(event type, data) of each event; comments and events without data are left out."""
    for block in _EVENT_END.split(body):
        kind, data = "message", []
        for line in _LINE_END.split(block.decode("utf-8", "replace")):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
        if data:
            yield kind, "\n".join(data)


def json_messages(body: bytes) -> list[Any]:
    """The JSON documents carried by the stream's `message` events."""
    found = []
    for kind, data in events(body):
        if kind != "message":
            continue
        try:
            found.append(json.loads(data))
        except ValueError:
            continue
    return found


def encode(document: Any) -> bytes:
    """One `message` event carrying this JSON document."""
    return b"event: message\r\ndata: " + json.dumps(document, separators=(",", ":")).encode() + b"\r\n\r\n"
