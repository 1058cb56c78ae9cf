"""The handler's in-process harness (tests/unit/conftest.py's `journal` fixture): a scripted sender standing in
for the upstream, and the flows and results the handler tests send."""

from typing import Any

from mitmproxy.test import tflow, tutils

from proxy_addon.addons.receipts import Receipts
from proxy_addon.request.sender import SendEnd, SendResult, UpstreamResponse


class FakeSender:
    """Answers each send with the next scripted result, and remembers what it was asked to send."""

    def __init__(self, *results: SendResult):
        self.results = list(results)
        self.sent: list[tuple[str, str, bytes]] = []
        self.headers: list[dict[bytes, bytes]] = []

    async def send_once(self, method: str, url: str, headers: Any, content: bytes, timeouts: Any, may_send: Any = None) -> SendResult:
        if may_send is not None and not may_send():  # UpstreamSender's last look before the first byte
            return SendResult(SendEnd.NOT_SENT, error="not sent: withheld at the last look")
        self.sent.append((method, url, content))
        self.headers.append({k.lower(): v for k, v in headers})
        return self.results.pop(0)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def created(body: bytes = b'{"id": 7}', status: int = 201) -> SendResult:
    return SendResult(SendEnd.ANSWERED, UpstreamResponse(status, "Created", [(b"content-type", b"application/json")], body))


def post(body: bytes = b'{"title": "hello"}', method: bytes = b"POST", path: bytes = b"/api/articles") -> Any:
    req = tutils.treq(method=method, host="api.example.com", port=443, scheme=b"https", path=path, content=body,
                      headers=((b"host", b"api.example.com"), (b"content-type", b"application/json")))
    return tflow.tflow(req=req)


def states(addon: Receipts, operation_id: str) -> list[str]:
    assert addon.store is not None
    return [t.to_state for t in addon.store.receipts.history(operation_id)]
