"""An upstream for pass-through traffic: streams that wait for the client between pieces (SSE over GET, an
OpenAI-compatible chat completion streamed over POST), an upload that says when each piece arrived, and a
recorder that answers any method token (PURGE, MKCOL). A raw ASGI app, served by support.asgi."""

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from support.asgi import Gate


@dataclass
class Recorded:
    method: str
    path: str
    body: bytes


@dataclass
class StreamsApp:
    gates: dict[str, Gate] = field(default_factory=dict)
    received: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gate(self, tag: str, pieces: int) -> Gate:
        self.gates[tag] = Gate(pieces)
        return self.gates[tag]

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.received if r.method == method and r.path == path)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, method = scope["path"], scope["method"]
        parts = path.strip("/").split("/")
        if parts[0] == "upload":  # read piece by piece: each arrival is noted as it happens
            return await self._upload(self.gates[parts[1]], receive, send)
        body = await _body(receive)
        with self.lock:
            self.received.append(Recorded(method, path, body))
        if parts[0] in ("sse", "search"):  # GET /sse/{tag}; POST /search/{tag}: a read sent as POST, streamed
            return await self._stream(send, self.gates[parts[1]], lambda i: f"data: piece-{i}\n\n".encode())
        if path == "/v1/chat/completions":
            return await self._completion(send, json.loads(body))
        await _json(send, 201 if method != "GET" else 200, {"method": method, "path": path, "at": time.time()})

    async def _stream(self, send: Any, gate: Gate, piece: Any, done: bytes = b"") -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(gate.pieces):
            await send({"type": "http.response.body", "body": piece(i), "more_body": True})
            await asyncio.to_thread(gate.sent, i)
        await send({"type": "http.response.body", "body": done, "more_body": False})

    async def _completion(self, send: Any, request: dict[str, Any]) -> None:
        """`stream: true` chat completion in OpenAI's wire format; the model names the gate (`gate-<tag>`)."""
        gate = self.gates[request["model"].removeprefix("gate-")]

        def chunk(i: int) -> bytes:
            delta = {"role": "assistant", "content": f"tok{i} "} if i == 0 else {"content": f"tok{i} "}
            document = {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": request["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            return f"data: {json.dumps(document)}\n\n".encode()

        await self._stream(send, gate, chunk, b"data: [DONE]\n\n")

    async def _upload(self, gate: Gate, receive: Any, send: Any) -> None:
        pieces = 0
        while True:
            message = await receive()
            if message.get("body"):
                gate.arrived(pieces)
                pieces += 1
            if not message.get("more_body"):
                break
        await _json(send, 200, {"pieces": pieces})


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Any, status: int, document: Any) -> None:
    payload = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
