"""Two `receipts proxy` replicas on one PostgreSQL, replica X's journal writer paused (SIGSTOP) while a write is
at the upstream: what one replica answered, the other must not contradict.

PATCH A via X (200, succeeded). PATCH B via X: the upstream answers 409 while X's writer is stopped. A rejected
write ends no window, so PATCH A again via Y must be replayed from A's receipt, and the upstream sees A once.
That holds only if B's verdict is in the journal when the agent hears B's 409: a `rejected` verdict commits before
its answer (request/recording.py). Before, the agent heard 409 at once, B's receipt stayed `submitted` (a write
that may have happened ends A's window), and Y forwarded A a second time.
"""

import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler

from support.e2e import open_store, proxy_client, stop_process, wait_for
from support.pg import fresh_database
from support.proxy import start_proxy_process, writer_pid
from support.server import send_json, serve, stop

from tests.conftest import migrate

HELD = 1.5  # how long the test waits for B's answer while X's writer is stopped (it must not come)


class Document:
    """An upstream holding one document: PATCH /doc/1 applies `{"v": ...}`, or, for "B", answers 409 once let."""

    def __init__(self) -> None:
        self.patches: list[str] = []
        self.b_arrived, self.b_answers = threading.Event(), threading.Event()
        doc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                doc.patches.append(body["v"])
                if body["v"] == "B":
                    doc.b_arrived.set()
                    doc.b_answers.wait(30)
                    send_json(self, 409, {"error": "version conflict"})
                    return
                send_json(self, 200, {"id": "1", "v": body["v"]})

        self.server, self.thread = serve(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/doc/1"

    def stop(self) -> None:
        self.b_answers.set()
        stop(self.server, self.thread)


def test_a_rejected_patch_whose_verdict_is_held_does_not_let_a_repeat_of_the_earlier_patch_through_another_replica(pg_server, tmp_path):
    upstream = Document()
    x = y = None
    writer = None
    with fresh_database(pg_server, prefix="receipts_truth") as pg_url:
        migrate(pg_url)
        config = tmp_path / "config.yaml"
        config.write_text(f"secret_file: {tmp_path / 'secret'}\nlogging: {{level: info, format: json}}\n")
        try:
            x, x_port = start_proxy_process(config, pg_url, tmp_path / "confdir", tmp_path / "x.log")
            y, y_port = start_proxy_process(config, pg_url, tmp_path / "confdir", tmp_path / "y.log")
            via_x, via_y = proxy_client(f"http://127.0.0.1:{x_port}"), proxy_client(f"http://127.0.0.1:{y_port}")
            a = via_x.patch(upstream.url, json={"v": "A"})
            assert (a.status_code, a.headers["X-Receipt-State"]) == (200, "succeeded")
            with open_store(pg_url) as store:
                assert wait_for(lambda: store.receipts.get(a.headers["X-Receipt-Id"]).state == "succeeded", 20, 0.02)

            answers: list = []
            b_thread = threading.Thread(target=lambda: answers.append(via_x.patch(upstream.url, json={"v": "B"})), daemon=True)
            b_thread.start()
            assert upstream.b_arrived.wait(20), "B did not reach the upstream"  # its receipt is committed
            writer = writer_pid(x.pid)
            assert writer is not None
            os.kill(writer, signal.SIGSTOP)
            upstream.b_answers.set()
            b_thread.join(HELD)  # a 409 heard now, while B's verdict cannot commit, is the hole
            if not answers:
                os.kill(writer, signal.SIGCONT)
                b_thread.join(20)
            [b] = answers
            assert (b.status_code, b.headers["X-Receipt-State"]) == (409, "rejected")

            again = via_y.patch(upstream.url, json={"v": "A"})
            assert again.headers.get("X-Receipt-Replayed") == "true", (again.status_code, again.headers)
            assert again.headers["X-Receipt-Id"] == a.headers["X-Receipt-Id"]
            assert upstream.patches == ["A", "B"], upstream.patches  # A once
        finally:
            if writer is not None:
                os.kill(writer, signal.SIGCONT)
            for proc in (x, y):
                if proc is not None:
                    stop_process(proc)
            upstream.stop()
