"""A small upstream of three APIs' shapes, for their official SDKs (stripe-python, slack_sdk, PyGithub):
`POST /v1/charges` (form-encoded, as Stripe), `POST /api/chat.postMessage` (as Slack's Web API) and
`POST /repos/{owner}/{repo}/issues` (as GitHub's REST API). Each write acts (it is recorded as an effect) every
time it arrives, idempotency keys or not: the effects are what a retry costs when nothing holds it.
"""

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.server import Served, send_json, serve, stop

ISSUES = re.compile(r"^/repos/([^/]+)/([^/]+)/issues$")


@dataclass
class SdkUpstream(Served):
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    effects: list[tuple[str, bytes, dict]] = field(default_factory=list)  # path, body, headers (lower-case)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def start(self) -> "SdkUpstream":
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                with upstream.lock:
                    n = next(upstream._ids)
                    upstream.effects.append((path, body, {k.lower(): v for k, v in self.headers.items()}))
                text = body.decode("utf-8", "replace")
                if path == "/v1/charges":
                    send_json(self, 200, {"id": f"ch_{n}", "object": "charge", "amount": 100, "currency": "usd",
                                          "description": text, "livemode": False})
                elif path == "/api/chat.postMessage":
                    sent = json.loads(body) if body.startswith(b"{") else {}
                    send_json(self, 200, {"ok": True, "channel": sent.get("channel", "C1"), "ts": f"{n}.000100",
                                          "message": {"type": "message", "text": sent.get("text", "")}})
                elif m := ISSUES.match(path):
                    sent = json.loads(body)
                    url = f"{upstream.base}/repos/{m[1]}/{m[2]}/issues/{n}"
                    send_json(self, 201, {"id": n, "number": n, "title": sent.get("title"), "body": sent.get("body"),
                                          "state": "open", "url": url, "html_url": url})
                else:
                    send_json(self, 404, {"message": "Not Found"})

        self.server, self.thread = serve(Handler)
        return self

    def stop(self) -> None:
        stop(self.server, self.thread)

    def count(self, needle: str) -> int:
        """Effects whose body holds `needle`."""
        with self.lock:
            return sum(1 for _, body, _ in self.effects if needle.encode() in body)

    def headers_of(self, needle: str) -> list[dict]:
        with self.lock:
            return [h for _, body, h in self.effects if needle.encode() in body]
