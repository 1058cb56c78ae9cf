"""A small real JSON API on 127.0.0.1 that models the hard cases of reconciliation, and records every request.

Resources live in memory; switches on the `World` decide, per test, how writes end:
- articles: `POST /api/articles` stores `{id, title, body_markdown, created_at}` (a client-chosen `id` in the
  body is kept); `article_mode` is `ok`, `commit_then_hang` (stored, then no answer until long after the
  proxy gave up) or `hang_without_store` (never stored, no answer); `visible_after` seconds makes a stored
  article invisible to reads for that long (eventual consistency).
  `GET /api/articles?per_page=30[&page=N]` -> `{"items": [...], "next": "/api/articles?..."}`, newest first (the
  `next` link is relative, or starts with `next_link_base`); `GET /api/articles/{id}` -> it or 404;
  `DELETE /api/articles/{id}` by `delete_mode`: `ok`, `delete_then_hang`, `hang_without_delete`.
- refunds: `POST /api/charges/{charge_id}/refunds {amount}` by `refund_mode` (ok | commit_then_hang);
  `GET /api/refunds?charge=ID` -> `{"items": [{id, charge_id, amount, created_at}]}`.
- payments: `POST /api/payments` honours `Idempotency-Key`: the first call with a key stores the payment and
  its answer (with `payment_mode: commit_then_hang`, then hangs); a re-send with the same key gets the stored
  answer with 200 and never creates a second payment.
- `POST /api/hang/...`: never answers, stores nothing.
- `fail_reads(n)`: the next n GETs answer 500, `failing_paths` every GET whose path holds that text. `read_delay`:
  seconds every GET waits before answering.
Every hang waits on one event that `stop()` sets, so no handler thread outlives its test for long.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from support.server import Served, send_json, serve, stop

OK = "ok"
COMMIT_THEN_HANG = "commit_then_hang"
HANG_WITHOUT_STORE = "hang_without_store"
DELETE_THEN_HANG = "delete_then_hang"
HANG_WITHOUT_DELETE = "hang_without_delete"
MAX_HANG_SECONDS = 10.0


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names; see header_list for repeated ones
    header_list: list[tuple[str, str]]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class World(Served):
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)
    requests: list[Request] = field(default_factory=list)
    articles: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> record, with private _visible_at
    refunds: list[dict[str, Any]] = field(default_factory=list)
    payments: list[dict[str, Any]] = field(default_factory=list)
    payment_answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # Idempotency-Key -> stored answer
    # switches
    article_mode: str = OK
    visible_after: float = 0.0
    delete_mode: str = OK
    refund_mode: str = OK
    payment_mode: str = OK
    read_delay: float = 0.0
    next_link_base: str = ""
    hang_seconds: float = 5.0
    failing_reads: int = 0
    failing_paths: str | None = None  # reads whose path holds this text answer 500, however many
    settled_writes: int = 0  # writes the world has done with (stored or not, answered or now hanging)
    settled: threading.Condition = field(default_factory=threading.Condition)
    _next_id: int = 100

    # -- lifecycle ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.released.set()
        stop(self.server, self.thread)

    # -- switches and seeding -------------------------------------------------------------------------------

    def note_settled(self) -> None:
        with self.settled:
            self.settled_writes += 1
            self.settled.notify_all()

    def wait_settled(self, count: int, timeout: float = 10.0) -> bool:
        """Until `count` writes have been done with (stored or not), or `timeout`."""
        with self.settled:
            return self.settled.wait_for(lambda: self.settled_writes >= count, timeout)

    def fail_reads(self, n: int) -> None:
        with self.lock:
            self.failing_reads = n

    def new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    def add_article(self, title: str, body_markdown: str, article_id: str | None = None, visible_after: float = 0.0) -> str:
        record_id = article_id or str(self.new_id())
        record = {"id": record_id, "title": title, "body_markdown": body_markdown, "created_at": _now_iso()}
        with self.lock:
            self.articles[record_id] = {**record, "_visible_at": time.monotonic() + visible_after}
        return record_id

    def add_refund(self, charge_id: str, amount: Any) -> str:
        record = {"id": f"re_{self.new_id()}", "charge_id": charge_id, "amount": amount, "created_at": _now_iso()}
        with self.lock:
            self.refunds.append(record)
        return record["id"]

    # -- what happened --------------------------------------------------------------------------------------

    def received(self, method: str | None = None, path: str | None = None, prefix: str | None = None) -> list[Request]:
        with self.lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method)
                and (path is None or r.path == path)
                and (prefix is None or r.path.startswith(prefix))
            ]

    def article(self, record_id: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.articles.get(record_id)
        return _public(record) if record else None

    def show(self, record_id: str) -> None:
        """Reads show this article from now on (an eventually consistent store catching up)."""
        with self.lock:
            self.articles[record_id]["_visible_at"] = time.monotonic()

    def visible_at(self, record_id: str) -> float:
        """When (time.monotonic) reads begin to show this article."""
        with self.lock:
            return self.articles[record_id]["_visible_at"]

    def article_ids_titled(self, title: str) -> list[str]:
        with self.lock:
            return [a["id"] for a in self.articles.values() if a["title"] == title]

    def refunds_of(self, charge_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.refunds if r["charge_id"] == charge_id]


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("_")}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    world: World

    def log_message(self, *args: Any) -> None:
        pass

    # -- plumbing -------------------------------------------------------------------------------------------

    def _handle(self) -> None:
        self.settled_noted = False
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = Request(
            self.command,
            url.path,
            parse_qs(url.query),
            {k.lower(): v for k, v in self.headers.items()},
            [(k.lower(), v) for k, v in self.headers.items()],
            body,
            time.monotonic(),
        )
        w = self.world
        with w.lock:
            w.requests.append(request)
        parts = [p for p in url.path.split("/") if p]
        if self.command == "GET":
            return self._read(request, parts)
        try:
            document = json.loads(body) if body else {}
        except ValueError:
            return self._send(400, {"error": "body is not JSON"})
        route = (self.command, *parts[:2])
        if parts[:1] == ["api"] and len(parts) >= 2 and parts[1] == "hang":
            return self._hang(None)
        if route == ("POST", "api", "articles") and len(parts) == 2:
            return self._create_article(document)
        if route == ("DELETE", "api", "articles") and len(parts) == 3:
            return self._delete_article(parts[2])
        if route == ("POST", "api", "charges") and len(parts) == 4 and parts[3] == "refunds":
            return self._create_refund(parts[2], document)
        if route == ("POST", "api", "payments") and len(parts) == 2:
            return self._create_payment(request, document)
        self._send(404, {"error": "no such route"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _settle(self) -> None:
        """Tell the world this write is done with (once per request; reads are not writes)."""
        if self.command != "GET" and not self.settled_noted:
            self.settled_noted = True
            self.world.note_settled()

    def _send(self, status: int, document: Any) -> None:
        self._settle()
        send_json(self, status, document)

    def _hang(self, then: tuple[int, Any] | None) -> None:
        """No answer until long after the proxy's timeout (or until the world stops); then maybe answer late."""
        self._settle()
        self.world.released.wait(min(self.world.hang_seconds, MAX_HANG_SECONDS))
        self.close_connection = True
        if then is not None:
            self._send(*then)

    # -- reads ----------------------------------------------------------------------------------------------

    def _read(self, request: Request, parts: list[str]) -> None:
        w = self.world
        if w.read_delay:
            time.sleep(w.read_delay)
        with w.lock:
            failing = w.failing_reads > 0
            if failing:
                w.failing_reads -= 1
            failing = failing or (w.failing_paths is not None and w.failing_paths in request.path)
        if failing:
            return self._send(500, {"error": "read replica unavailable"})
        now = time.monotonic()
        if parts == ["api", "articles"]:
            per_page = int(request.query.get("per_page", ["30"])[0])
            page = int(request.query.get("page", ["1"])[0])
            with w.lock:
                visible = [_public(a) for a in w.articles.values() if a["_visible_at"] <= now]
            visible.sort(key=lambda a: a["created_at"], reverse=True)
            document: dict[str, Any] = {"items": visible[(page - 1) * per_page : page * per_page]}
            if len(visible) > page * per_page:
                document["next"] = f"{w.next_link_base}/api/articles?per_page={per_page}&page={page + 1}"
            return self._send(200, document)
        if len(parts) == 3 and parts[:2] == ["api", "articles"]:
            with w.lock:
                record = w.articles.get(parts[2])
            if record is None or record["_visible_at"] > now:
                return self._send(404, {"error": "not found"})
            return self._send(200, _public(record))
        if parts == ["api", "refunds"]:
            charge = request.query.get("charge", [None])[0]
            with w.lock:
                items = [dict(r) for r in w.refunds if charge is None or r["charge_id"] == charge]
            return self._send(200, {"items": items})
        if len(parts) == 3 and parts[:2] == ["api", "payments"]:
            with w.lock:
                found = [p for p in w.payments if p["id"] == parts[2]]
            return self._send(200, found[0]) if found else self._send(404, {"error": "not found"})
        self._send(404, {"error": "no such route"})

    # -- writes ---------------------------------------------------------------------------------------------

    def _create_article(self, document: dict[str, Any]) -> None:
        w = self.world
        mode = w.article_mode
        if mode == HANG_WITHOUT_STORE:
            return self._hang(None)
        record_id = w.add_article(
            str(document.get("title")), str(document.get("body_markdown")), document.get("id"), w.visible_after
        )
        answer = (201, w.article(record_id))
        if mode == COMMIT_THEN_HANG:
            return self._hang(answer)
        self._send(*answer)

    def _delete_article(self, record_id: str) -> None:
        w = self.world
        mode = w.delete_mode
        if mode == HANG_WITHOUT_DELETE:
            return self._hang(None)
        with w.lock:
            existed = w.articles.pop(record_id, None) is not None
        answer = (204 if existed else 404, {} if existed else {"error": "not found"})
        if mode == DELETE_THEN_HANG:
            return self._hang(answer)
        self._send(*answer)

    def _create_refund(self, charge_id: str, document: dict[str, Any]) -> None:
        w = self.world
        record_id = w.add_refund(charge_id, document.get("amount"))
        answer = (201, next(r for r in w.refunds_of(charge_id) if r["id"] == record_id))
        if w.refund_mode == COMMIT_THEN_HANG:
            return self._hang(answer)
        self._send(*answer)

    def _create_payment(self, request: Request, document: dict[str, Any]) -> None:
        w = self.world
        key = request.headers.get("idempotency-key")
        with w.lock:
            stored = w.payment_answers.get(key) if key else None
            if stored is None:
                w._next_id += 1
                payment = {"id": f"pay_{w._next_id}", "amount": document.get("amount"), "idempotency_key": key}
                w.payments.append(payment)
                if key:
                    w.payment_answers[key] = payment
        if stored is not None:
            return self._send(200, stored)  # the same key again: the stored result, nothing new
        if w.payment_mode == COMMIT_THEN_HANG:
            return self._hang((201, payment))
        self._send(201, payment)


def start_world() -> World:
    world = World()
    handler = type("WorldHandler", (_Handler,), {"world": world})
    world.server, world.thread = serve(handler)
    return world
