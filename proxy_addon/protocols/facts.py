"""What the addon read off a request, as the handler and the protocols (protocols/) take it: plain data."""

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from proxy_addon.protocols.base import Call
from proxy_addon.protocols.rest import REST


@dataclass(frozen=True)
class RequestFacts:
    """What the addon read off a request: decoded for identity (`headers`, `body`), raw for sending it on."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # without the query
    query: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    content_type: str | None
    body: bytes  # decoded (Content-Encoding undone)
    url: str = ""
    raw_headers: tuple[tuple[bytes, bytes], ...] = ()
    raw_body: bytes = b""  # as the client sent it
    client_gone: Callable[[], bool] = lambda: False  # whether the client has left (it no longer waits for an answer)
    call: Call = REST  # how its protocol reads it (protocols/): identity, operation name, answers
    agent: str | None = None  # who sent it (agents/identity.py, agent_of); None: an anonymous agent


def split_query(raw_path: str) -> tuple[str, list[tuple[str, str]]]:
    path, _, query = raw_path.partition("?")
    return path or "/", parse_qsl(query, keep_blank_values=True)
