"""The upstream sender against raw asyncio servers on loopback: one attempt, and exactly how it ended."""

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from support.server import free_port

from proxy_addon.request.sender import SendEnd, SendResult, Timeouts, TLSSettings, UpstreamSender

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ANSWER = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{\"id\": 1}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


def send(serve: Serve | None, read_timeout: float = 5.0, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[SendResult, list[bytes]]:
    """One send to a server running `serve` (None: nothing listens); returns the result and what the server read."""
    seen: list[bytes] = []

    async def main() -> SendResult:
        port = free_port()
        server = None
        if serve is not None:

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                seen.append(await read_request(reader))
                await serve(reader, writer)

            server = await asyncio.start_server(handle, "127.0.0.1", port)
        sender = UpstreamSender(TLSSettings())
        try:
            return await sender.send_once(
                "POST", f"http://127.0.0.1:{port}/things", headers or [(b"content-type", b"application/json")], b'{"a": 1}',
                Timeouts(connect=2.0, idle=read_timeout),
            )
        finally:
            await sender.aclose()
            if server is not None:
                server.close()

    return asyncio.run(main()), seen


async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(ANSWER)
    await writer.drain()
    writer.close()


async def close_without_answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def never_answer(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    await reader.read()  # until the client gives up


async def garbage(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()
    writer.close()


def test_an_answer_is_read_whole_and_the_request_sent_once():
    result, seen = send(answer)
    assert result.end == SendEnd.ANSWERED and result.answer is not None
    assert (result.answer.status_code, result.answer.content) == (201, b'{"id": 1}')
    assert len(seen) == 1 and seen[0].endswith(b'{"a": 1}') and b"content-length: 8" in seen[0].lower()


@pytest.mark.parametrize(
    ("serve", "end"),
    [(None, SendEnd.NOT_SENT), (close_without_answer, SendEnd.RESET), (garbage, SendEnd.RESET)],
    ids=["nothing-listens", "closed-after-reading", "not-http"],
)
def test_how_a_send_that_got_no_answer_ended(serve, end):
    result, seen = send(serve)
    assert result.end == end and result.answer is None and result.error
    assert len(seen) == (0 if serve is None else 1)


def test_no_answer_within_the_idle_timeout_is_a_timeout_after_the_request_was_written():
    result, seen = send(never_answer, read_timeout=0.2)
    assert result.end == SendEnd.TIMEOUT and "upstream_timeout" in (result.error or "")
    assert len(seen) == 1


def test_a_header_h11_refuses_is_never_sent():
    result, seen = send(answer, headers=[(b"x-bad", b"line\r\nbreak")])
    assert result.end == SendEnd.NOT_SENT and seen == []
