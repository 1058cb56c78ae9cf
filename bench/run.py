"""The receipts benchmark: what journaling costs, side by side with plain mitmproxy and no proxy at all.

One command (loopback only; every process it starts is stopped in a finally block):

    .venv/bin/python bench/run.py [--requests 3000] [--concurrency 1,32] [--growth 0,100000,1000000]
                                  [--targets direct,mitmdump,sqlite,postgres] [--profile 15] [--out bench/results]
    .venv/bin/python bench/run.py --smoke --out /tmp/x      # tiny: 200 requests, c=1,8, SQLite + mitmdump

It starts a raw-asyncio HTTP/1.1 keep-alive upstream (bench/upstream.py, its own process), then drives the
same bounded load of POSTs with small unique JSON bodies with a raw-asyncio keep-alive client
(bench/loadgen.py, its own process) at each concurrency level against
  (a) direct     the upstream itself,
  (b) mitmdump   plain `mitmdump` with no addon,
  (c) sqlite     `receipts proxy` on a fresh, migrated SQLite file (WAL, synchronous=FULL),
  (d) postgres   `receipts proxy` on a fresh, migrated PostgreSQL database.
Each level is preceded by an unmeasured warm-up. For the proxies it samples the process's RSS and peak
RSS (/proc/PID/status VmRSS, VmHWM) and CPU time (/proc/PID/stat). After each level on (c) and (d) it checks
in the database that exactly N receipts with that level's path prefix exist, all `succeeded`, with 3N
transitions. The growth scenario (--growth) repeats (c) and (d) with that many synthetic terminal receipts
(and their transitions) bulk-inserted first. --profile S records the receipts proxy on SQLite with py-spy for
S seconds under concurrency-32 load and summarises where the time goes.

Writes OUT/results.json, OUT/chart.png (not in --smoke), OUT/logs/, OUT/profile-*.txt|.md; prints a
Markdown report. Exits 1 if any request failed or a receipt count is wrong, 2 on bad usage.
"""

import argparse
import contextlib
import json
import os
import platform
import selectors
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(BENCH))

import profile_summary  # noqa: E402 - found through the sys.path entry above

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
PG_DATABASE_DEFAULT = "receipts_bench"
BENCH_SECRET = "receipts-bench-secret-0123456789abcdef0123456789"
CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1024 * 1024


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    kind: str  # direct | mitmdump | receipts
    db: str | None = None


TARGETS = {
    "direct": Target("direct", "(a) direct", "direct"),
    "mitmdump": Target("mitmdump", "(b) mitmdump", "mitmdump"),
    "sqlite": Target("sqlite", "(c) receipts SQLite", "receipts", "sqlite"),
    "postgres": Target("postgres", "(d) receipts PostgreSQL", "receipts", "postgres"),
}


class BenchError(Exception):
    pass


# -- processes ------------------------------------------------------------------------------------------


class Processes:
    """Every process this run starts, so that the finally block can stop each one by its own pid."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen[Any]] = []

    def start(self, cmd: list[str], log: Path | None, env: dict[str, str] | None = None, stdout: Any = None) -> subprocess.Popen[Any]:
        log_file = open(log, "ab") if log is not None else subprocess.DEVNULL  # closed below, once the child has it
        try:
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else log_file,
                stderr=log_file,
                env=env,
                cwd=REPO,
                start_new_session=True,  # a Ctrl-C of the benchmark does not hit them before the finally block
            )
        finally:
            if log is not None:
                log_file.close()  # type: ignore[union-attr]
        self.running.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        if proc in self.running:
            self.running.remove(proc)

    def stop_all(self) -> None:
        for proc in list(reversed(self.running)):
            self.stop(proc, grace=5.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"process exited with {proc.returncode} before listening on {port}{_tail(log)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise BenchError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s{_tail(log)}")


def _tail(log: Path | None, lines: int = 8) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").strip().splitlines()[-lines:]
    return ("\n  " + "\n  ".join(text)) if text else ""


def read_line(proc: subprocess.Popen[Any], timeout: float) -> str:
    """The first stdout line of a process, waiting at most `timeout` seconds."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise BenchError(f"no output within {timeout:.0f}s")
        return proc.stdout.readline().decode().strip()
    finally:
        sel.close()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, ... in KiB, from /proc/PID/status."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("Vm", "Threads", "voluntary_ctxt", "nonvoluntary_ctxt")):
                    name, _, value = line.partition(":")
                    out[name] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the whole process, all threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


class RssSampler(threading.Thread):
    """Samples VmRSS every `interval` seconds until stopped, at most `max_seconds`."""

    def __init__(self, pid: int, interval: float = 0.1, max_seconds: float = 1800.0):
        super().__init__(daemon=True)
        self.pid, self.interval, self.max_seconds = pid, interval, max_seconds
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        limit = time.monotonic() + self.max_seconds
        while time.monotonic() < limit:
            rss = proc_status(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append(rss)
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> list[int]:
        self._stop_event.set()
        self.join(5)
        return self.samples


# -- databases ------------------------------------------------------------------------------------------


def _libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pg_url_for(admin_url: str, database: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(admin_url).set(drivername="postgresql+psycopg", database=database).render_as_string(hide_password=False)


def pg_available(admin_url: str) -> str | None:
    import psycopg

    try:
        psycopg.connect(_libpq(admin_url), connect_timeout=3).close()
        return None
    except psycopg.Error as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def pg_drop(admin_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=5) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')


def pg_fresh(admin_url: str, database: str) -> str:
    import psycopg

    pg_drop(admin_url, database)
    with psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    return pg_url_for(admin_url, database)


class Db:
    """Read-only checks and bulk seeding, with the drivers directly (independent of proxy_addon internals)."""

    def __init__(self, kind: str, url: str, sqlite_path: Path | None = None):
        self.kind, self.url, self.sqlite_path = kind, url, sqlite_path

    @contextlib.contextmanager
    def connect(self) -> Any:
        if self.kind == "sqlite":
            conn = sqlite3.connect(str(self.sqlite_path), timeout=30)
            try:
                yield conn
            finally:
                conn.close()
        else:
            import psycopg

            with psycopg.connect(_libpq(self.url), connect_timeout=5) as conn:
                yield conn

    def _q(self, sql: str) -> str:
        return sql if self.kind == "sqlite" else sql.replace("?", "%s")

    def states_under(self, prefix: str) -> tuple[dict[str, int], int]:
        """Receipt counts per state, and the transition count, for paths starting with `prefix/`."""
        like = prefix + "/%"
        with self.connect() as conn:
            states = dict(conn.execute(self._q("SELECT state, count(*) FROM receipts WHERE path LIKE ? GROUP BY state"), (like,)).fetchall())
            transitions = conn.execute(
                self._q(
                    "SELECT count(*) FROM receipt_transitions t JOIN receipts r ON r.operation_id = t.operation_id "
                    "WHERE r.path LIKE ?"
                ),
                (like,),
            ).fetchone()[0]
        return {str(k): int(v) for k, v in states.items()}, int(transitions)

    def states_not_seeded(self) -> dict[str, int]:
        with self.connect() as conn:
            rows = conn.execute("SELECT state, count(*) FROM receipts WHERE path NOT LIKE '/seed/%' GROUP BY state").fetchall()
        return {str(k): int(v) for k, v in rows}

    def size_bytes(self) -> int | None:
        if self.kind == "sqlite":
            assert self.sqlite_path is not None
            return sum(p.stat().st_size for p in self.sqlite_path.parent.glob(self.sqlite_path.name + "*"))
        with self.connect() as conn:
            return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    def seed(self, n: int, upstream_port: int, budget_s: float) -> dict[str, Any]:
        """Insert `n` synthetic terminal receipts (90% succeeded, 10% rejected) with 3 transitions each."""
        started = time.monotonic()
        if n <= 0:
            return {"seeded": 0, "seconds": 0.0}
        if self.kind == "sqlite":
            done = self._seed_sqlite(n, upstream_port, started + budget_s)
        else:
            done = self._seed_pg(n, upstream_port, started + budget_s)
        seconds = round(time.monotonic() - started, 1)
        if not done:
            return {"seeded": 0, "seconds": seconds, "skipped": f"seeding {n} rows did not finish within {budget_s:.0f}s"}
        return {"seeded": n, "seconds": seconds}

    def _seed_sqlite(self, n: int, port: int, deadline: float) -> bool:
        import hashlib

        assert self.sqlite_path is not None
        conn = sqlite3.connect(str(self.sqlite_path), isolation_level=None)
        try:
            # seeding only: no rollback journal and no fsync; the proxy reopens the file WAL + synchronous=FULL
            conn.execute("PRAGMA journal_mode=MEMORY")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA cache_size=-262144")
            conn.execute("BEGIN")
            now = datetime.now(UTC).replace(tzinfo=None)
            fmt = "%Y-%m-%d %H:%M:%S.%f"
            rsql = (
                "INSERT INTO receipts (operation_id, operation, method, scheme, host, port, path, query, intent_fingerprint, "
                "account, idempotency_key, state, created_at, updated_at, submitted_at, completed_at, status_code, "
                "external_id, error_code, error_message, authentication_recorded, proxy_instance, request_headers, "
                "request_body, request_body_size, request_body_truncated, body_note, response_headers, response_body, "
                "response_body_truncated, reconcile_attempts) VALUES "
                "(?,?,?,?,?,?,?,NULL,?,?,NULL,?,?,?,?,?,?,?,?,NULL,0,?,?,?,?,0,NULL,?,?,0,0)"
            )
            tsql = "INSERT INTO receipt_transitions (operation_id, from_state, to_state, recorded_at, detail) VALUES (?,?,?,?,?)"
            req_headers = json.dumps({"host": f"127.0.0.1:{port}", "content-type": "application/json"})
            resp_headers = json.dumps({"content-type": "application/json"})
            detail = json.dumps({"who": "bench-seed"})
            batch = 10_000
            for start in range(0, n, batch):  # bounded: n / batch passes, and the deadline
                if time.monotonic() > deadline:
                    conn.execute("ROLLBACK")
                    return False
                rows, trows = [], []
                for g in range(start, min(n, start + batch)):
                    op = "op_" + uuid.uuid4().hex
                    created = now - timedelta(seconds=2 * (n - g))
                    completed = created + timedelta(milliseconds=40)
                    state = "rejected" if g % 10 == 0 else "succeeded"
                    c, s, d = created.strftime(fmt), (created + timedelta(milliseconds=5)).strftime(fmt), completed.strftime(fmt)
                    body = b'{"seq":%d,"title":"seeded item %d"}' % (g, g)
                    rows.append(
                        (
                            op, "POST 127.0.0.1 /seed/{id}", "POST", "http", "127.0.0.1", port, f"/seed/{g}",
                            "sha256:" + hashlib.sha256(b"seed%d" % g).hexdigest(), "anonymous", state, c, d, s, d,
                            400 if state == "rejected" else 201, None if state == "rejected" else str(g),
                            "upstream_status" if state == "rejected" else None, "bench-seed", req_headers, body,
                            len(body), resp_headers, b'{"id":%d}' % g,
                        )
                    )
                    trows += [(op, None, "planned", c, detail), (op, "planned", "submitted", s, detail), (op, "submitted", state, d, detail)]
                conn.executemany(rsql, rows)
                conn.executemany(tsql, trows)
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")
            return True
        finally:
            conn.close()

    def _seed_pg(self, n: int, port: int, deadline: float) -> bool:
        import psycopg

        chunk = 100_000
        sql = """
        WITH ins AS (
          INSERT INTO receipts (operation_id, operation, method, scheme, host, port, path, query, intent_fingerprint,
            account, idempotency_key, state, created_at, updated_at, submitted_at, completed_at, status_code,
            external_id, error_code, error_message, authentication_recorded, proxy_instance, request_headers,
            request_body, request_body_size, request_body_truncated, body_note, response_headers, response_body,
            response_body_truncated, reconcile_attempts)
          SELECT 'op_' || md5('seed' || g::text), 'POST 127.0.0.1 /seed/{id}', 'POST', 'http', '127.0.0.1', %(port)s::integer,
            '/seed/' || g, NULL, 'sha256:' || md5(g::text) || md5('fp' || g::text), 'anonymous', NULL,
            CASE WHEN g %% 10 = 0 THEN 'rejected' ELSE 'succeeded' END,
            ts, ts + interval '40 ms', ts + interval '5 ms', ts + interval '40 ms',
            CASE WHEN g %% 10 = 0 THEN 400 ELSE 201 END,
            CASE WHEN g %% 10 = 0 THEN NULL ELSE g::text END,
            CASE WHEN g %% 10 = 0 THEN 'upstream_status' ELSE NULL END, NULL, false, 'bench-seed',
            %(req_headers)s::json, convert_to('{"seq":' || g || ',"title":"seeded item ' || g || '"}', 'UTF8'), 40,
            false, NULL, '{"content-type": "application/json"}'::json, convert_to('{"id":' || g || '}', 'UTF8'),
            false, 0
          FROM (SELECT g, now() - (%(n)s::bigint - g) * interval '2 seconds' AS ts FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g) s
          RETURNING operation_id, state, created_at
        )
        INSERT INTO receipt_transitions (operation_id, from_state, to_state, recorded_at, detail)
        SELECT ins.operation_id, v.from_state, COALESCE(v.to_state, ins.state), ins.created_at + v.after, '{"who": "bench-seed"}'::json
        FROM ins CROSS JOIN (VALUES (NULL::text, 'planned'::text, interval '0 ms'), ('planned', 'submitted', interval '5 ms'),
                                    ('submitted', NULL, interval '40 ms')) AS v(from_state, to_state, after)
        """
        req_headers = json.dumps({"host": f"127.0.0.1:{port}", "content-type": "application/json"})
        with psycopg.connect(_libpq(self.url), connect_timeout=5) as conn:
            conn.execute("SET synchronous_commit = off")
            for lo in range(1, n + 1, chunk):  # bounded: n / chunk statements, and the deadline
                if time.monotonic() > deadline:
                    conn.rollback()
                    return False
                conn.execute(sql, {"port": port, "n": n, "lo": lo, "hi": min(n, lo + chunk - 1), "req_headers": req_headers})
            conn.commit()
        with psycopg.connect(_libpq(self.url), autocommit=True, connect_timeout=5) as conn:
            conn.execute("ANALYZE receipts")  # what autovacuum would have done on a database with that history
            conn.execute("ANALYZE receipt_transitions")
        return True


# -- the run --------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs"
        self.tmp = Path(tempfile.mkdtemp(prefix="receipts-bench-"))
        self.procs = Processes()
        self.run_id = uuid.uuid4().hex[:10]
        self.upstream_port = 0
        self.runs: list[dict[str, Any]] = []
        self.targets_info: dict[str, dict[str, Any]] = {}
        self.growth: list[dict[str, Any]] = []
        self.profiles: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.pg_used = False

    # -- helpers ------------------------------------------------------------------------------------------

    def env(self, database_url: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
        env["RECEIPTS_SECRET"] = BENCH_SECRET
        env["PYTHONUNBUFFERED"] = "1"
        if database_url:
            env["RECEIPTS_DATABASE_URL"] = database_url
        return env

    def receipts_cmd(self) -> list[str]:
        exe = BIN / "receipts"
        if exe.exists():
            return [str(exe)]
        return [sys.executable, "-c", "import sys; from proxy_addon.cli import main; sys.exit(main())"]

    def tool(self, name: str) -> str:
        exe = BIN / name
        if exe.exists():
            return str(exe)
        found = shutil.which(name)
        if not found:
            raise BenchError(f"{name} not found next to {sys.executable} nor on PATH")
        return found

    def loadgen(self, port: int, proxy: bool, requests: int, concurrency: int, prefix: str, expect_receipt: bool) -> dict[str, Any]:
        deadline = max(60.0, requests * 0.05)
        cmd = [
            sys.executable, str(BENCH / "loadgen.py"), "--port", str(port), "--requests", str(requests),
            "--concurrency", str(concurrency), "--prefix", prefix, "--run-id", self.run_id,
            "--deadline", str(deadline), "--timeout", "30",
        ]
        if proxy:
            cmd += ["--proxy", "--upstream-port", str(self.upstream_port)]
        if expect_receipt:
            cmd += ["--expect-header", "x-receipt-state=succeeded"]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=deadline + 60, cwd=REPO, env=self.env(), check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"load client did not finish within {deadline + 60:.0f}s") from None
        if done.returncode != 0:
            raise BenchError(f"load client failed ({done.returncode}): {done.stderr.decode(errors='replace')[-800:]}")
        return json.loads(done.stdout)["measured"]

    # -- targets ------------------------------------------------------------------------------------------

    def start_upstream(self) -> None:
        proc = self.procs.start(
            [sys.executable, str(BENCH / "upstream.py"), "--port", "0", "--max-lifetime", str(self.args.max_runtime)],
            self.logs / "upstream.log",
            env=self.env(),
            stdout=subprocess.PIPE,
        )
        line = read_line(proc, 15)
        if not line.startswith("LISTENING "):
            raise BenchError(f"upstream said {line!r}{_tail(self.logs / 'upstream.log')}")
        self.upstream_port = int(line.split()[1])

    def prepare_db(self, target: Target, growth: int) -> tuple[Db, dict[str, Any]]:
        if target.db == "sqlite":
            path = self.tmp / f"receipts-g{growth}.db"
            for p in path.parent.glob(path.name + "*"):
                p.unlink()
            db = Db("sqlite", f"sqlite:///{path}", path)
        else:
            problem = pg_available(self.args.pg_admin_url)
            if problem:
                raise BenchError(f"PostgreSQL at {self.args.pg_admin_url} is not reachable: {problem}")
            self.pg_used = True
            db = Db("postgres", pg_fresh(self.args.pg_admin_url, self.args.pg_database))
        config = self.write_config(target, db.url)
        migrated = subprocess.run(
            [*self.receipts_cmd(), "db", "upgrade", "--config", str(config)],
            capture_output=True, timeout=180, cwd=REPO, env=self.env(db.url), check=False,
        )
        if migrated.returncode != 0:
            raise BenchError(f"receipts db upgrade failed: {(migrated.stderr or migrated.stdout).decode(errors='replace')[-600:]}")
        seed = db.seed(growth, self.upstream_port, self.args.seed_budget) if growth else {"seeded": 0, "seconds": 0.0}
        seed["db_bytes"] = db.size_bytes()
        return db, seed

    def write_config(self, target: Target, url: str) -> Path:
        path = self.tmp / f"config-{target.key}.yaml"
        path.write_text(
            "# written by bench/run.py: the defaults, a fresh database, a throw-away secret file\n"
            f"database:\n  url: {json.dumps(url)}\n"
            f"secret_file: {json.dumps(str(self.tmp / 'secret'))}\n"
            "logging:\n  level: info\n  format: json\n"
        )
        return path

    def start_proxy(self, target: Target, growth: int, db: Db | None) -> tuple[subprocess.Popen[Any], int, Path]:
        port = free_port()
        log = self.logs / f"{target.key}-g{growth}.log"
        confdir = self.tmp / f"mitm-{target.key}"
        if target.kind == "mitmdump":
            cmd = [self.tool("mitmdump"), "-q", "--listen-host", "127.0.0.1", "-p", str(port), "--set", f"confdir={confdir}"]
            proc = self.procs.start(cmd, log, env=self.env())
        else:
            assert db is not None
            cmd = [*self.receipts_cmd(), "proxy", "--config", str(self.tmp / f"config-{target.key}.yaml"),
                   "--listen-host", "127.0.0.1", "--listen-port", str(port), "--confdir", str(confdir)]
            proc = self.procs.start(cmd, log, env=self.env(db.url))
        wait_port(port, proc, 60, log)
        return proc, port, log

    def run_target(self, target: Target, growth: int, rows: list[dict[str, Any]]) -> None:
        """Every level of one target; each row goes into `rows` as soon as it is measured."""
        proc: subprocess.Popen[Any] | None = None
        db: Db | None = None
        seed: dict[str, Any] = {}
        sent_total = 0
        info: dict[str, Any] = {"target": target.key, "label": target.label, "growth": growth}
        try:
            if target.kind == "receipts":
                db, seed = self.prepare_db(target, growth)
                info["seed"] = seed
                if seed.get("skipped"):
                    info["skipped"] = seed["skipped"]
                    print(f"  {target.label} growth {growth}: skipped, {seed['skipped']}", flush=True)
                    return
            if target.kind == "direct":
                port, pid = self.upstream_port, None
            else:
                proc, port, _log = self.start_proxy(target, growth, db)
                pid = proc.pid
                info["rss_idle_mib"] = round(proc_status(pid).get("VmRSS", 0) / 1024, 1)
            for c in self.args.concurrency:
                base = f"/bench/{self.run_id}/{target.key}/g{growth}/c{c}"
                proxied, journaled = target.kind != "direct", target.kind == "receipts"
                warm = self.loadgen(port, proxied, self.args.warmup, c, base + "/w", journaled) if self.args.warmup else None
                sent_total += self.args.warmup if warm else 0
                row: dict[str, Any] = {"target": target.key, "label": target.label, "concurrency": c, "growth": growth}
                row["loadavg_1m"] = round(os.getloadavg()[0], 2)
                sampler = RssSampler(pid) if pid else None
                cpu0 = proc_cpu(pid) if pid else (0.0, 0.0)
                ctx0 = proc_status(pid) if pid else {}
                if sampler:
                    sampler.start()
                try:
                    result = self.loadgen(port, proxied, self.args.requests, c, base + "/m", journaled)
                finally:
                    samples = sampler.stop() if sampler else []
                sent_total += self.args.requests
                row.update({k: result[k] for k in ("requests", "ok", "errors", "rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "elapsed_s")})
                row["error_kinds"] = result["error_kinds"]
                if warm and warm["errors"]:
                    row["errors"] += warm["errors"]
                    row["error_kinds"] = {**row["error_kinds"], **{f"warmup {k}": v for k, v in warm["error_kinds"].items()}}
                if pid:
                    status = proc_status(pid)
                    user, system = (b - a for a, b in zip(cpu0, proc_cpu(pid)))
                    cpu = user + system
                    n_ok = max(1, result["ok"])
                    q = max(1, len(samples) // 5)
                    row["proxy"] = {
                        "peak_rss_mib": round(status.get("VmHWM", 0) / 1024, 1),
                        "rss_end_mib": round(status.get("VmRSS", 0) / 1024, 1),
                        "rss_max_sampled_mib": round(max(samples) / 1024, 1) if samples else None,
                        "rss_growth_in_level_mib": round((statistics.median(samples[-q:]) - statistics.median(samples[:q])) / 1024, 2) if len(samples) >= 5 else None,
                        "rss_samples": len(samples),
                        "rss_timeline_mib": [round(samples[i * len(samples) // 40] / 1024, 1) for i in range(40)] if len(samples) >= 40 else [round(x / 1024, 1) for x in samples],
                        "threads": status.get("Threads"),
                        "cpu_ms_per_request": round(cpu * 1000 / n_ok, 3),
                        "cpu_user_ms_per_request": round(user * 1000 / n_ok, 3),
                        "cpu_system_ms_per_request": round(system * 1000 / n_ok, 3),
                        "context_switches_per_request": round(
                            (status.get("voluntary_ctxt_switches", 0) + status.get("nonvoluntary_ctxt_switches", 0)
                             - ctx0.get("voluntary_ctxt_switches", 0) - ctx0.get("nonvoluntary_ctxt_switches", 0)) / n_ok, 1
                        ),
                        "cpu_utilisation": round(cpu / result["elapsed_s"], 2) if result["elapsed_s"] else None,
                    }
                if db is not None:
                    states, transitions = db.states_under(base + "/m")
                    expected = self.args.requests
                    good = states == {"succeeded": expected} and transitions == 3 * expected
                    row["verify"] = {"states": states, "transitions": transitions, "expected_succeeded": expected, "ok": good}
                    if not good:
                        self.failures.append(
                            f"{target.label} g{growth} c{c}: receipts {states}, transitions {transitions}; expected {expected} succeeded, {3 * expected} transitions"
                        )
                if row["errors"]:
                    self.failures.append(f"{target.label} g{growth} c{c}: {row['errors']} errors {row['error_kinds']}")
                rows.append(row)
                print(f"  {_row_line(row)}", flush=True)
            if proc is not None and growth == 0 and target.key in self.args.profile_targets and self.args.profile > 0:
                sent_total += self.profile(target, proc.pid, port)
            if db is not None:
                overall = db.states_not_seeded()
                info["receipts_after"] = overall
                if overall != {"succeeded": sent_total}:
                    self.failures.append(f"{target.label} g{growth}: receipts table holds {overall}, expected {sent_total} succeeded")
                info["db_bytes_after"] = db.size_bytes()
            if proc is not None:
                status = proc_status(proc.pid)
                info["peak_rss_mib"] = round(status.get("VmHWM", 0) / 1024, 1)
                info["rss_end_mib"] = round(status.get("VmRSS", 0) / 1024, 1)
            info["requests_sent"] = sent_total
        finally:
            if proc is not None:
                self.procs.stop(proc)
            self.targets_info[f"{target.key}/g{growth}"] = info

    def profile(self, target: Target, pid: int, port: int) -> int:
        """py-spy the proxy under concurrency-32 load, twice: every busy thread, then only the GIL holder.

        Returns how many requests were sent (all journaled, so the final receipt count includes them).
        """
        seconds, rate = self.args.profile, 100
        sent = 0
        for mode in ("active", "gil"):
            raw = self.out / f"profile-{target.key}-{mode}.txt"
            raw.unlink(missing_ok=True)
            log = self.logs / f"py-spy-{target.key}-{mode}.log"
            cmd = [self.tool("py-spy"), "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
                   "--format", "raw", "--threads", "--output", str(raw)]
            spy = self.procs.start(cmd + (["--gil"] if mode == "gil" else []), log)
            try:
                time.sleep(1.0)  # py-spy attaches
                deadline = time.monotonic() + seconds + 1
                i = 0
                while time.monotonic() < deadline and i < 100 and spy.poll() is None:  # bounded by time and count
                    result = self.loadgen(port, True, 500, 32, f"/profile/{self.run_id}/{target.key}/{mode}/{i}", True)
                    sent += result["requests"]
                    if result["errors"]:
                        self.failures.append(f"profile load on {target.label}: {result['errors']} errors {result['error_kinds']}")
                    i += 1
                spy.wait(seconds + 30)
            except subprocess.TimeoutExpired:
                self.failures.append(f"py-spy ({mode}) did not finish")
            finally:
                self.procs.stop(spy)
            if not raw.exists():
                self.failures.append(f"py-spy ({mode}) wrote no profile{_tail(log)}")
                continue
            summary = profile_summary.summarise(raw, rate, seconds)
            title = f"receipts proxy on {target.db}, c=32, {seconds} s, py-spy {'--gil (GIL holder only)' if mode == 'gil' else '(all busy threads)'}: "
            (self.out / f"profile-{target.key}-{mode}.md").write_text(profile_summary.as_markdown(summary, title))
            self.profiles.append({"target": target.key, "mode": mode, "seconds": seconds, "raw": str(raw), "summary": summary})
            print(f"  profiled {target.label} ({mode}) for {seconds}s: {summary['samples']} samples -> {raw}", flush=True)
        return sent

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for old in self.logs.glob("*.log"):
            old.unlink()
        started = time.time()
        try:
            self.start_upstream()
            print(f"upstream on 127.0.0.1:{self.upstream_port}; {self.args.requests} requests per level, "
                  f"concurrency {self.args.concurrency}, warm-up {self.args.warmup}", flush=True)
            for key in self.args.targets:
                self.guarded(lambda key=key: self.run_target(TARGETS[key], 0, self.runs), TARGETS[key].label)
            for g in self.args.growth:
                for key in self.args.targets:
                    target = TARGETS[key]
                    if target.kind != "receipts":
                        continue
                    if g == 0:
                        rows = [r for r in self.runs if r["target"] == key]
                        self.growth += [{**r, "reused_main_run": True} for r in rows]
                        continue
                    print(f"growth {g}: {target.label}", flush=True)
                    self.guarded(lambda t=target, g=g: self.run_target(t, g, self.growth), f"{target.label} growth {g}")
        finally:
            self.procs.stop_all()
            if self.pg_used and not self.args.keep:
                with contextlib.suppress(Exception):
                    pg_drop(self.args.pg_admin_url, self.args.pg_database)
            if not self.args.keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
        document = self.document(time.time() - started)
        (self.out / "results.json").write_text(json.dumps(document, indent=2))
        if not self.args.no_chart:
            try:
                chart(document, self.out / "chart.png")
                document["chart"] = str(self.out / "chart.png")
            except ImportError as e:
                message = f"no chart: {e} (pip install -e '.[bench]')"
                if self.args.smoke:
                    print(message)
                else:
                    self.failures.append(message)
                    document["failures"] = self.failures
                    document["ok"] = False
            (self.out / "results.json").write_text(json.dumps(document, indent=2))
        print()
        print(markdown(document))
        print(f"results: {self.out / 'results.json'}")
        return 0 if not self.failures else 1

    def guarded(self, fn: Any, what: str) -> None:
        try:
            fn()
        except BenchError as e:
            self.failures.append(f"{what}: {e}")
            print(f"  {what}: FAILED: {e}", flush=True)
        except Exception as e:  # a driver or OS error: record it, stop this target, go on with the next
            self.failures.append(f"{what}: {type(e).__name__}: {e}")
            print(f"  {what}: FAILED: {type(e).__name__}: {e}", flush=True)

    # -- the report ---------------------------------------------------------------------------------------

    def document(self, seconds: float) -> dict[str, Any]:
        return {
            "meta": machine(self.args, self.run_id, seconds),
            "settings": {
                "requests": self.args.requests,
                "concurrency": self.args.concurrency,
                "warmup": self.args.warmup,
                "growth": self.args.growth,
                "targets": self.args.targets,
                "smoke": self.args.smoke,
                "body": "POST, ~90-byte unique JSON; upstream answers 201 with a ~20-byte JSON body",
            },
            "runs": self.runs,
            "targets": self.targets_info,
            "ratios": ratios(self.runs),
            "goals": goals(self.runs, self.targets_info),
            "growth": self.growth,
            "profiles": [dict(p) for p in self.profiles],
            "failures": self.failures,
            "ok": not self.failures,
        }


def _row_line(r: dict[str, Any]) -> str:
    mem = f", proxy peak {r['proxy']['peak_rss_mib']} MiB, {r['proxy']['cpu_ms_per_request']} ms CPU/req" if r.get("proxy") else ""
    return f"{r['label']:<24} g={r['growth']:<8} c={r['concurrency']:<3} {r['rps']:>9.1f} req/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  errors {r['errors']}{mem}"


def _find(runs: list[dict[str, Any]], target: str, c: int) -> dict[str, Any] | None:
    return next((r for r in runs if r["target"] == target and r["concurrency"] == c and r["growth"] == 0), None)


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in sorted({r["concurrency"] for r in runs}):
        b = _find(runs, "mitmdump", c)
        if not b or not b["rps"]:
            continue
        for key in ("sqlite", "postgres"):
            x = _find(runs, key, c)
            if not x:
                continue
            added = None if x["p50_ms"] is None or b["p50_ms"] is None else round(x["p50_ms"] - b["p50_ms"], 3)
            added99 = None if x["p99_ms"] is None or b["p99_ms"] is None else round(x["p99_ms"] - b["p99_ms"], 3)
            out.append({
                "target": key, "vs": "mitmdump", "concurrency": c,
                "throughput_ratio": round(x["rps"] / b["rps"], 3),
                "added_p50_ms": added, "added_p99_ms": added99,
            })
    return out


def goals(runs: list[dict[str, Any]], targets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets: throughput >= 0.8 of mitmdump at c=32, added p50 < 2 ms at c=1, flat memory."""
    out = []
    rs = ratios(runs)
    for key in ("sqlite", "postgres"):
        for r in rs:
            if r["target"] == key and r["concurrency"] == 32:
                out.append({"target": key, "goal": "throughput >= 0.8 x mitmdump at c=32", "value": r["throughput_ratio"], "met": r["throughput_ratio"] >= 0.8})
            if r["target"] == key and r["concurrency"] == 1 and r["added_p50_ms"] is not None:
                out.append({"target": key, "goal": "added p50 < 2 ms at c=1", "value": r["added_p50_ms"], "met": r["added_p50_ms"] < 2.0})
        rows = [r for r in runs if r["target"] == key and r.get("proxy")]
        growths = [r["proxy"]["rss_growth_in_level_mib"] for r in rows if r["proxy"].get("rss_growth_in_level_mib") is not None]
        if growths:
            worst = max(growths)
            out.append({
                "target": key,
                "goal": "memory flat (RSS growth within each level <= 2 MiB)",
                "value": worst,
                "met": worst <= 2.0,
                "note": "a heuristic over one level's samples; a long soak is the real test",
            })
    return out


def machine(args: argparse.Namespace, run_id: str, seconds: float) -> dict[str, Any]:
    def first(path: str, key: str) -> str | None:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.partition(":")[2].strip()
        return None

    versions: dict[str, Any] = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for mod in ("mitmproxy", "httpx", "sqlalchemy", "psycopg", "structlog"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[mod] = version(mod)
    if "postgres" in args.targets and not pg_available(args.pg_admin_url):
        with contextlib.suppress(Exception):
            import psycopg

            with psycopg.connect(_libpq(args.pg_admin_url), connect_timeout=3) as conn:
                versions["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    git = {}
    with contextlib.suppress(Exception):
        git["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=10, check=False).stdout.strip()
        git["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--", "proxy_addon"], capture_output=True, text=True, cwd=REPO, timeout=10, check=False).stdout.strip())
    return {
        "run_id": run_id,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(seconds, 1),
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(int((first("/proc/meminfo", "MemTotal") or "0 kB").split()[0]) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "git": git,
        "durability": "SQLite WAL + synchronous=FULL; PostgreSQL synchronous_commit default (on)",
    }


def markdown(doc: dict[str, Any]) -> str:
    m = doc["meta"]
    s = doc["settings"]
    lines = [
        f"## receipts benchmark ({'smoke' if s['smoke'] else 'full'}), run {m['run_id']}",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {m['versions'].get('python')}, mitmproxy "
        f"{m['versions'].get('mitmproxy')}, SQLite {m['versions'].get('sqlite')}"
        + (f", PostgreSQL {m['versions']['postgresql']}" if "postgresql" in m["versions"] else "")
        + f"; load average at end {m['loadavg_at_end']}; git {m['git'].get('commit')}{' (proxy_addon modified)' if m['git'].get('dirty') else ''}",
        f"{s['requests']} POSTs per level after {s['warmup']} warm-up; {m['durability']}.",
        "",
        "| target | c | req/s | p50 ms | p99 ms | errors | proxy peak RSS MiB | proxy CPU ms/req | vs (b) req/s | added p50 ms vs (b) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratio = {(r["target"], r["concurrency"]): r for r in doc["ratios"]}
    for r in sorted(doc["runs"], key=lambda r: (r["concurrency"], list(TARGETS).index(r["target"]))):
        p = r.get("proxy") or {}
        rr = ratio.get((r["target"], r["concurrency"]))
        lines.append(
            f"| {r['label']} | {r['concurrency']} | {r['rps']:.0f} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | {r['errors']} | "
            f"{p.get('peak_rss_mib', '')} | {p.get('cpu_ms_per_request', '')} | "
            f"{rr['throughput_ratio'] if rr else ''} | {_f(rr['added_p50_ms']) if rr else ''} |"
        )
    if doc["goals"]:
        lines += ["", "| goal (issue 7) | target | value | met |", "|---|---|---:|---|"]
        for g in doc["goals"]:
            lines.append(f"| {g['goal']} | {g['target']} | {g['value']} | {'yes' if g['met'] else 'NO'} |")
    mem = [(k, v) for k, v in doc["targets"].items() if v.get("peak_rss_mib")]
    if mem:
        lines += ["", "| proxy process | idle RSS MiB | peak RSS MiB (VmHWM) | RSS at end MiB | requests through it |", "|---|---:|---:|---:|---:|"]
        for _, v in mem:
            lines.append(f"| {v['label']} (history {v['growth']}) | {v.get('rss_idle_mib', '')} | {v['peak_rss_mib']} | {v.get('rss_end_mib', '')} | {v.get('requests_sent', '')} |")
    if doc["growth"]:
        lines += ["", "| growth: target | receipts already stored | c | req/s | p50 ms | p99 ms | errors | seed s | db MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted(doc["growth"], key=lambda r: (r["target"], r["concurrency"], r["growth"])):
            t = doc["targets"].get(f"{r['target']}/g{r['growth']}", {})
            seed = t.get("seed", {})
            size = seed.get("db_bytes")
            lines.append(
                f"| {r['label']} | {r['growth']:,} | {r['concurrency']} | {r['rps']:.0f} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | {r['errors']} | "
                f"{seed.get('seconds', '')} | {round(size / MiB) if size else ''} |"
            )
        skipped = [f"{v['label']} history {v['growth']}: {v['skipped']}" for v in doc["targets"].values() if v.get("skipped")]
        lines += [f"- skipped: {s}" for s in skipped]
    for p in doc["profiles"]:
        top = ", ".join(f"{x['name']} {x['percent']}%" for x in p["summary"]["self"][:8])
        lines += ["", f"profile of {p['target']} ({p['mode']}, {p['seconds']} s, {p['summary']['samples']} samples), self time: {top}"]
    lines += ["", "verification: " + ("every level's receipts matched (N succeeded, 3N transitions)" if doc["ok"] else "FAILED")]
    lines += [f"- {f}" for f in doc["failures"]]
    return "\n".join(lines)


def _f(v: Any) -> str:
    return "" if v is None else f"{v:.2f}"


def chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    conc = sorted({r["concurrency"] for r in runs})
    keys = [k for k in TARGETS if any(r["target"] == k for r in runs)]
    colours = {"direct": "#7f7f7f", "mitmdump": "#1f77b4", "sqlite": "#2ca02c", "postgres": "#d62728"}
    has_growth = any(r["growth"] for r in doc["growth"])
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    width = 0.8 / max(1, len(keys))

    def bars(ax: Any, value: Any, title: str, ylabel: str, log: bool = False, only: list[str] | None = None) -> None:
        ks = [k for k in keys if only is None or k in only]
        w = 0.8 / max(1, len(ks))
        for i, k in enumerate(ks):
            xs, ys = [], []
            for j, c in enumerate(conc):
                r = _find(runs, k, c)
                if r and value(r) is not None:
                    xs.append(j + (i - (len(ks) - 1) / 2) * w)
                    ys.append(value(r))
            b = ax.bar(xs, ys, w, label=TARGETS[k].label, color=colours[k])
            labels = []
            for c in conc:
                r, base = _find(runs, k, c), _find(runs, "mitmdump", c)
                if r is None or value(r) is None:
                    continue
                ratio = f"\n{value(r) / value(base):.2f}x(b)" if k in ("sqlite", "postgres") and base and value(base) else ""
                labels.append(f"{value(r):.0f}{ratio}")
            ax.bar_label(b, labels=labels, fontsize=7)
        ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(top=ax.get_ylim()[1] * 3)
        else:
            ax.set_ylim(top=ax.get_ylim()[1] * 1.25)
        ax.legend(fontsize=8, loc="upper left", ncols=2)

    bars(axes[0][0], lambda r: r["rps"], "throughput (higher is better; log scale)", "requests/s", log=True)
    ax = axes[0][1]
    for i, k in enumerate(keys):
        for j, c in enumerate(conc):
            r = _find(runs, k, c)
            if not r or r["p50_ms"] is None:
                continue
            x = j + (i - (len(keys) - 1) / 2) * width
            ax.bar(x, r["p99_ms"], width, color=colours[k], alpha=0.35)
            ax.bar(x, r["p50_ms"], width, color=colours[k], label=TARGETS[k].label if j == 0 else None)
            ax.text(x, r["p50_ms"], f"{r['p50_ms']:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title("latency: p50 (solid, labelled) and p99 (pale)")
    ax.legend(fontsize=8)
    bars(axes[1][0], lambda r: (r.get("proxy") or {}).get("peak_rss_mib"), "proxy peak RSS (VmHWM) after the level", "MiB", only=[k for k in keys if k != "direct"])
    ax = axes[1][1]
    if has_growth:
        for k in ("sqlite", "postgres"):
            for c, style in zip(conc, ("-o", "--s", ":^", "-.d")):
                pts = sorted((r["growth"], r["p50_ms"]) for r in doc["growth"] if r["target"] == k and r["concurrency"] == c and r["p50_ms"] is not None)
                if pts:
                    ax.plot([max(p[0], 1) for p in pts], [p[1] for p in pts], style, color=colours[k], label=f"{TARGETS[k].label} c={c} p50")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("receipts already in the database (0 plotted at 1)")
        ax.set_ylabel("p50 ms (log scale)")
        ax.set_title("growth: p50 latency vs history (flat is the goal)")
        ax.legend(fontsize=7)
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no growth scenario in this run\n(--growth 0,100000,1000000)", ha="center", va="center")
    m = doc["meta"]
    fig.suptitle(
        f"receipts benchmark {m['run_id']}: {doc['settings']['requests']} POSTs/level; {m['cpu']}, {m['cores']} cores; "
        f"mitmproxy {m['versions'].get('mitmproxy')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line ---------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("values must not be negative")
    return values


def _targets(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in TARGETS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown target(s) {', '.join(bad)} (known: {', '.join(TARGETS)})")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=None, help="measured POSTs per target and concurrency (default 3000; smoke 200)")
    p.add_argument("--concurrency", type=_int_list, default=None, help="levels, e.g. 1,32 (default; smoke 1,8)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured requests before each level (default 200; smoke 20)")
    p.add_argument("--targets", type=_targets, default=None, help="subset of direct,mitmdump,sqlite,postgres (default all; smoke without postgres)")
    p.add_argument("--growth", type=_int_list, default=[], help="history sizes for the growth scenario, e.g. 0,100000,1000000")
    p.add_argument("--seed-budget", type=float, default=300.0, help="seconds allowed to seed one growth database; over it, that level is skipped")
    p.add_argument("--profile", type=int, default=0, help="py-spy the receipts proxy for this many seconds under c=32 load")
    p.add_argument("--profile-targets", type=_targets, default=["sqlite"], help="which receipts targets to profile (default sqlite)")
    p.add_argument("--smoke", action="store_true", help="tiny and quick (< 60 s): 200 requests, c=1,8, direct+mitmdump+sqlite, no growth, no chart")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--pg-admin-url", default=os.environ.get("RECEIPTS_BENCH_PG_ADMIN_URL", PG_ADMIN_DEFAULT), help="a database on the server to connect to for CREATE/DROP DATABASE")
    p.add_argument("--pg-database", default=PG_DATABASE_DEFAULT, help="the database created afresh for (d) (default receipts_bench)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and the PostgreSQL database")
    p.add_argument("--max-runtime", type=float, default=5400.0, help="the upstream stops by itself after this many seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.requests = 200 if args.requests is None else args.requests
        args.concurrency = args.concurrency or [1, 8]
        args.warmup = 20 if args.warmup is None else args.warmup
        args.targets = args.targets or ["direct", "mitmdump", "sqlite"]
        if args.growth:
            p.error("--smoke runs no growth scenario")
        args.no_chart = True
    args.requests = 3000 if args.requests is None else args.requests
    args.concurrency = args.concurrency or [1, 32]
    args.warmup = 200 if args.warmup is None else args.warmup
    args.targets = args.targets or list(TARGETS)
    if args.requests < 1 or not args.concurrency or min(args.concurrency) < 1:
        p.error("--requests and every --concurrency level must be >= 1")
    if args.growth and not any(TARGETS[t].kind == "receipts" for t in args.targets):
        p.error("--growth needs the sqlite or postgres target")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    try:
        return bench.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
