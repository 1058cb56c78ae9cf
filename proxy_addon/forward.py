"""Sending a journaled write upstream exactly once, and saying precisely how it ended.

Why the addon sends journaled writes itself instead of letting mitmproxy forward them: mitmproxy has no
upstream read timeout, cannot kill a flow that waits for the upstream, and answers its own forwarding
failures with a fixed 502 page. Sending here (one attempt, never retried) gives us a per-host read timeout,
the problem+json answers of the contract, and exact classification from the client's exceptions:
an exception raised before the request could be written means nothing reached the upstream; one raised
while or after writing means the upstream may have acted. Reads (GET, HEAD, OPTIONS) stay on mitmproxy's
own path, untouched.

A pooled keep-alive connection that the upstream closed while idle would fail like "reset after send" and
produce a false outcome_unknown. httpcore checks an idle connection for EOF before reusing it, and the pool
expires idle connections after KEEPALIVE_EXPIRY, well under the idle timeouts servers commonly use.
"""

import asyncio
import ssl
import time
from dataclasses import dataclass
from enum import StrEnum

import certifi
import httpx

KEEPALIVE_EXPIRY = 2.0
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


class SendEnd(StrEnum):
    ANSWERED = "answered"
    NOT_SENT = "not_sent"
    TIMEOUT = "upstream_timeout"
    RESET = "upstream_reset"
    ERROR = "upstream_error"


@dataclass(frozen=True)
class UpstreamAnswer:
    status_code: int
    reason: str
    headers: list[tuple[bytes, bytes]]
    content: bytes


@dataclass(frozen=True)
class SendResult:
    end: SendEnd
    answer: UpstreamAnswer | None = None
    error: str | None = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class TLSSettings:
    insecure: bool = False
    ca_file: str | None = None
    ca_dir: str | None = None


def classify_exception(exc: BaseException) -> SendEnd:
    """Nothing sent, or maybe acted on: the one distinction that decides whether a retry is safe."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol):
        return SendEnd.NOT_SENT
    if isinstance(exc, httpx.LocalProtocolError | httpx.InvalidURL):
        return SendEnd.NOT_SENT
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return SendEnd.TIMEOUT
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return SendEnd.RESET
    return SendEnd.ERROR


class UpstreamSender:
    def __init__(self, tls: TLSSettings, max_connections: int = 200):
        self._client = httpx.AsyncClient(
            verify=_ssl_context(tls),
            http1=True,
            http2=False,
            trust_env=False,  # never route our own sends through HTTP(S)_PROXY, which may point at us
            follow_redirects=False,
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY,
            ),
        )

    async def send_once(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        connect_timeout: float,
        read_timeout: float,
    ) -> SendResult:
        """One attempt; the read timeout bounds the whole wait for the answer after connecting."""
        started = time.monotonic()
        timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout)
        sendable = [(k, v) for k, v in headers if k.decode("latin-1").lower() not in HOP_BY_HOP]
        try:
            async with asyncio.timeout(connect_timeout + read_timeout):
                request = self._client.build_request(method, url, headers=sendable, content=content, timeout=timeout)
                response = await self._client.send(request, stream=True)
                try:
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
                finally:
                    await response.aclose()
        except (httpx.HTTPError, TimeoutError, OSError, ssl.SSLError) as e:
            return SendResult(classify_exception(e), error=_describe(e), elapsed=time.monotonic() - started)
        answer = UpstreamAnswer(
            status_code=response.status_code,
            reason=response.reason_phrase,
            headers=[(k, v) for k, v in response.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP],
            content=body,
        )
        return SendResult(SendEnd.ANSWERED, answer, elapsed=time.monotonic() - started)

    async def aclose(self) -> None:
        await self._client.aclose()


def _ssl_context(tls: TLSSettings) -> ssl.SSLContext | bool:
    if tls.insecure:
        return False
    return ssl.create_default_context(cafile=tls.ca_file or certifi.where(), capath=tls.ca_dir)


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
