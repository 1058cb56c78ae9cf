"""The WAN mode: what a journaled HTTPS write costs when the upstream is a round trip away.

    python bench/wan.py --rtt 20ms --protocol h1,h2 --requests 200 --concurrency 1,8 --rounds 3 --out /tmp/wan
    python bench/wan.py --smoke --out /tmp/wan-smoke     # a few seconds; what tests/e2e/test_bench_smoke.py runs

Between the proxies and the upstream sits bench/relay.py, a TCP relay on 127.0.0.1 that delays each direction
by rtt/2 (and a new connection's first bytes by its TCP handshake's round trip). The upstream is
bench/wan_upstream.py (hypercorn, HTTPS with a certificate of a throw-away CA that the proxies trust through
mitmproxy's `ssl_verify_upstream_trusted_ca`): `--protocol h1` offers only HTTP/1.1, `h2` offers h2 and
HTTP/1.1. The agent is bench/wan_client.py: one httpx client, kept alive, tunnelling with CONNECT and TLS
through the proxy (trusting the proxy's CA), offering HTTP/1.1 (h1) or also h2 (h2) in the tunnel
(httpx lists http/1.1 first: mitmdump, connected upstream on CONNECT, mirrors the upstream's h2; the receipts
proxy's lazy strategy takes the client's first choice); sequential writes at c=1, K tasks on the one client
at c=K.

Targets, side by side on the same relay and upstream: `mitmdump` (no addon: mitmproxy's own kept-alive
upstream connection, the baseline), `sqlite` and `postgres` (`receipts proxy` on a fresh, migrated database).
A target may carry extra mitmproxy options, `KIND@OPTION=VALUE[+OPTION=VALUE]` (e.g.
`sqlite@connection_strategy=eager`), and keys of the receipts config's `defaults:`, `KIND~KEY=VALUE[+...]`
(e.g. `sqlite~upstream_connections=fresh`), to compare a setting side by side. Per protocol and concurrency, each
round runs every target in turn (interleaved, so the machine's noise falls on all alike); the figures are the
medians of the rounds. The report gives p50 and p90 per write, the p50 and p90 added over mitmdump in ms and
in round trips (added ms / RTT), and the upstream TCP connections the relay saw opened per write.

The timeline (c=1, from the relay's trace): for each write, what the relay saw between the agent's send and
its answer (a connection opened, each chunk in each direction with its size, when it arrived at the relay
and when it was delivered), in ms after the agent's send, the median over the writes whose sequence of
events is the most common one. It says where the round trips go.

Writes `wan.json`, `wan.md` (also printed) and the processes' logs (`logs/`, the relay's `trace-*.jsonl`)
into --out. Exit 1 if a write failed or a receipts database does not hold exactly the writes sent, all
`succeeded`.
"""

import argparse
import bisect
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from certs import throwaway_ca
from databases import Db, migrate, pg_drop, pg_unavailable
from levels import settled
from processes import (
    BENCH,
    REPO,
    BenchError,
    Process,
    Processes,
    bench_env,
    free_port,
    log_tail,
    read_line,
    receipts_cmd,
    tool,
    wait_port,
    write_proxy_config,
)
from relay import parse_duration_ms

Row = dict[str, Any]
KINDS = ("mitmdump", "sqlite", "postgres")
LABELS = {"mitmdump": "mitmdump", "sqlite": "receipts SQLite", "postgres": "receipts PostgreSQL"}


@dataclass
class Target:
    spec: str  # as given: KIND, KIND@OPTION=VALUE+..., KIND~KEY=VALUE+...
    kind: str
    options: list[str]
    key: str  # a file-name-safe form of spec
    defaults: list[str] = field(default_factory=list)  # KEY=VALUE for the receipts config's `defaults:`
    port: int = 0
    proc: Process | None = None
    db: Db | None = None
    sent: int = 0  # writes sent to it (warm-up included), for the receipts check

    @property
    def label(self) -> str:
        return LABELS[self.kind] + (f" ({', '.join(self.options)})" if self.options else "")


@dataclass
class Leg:
    """One protocol's upstream and the relay in front of it."""

    protocol: str
    upstream_port: int
    relay_port: int
    trace: Path


@dataclass
class Run:
    args: argparse.Namespace
    out: Path
    tmp: Path
    run_id: str
    rtt_ms: float
    procs: Processes = field(default_factory=Processes)
    rounds: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def parse_target(spec: str) -> Target:
    """KIND, then optionally @OPTION=VALUE+... (mitmproxy options) and ~KEY=VALUE+... (the receipts config's
    `defaults:`), e.g. `sqlite@connection_strategy=eager` or `sqlite~upstream_connections=fresh`."""
    head, _, config = spec.partition("~")
    kind, _, opts = head.partition("@")
    if kind not in KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown target {kind!r} (one of {', '.join(KINDS)}, then @OPTION=VALUE+... ~KEY=VALUE+...)"
        )
    options = [o for o in opts.split("+") if o]
    defaults = [o for o in config.split("+") if o]
    for o in options + defaults:
        if "=" not in o:
            raise argparse.ArgumentTypeError(f"{o!r}: options are OPTION=VALUE")
    if defaults and kind == "mitmdump":
        raise argparse.ArgumentTypeError(f"{spec!r}: mitmdump has no receipts config")
    key = "".join(ch if ch.isalnum() else "-" for ch in spec).strip("-")
    return Target(spec, kind, options, key, defaults=defaults)


# -- processes ---------------------------------------------------------------------------------------------


def start_leg(run: Run, protocol: str, cert: Path, key: Path) -> Leg:
    logs = run.out / "logs"
    life = str(run.args.max_runtime)
    up_log = logs / f"upstream-{protocol}.log"
    up = run.procs.start(
        [sys.executable, BENCH / "wan_upstream.py", "--cert", cert, "--key", key, "--alpn", protocol, "--max-lifetime", life],
        up_log,
        env=bench_env(),
        stdout=subprocess.PIPE,
    )
    line = read_line(up, 30)
    if not line.startswith("LISTENING "):
        raise BenchError(f"upstream said {line!r}{log_tail(up_log)}")
    upstream_port = int(line.split()[1])
    trace = logs / f"trace-{protocol}.jsonl"
    relay_cmd = [sys.executable, BENCH / "relay.py", "--target", f"127.0.0.1:{upstream_port}", "--rtt", f"{run.rtt_ms}ms"]
    relay_cmd += ["--trace", trace, "--max-lifetime", life]
    if run.args.no_handshake:
        relay_cmd.append("--no-handshake")
    relay_log = logs / f"relay-{protocol}.log"
    relay = run.procs.start(relay_cmd, relay_log, env=bench_env(), stdout=subprocess.PIPE)
    line = read_line(relay, 15)
    if not line.startswith("LISTENING "):
        raise BenchError(f"relay said {line!r}{log_tail(relay_log)}")
    return Leg(protocol, upstream_port, int(line.split()[1]), trace)


def start_target(run: Run, target: Target, confdir: Path, ca: Path) -> None:
    log = run.out / "logs" / f"{target.key}.log"
    port = free_port()
    sets = [f"ssl_verify_upstream_trusted_ca={ca}", *target.options]
    if target.kind == "mitmdump":
        cmd = [tool("mitmdump"), "-q", "--listen-host", "127.0.0.1", "-p", str(port), "--set", f"confdir={confdir}"]
        env = bench_env()
    else:
        if target.kind == "sqlite":
            target.db = Db.fresh_sqlite(run.tmp / f"{target.key}.db")
        else:
            target.db = Db.fresh_postgres(run.args.pg_admin_url, pg_database(target))
        config = write_proxy_config(run.tmp, target.key, target.db.url)
        if target.defaults:
            with config.open("a") as f:
                f.write("defaults:\n" + "".join(f"  {k}: {v}\n" for k, _, v in (d.partition("=") for d in target.defaults)))
        migrate(config, target.db.url)
        cmd = [*receipts_cmd(), "proxy", "--config", str(config), "--listen-host", "127.0.0.1", "--listen-port", str(port)]
        cmd += ["--confdir", str(confdir)]
        env = bench_env(target.db.url)
    for s in sets:
        cmd += ["--set", s]
    target.proc = run.procs.start(cmd, log, env=env)
    target.port = port
    wait_port(port, target.proc, 60, log)


def pg_database(target: Target) -> str:
    return "receipts_wan_" + target.key.replace("-", "_")[:40]


def run_client(run: Run, leg: Leg, target: Target, concurrency: int, round_no: int, confdir: Path) -> Row:
    a = run.args
    url = f"https://127.0.0.1:{leg.relay_port}/wan/{run.run_id}/{leg.protocol}/c{concurrency}/r{round_no}/{target.key}"
    cmd = [
        sys.executable,
        str(BENCH / "wan_client.py"),
        *("--proxy-port", str(target.port), "--proxy-ca", str(confdir / "mitmproxy-ca-cert.pem"), "--url", url),
        *("--requests", str(a.requests), "--warmup", str(a.warmup), "--concurrency", str(concurrency)),
    ]
    if leg.protocol == "h2":
        cmd.append("--http2")
    if target.kind != "mitmdump":
        cmd += ["--expect-header", "x-receipt-state=succeeded"]
    done = subprocess.run(cmd, capture_output=True, cwd=REPO, env=bench_env(), timeout=a.requests * 5 + 120, check=False)
    if done.returncode != 0:
        raise BenchError(f"wan_client failed ({done.returncode}): {done.stderr.decode(errors='replace')[-800:]}")
    target.sent += a.requests + max(a.warmup, concurrency)
    return json.loads(done.stdout)


# -- figures -------------------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, round(q / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


def read_trace(path: Path) -> list[Row]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events


def round_row(run: Run, leg: Leg, target: Target, concurrency: int, round_no: int, result: Row, load: float) -> Row:
    lat = result["latencies_ms"]
    return {
        "protocol": leg.protocol,
        "concurrency": concurrency,
        "target": target.spec,
        "kind": target.kind,
        "round": round_no,
        "requests": result["requests"],
        "ok": result["ok"],
        "failed": result["failed"],
        "failures": result["failures"],
        "http_versions": result["http_versions"],
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "mean_ms": statistics.fmean(lat) if lat else None,
        "window": result["window"],
        "started": result.get("started"),
        "writes": result["writes"],
        "load1": load,
    }


def count_connections(rows: list[Row], traces: dict[str, list[Row]]) -> None:
    """Upstream connections the relay saw opened during each round's measured window, per write."""
    for row in rows:
        start, end = row["window"]
        opened = [e for e in traces.get(row["protocol"], []) if e["ev"] == "open" and start <= e["t"] <= end]
        row["upstream_connections"] = len(opened)
        row["connections_per_write"] = len(opened) / row["requests"] if row["requests"] else None
        # and from the agent's start: the warm-up's too (a proxy that connects upstream on CONNECT shows here)
        first = row.get("started") or start
        row["upstream_connections_with_warmup"] = sum(
            1 for e in traces.get(row["protocol"], []) if e["ev"] == "open" and first <= e["t"] <= end
        )


def medians(rows: list[Row], rtt_ms: float) -> list[Row]:
    groups: dict[tuple[str, int, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["protocol"], r["concurrency"], r["target"]), []).append(r)

    def med(rs: list[Row], key: str) -> float | None:
        values = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(values) if values else None

    out = []
    for (protocol, c, target), rs in groups.items():
        out.append(
            {
                "protocol": protocol,
                "concurrency": c,
                "target": target,
                "kind": rs[0]["kind"],
                "rounds": len(rs),
                "requests": sum(r["requests"] for r in rs),
                "ok": sum(r["ok"] for r in rs),
                "failed": sum(r["failed"] for r in rs),
                "p50_ms": med(rs, "p50_ms"),
                "p90_ms": med(rs, "p90_ms"),
                "p99_ms": med(rs, "p99_ms"),
                "p50_rounds": [round(r["p50_ms"], 1) if r["p50_ms"] is not None else None for r in rs],
                "connections_per_write": med(rs, "connections_per_write"),
                "connections_with_warmup": med(rs, "upstream_connections_with_warmup"),
                "http_versions": dict(sum((Counter(r["http_versions"]) for r in rs), Counter())),
                "load1": [r["load1"] for r in rs],
            }
        )
    for row in out:
        base = next(
            (
                b
                for b in out
                if b["target"] == "mitmdump" and (b["protocol"], b["concurrency"]) == (row["protocol"], row["concurrency"])
            ),
            None,
        )
        for q in ("p50", "p90"):
            added = None
            if base is not None and row["target"] != "mitmdump" and row[f"{q}_ms"] is not None and base[f"{q}_ms"] is not None:
                added = row[f"{q}_ms"] - base[f"{q}_ms"]
            row[f"added_{q}_ms"] = added
            row[f"added_{q}_rtt"] = added / rtt_ms if added is not None and rtt_ms > 0 else None
    order = {k: i for i, k in enumerate(KINDS)}
    out.sort(key=lambda r: (r["protocol"], r["concurrency"], order[r["kind"]], r["target"]))
    return out


def timelines(rows: list[Row], traces: dict[str, list[Row]]) -> list[Row]:
    """Per protocol and target at c=1: the relay's events during a write, relative to the agent's send."""
    out = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r["concurrency"] == 1:
            groups.setdefault((r["protocol"], r["target"]), []).append(r)
    for (protocol, target), rs in groups.items():
        events = traces.get(protocol, [])
        times = [e["t"] for e in events]
        sequences = []
        before: list[float] = []  # the agent's send -> the proxy's first upstream event (a connect, or the first byte)
        after: list[float] = []  # the answer's last byte delivered to the proxy -> the agent has the answer
        for r in rs:
            for w in r["writes"]:
                if not w["ok"]:
                    continue
                lo, hi = bisect.bisect_left(times, w["start"]), bisect.bisect_left(times, w["end"])
                seen: Counter[str] = Counter()
                seq = []
                for e in events[lo:hi]:
                    if e["ev"] not in ("open", "c2u", "u2c"):
                        continue
                    seen[e["ev"]] += 1
                    label = "connection opened" if e["ev"] == "open" else f"{e['ev']} #{seen[e['ev']]}"
                    seq.append((label, e, w))
                sequences.append(seq)
                if seq:
                    before.append((seq[0][1]["t"] - w["start"]) * 1000)
                    last_in = [e for _, e, _ in seq if e["ev"] == "u2c"]
                    if last_in:
                        after.append((w["end"] - last_in[-1]["at"]) * 1000)
        if not sequences:
            continue
        shapes = Counter(tuple(label for label, _, _ in s) for s in sequences)
        shape, count = shapes.most_common(1)[0]
        matching = [s for s in sequences if tuple(label for label, _, _ in s) == shape]
        steps = []
        for i, label in enumerate(shape):
            arrived = [(s[i][1]["t"] - s[i][2]["start"]) * 1000 for s in matching]
            delivered = [(s[i][1]["at"] - s[i][2]["start"]) * 1000 for s in matching if "at" in s[i][1]]
            sizes = [s[i][1].get("n") for s in matching if s[i][1].get("n") is not None]
            steps.append(
                {
                    "step": label,
                    "arrived_ms": statistics.median(arrived),
                    "delivered_ms": statistics.median(delivered) if delivered else None,
                    "bytes": int(statistics.median(sizes)) if sizes else None,
                }
            )
        answered = [(s[0][2]["end"] - s[0][2]["start"]) * 1000 for s in matching if s] or [
            (w["end"] - w["start"]) * 1000 for r in rs for w in r["writes"] if w["ok"]
        ]
        out.append(
            {
                "protocol": protocol,
                "target": target,
                "writes": len(sequences),
                "matching": count,
                "steps": steps,
                "answered_ms": statistics.median(answered) if answered else None,
                "before_upstream_ms": statistics.median(before) if before else None,
                "after_answer_delivered_ms": statistics.median(after) if after else None,
            }
        )
    return out


# -- the run ----------------------------------------------------------------------------------------------


def check_receipts(run: Run, targets: list[Target]) -> list[Row]:
    checks = []
    for t in targets:
        if t.db is None:
            continue
        states, transitions = settled(lambda db=t.db: db.states_under(f"/wan/{run.run_id}"), lambda read: read[0])
        ok = states == {"succeeded": t.sent} and transitions == 3 * t.sent
        reused_unknowns = t.db.reused_connection_unknowns_under(f"/wan/{run.run_id}")
        checks.append(
            {"target": t.spec, "sent": t.sent, "states": states, "transitions": transitions, "ok": ok,
             "reused_connection_unknowns": reused_unknowns}
        )
        if not ok:
            run.failures.append(f"{t.spec}: {t.sent} writes sent, receipts {states}, {transitions} transitions")
    return checks


def execute(run: Run, targets: list[Target]) -> dict[str, Any]:
    a = run.args
    (run.out / "logs").mkdir(parents=True, exist_ok=True)
    for old in (run.out / "logs").glob("trace-*.jsonl"):
        old.unlink()
    ca, cert, key = throwaway_ca(run.tmp)
    confdir = run.tmp / "confdir"
    confdir.mkdir()
    legs = [start_leg(run, p, cert, key) for p in a.protocol]
    for t in targets:  # the first (mitmdump, when given) creates the proxies' CA in confdir, the others load it
        start_target(run, t, confdir, ca)
    started = time.monotonic()
    for leg in legs:
        for c in a.concurrency:
            for r in range(a.rounds):
                for t in targets:
                    load = os.getloadavg()[0]
                    result = run_client(run, leg, t, c, r, confdir)
                    row = round_row(run, leg, t, c, r, result, load)
                    run.rounds.append(row)
                    if row["failed"]:
                        run.failures.append(
                            f"{t.spec} {leg.protocol} c={c} round {r}: {row['failed']} failed: {row['failures'][:3]}"
                        )
                    print(
                        f"  {leg.protocol} c={c} round {r + 1}/{a.rounds} {t.spec}: p50 {row['p50_ms']:.1f} ms, "
                        f"p90 {row['p90_ms']:.1f} ms, {row['ok']}/{row['requests']} ok, load {load:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
    seconds = time.monotonic() - started
    time.sleep(0.5)  # the relay writes its trace out every 0.2 s
    traces = {leg.protocol: read_trace(leg.trace) for leg in legs}
    count_connections(run.rounds, traces)
    checks = check_receipts(run, targets)
    summary = medians(run.rounds, run.rtt_ms)
    doc = {
        "ok": not run.failures,
        "failures": run.failures,
        "settings": {
            "rtt_ms": run.rtt_ms,
            "handshake_modelled": not a.no_handshake,
            "protocols": a.protocol,
            "concurrency": a.concurrency,
            "requests": a.requests,
            "warmup": a.warmup,
            "rounds": a.rounds,
            "targets": [t.spec for t in targets],
            "command": " ".join(["python bench/wan.py", *sys.argv[1:]]),
        },
        "machine": machine_info(),
        "seconds": round(seconds, 1),
        "summary": summary,
        "timelines": timelines(run.rounds, traces),
        "receipts": checks,
        "rounds": [{k: v for k, v in r.items() if k != "writes"} for r in run.rounds],
    }
    return doc


def machine_info() -> Row:
    def version(module: str) -> str | None:
        with contextlib.suppress(Exception):
            from importlib.metadata import version as v

            return v(module)
        return None

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "mitmproxy": version("mitmproxy"),
        "hypercorn": version("hypercorn"),
        "httpx": version("httpx"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "proxy_addon_dirty": bool(git("status", "--porcelain", "--", "proxy_addon")),
        "loadavg_end": os.getloadavg(),
    }


# -- the report ----------------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def signed(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{v:+.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    m = doc["machine"]
    lines = [
        f"# WAN mode: RTT {s['rtt_ms']:g} ms",
        "",
        f"`{s['command']}`: {s['requests']} measured writes per target, round and level after {s['warmup']} unmeasured, "
        f"{s['rounds']} interleaved round(s), medians of the rounds; relay RTT {s['rtt_ms']:g} ms "
        f"(TCP handshake {'modelled' if s['handshake_modelled'] else 'not modelled'}). {m['nproc']} CPUs, Python {m['python']}, "
        f"mitmproxy {m['mitmproxy']}, hypercorn {m['hypercorn']}, httpx {m['httpx']}; commit {m['git_commit'][:10]} "
        f"({m['git_branch']}{', proxy_addon/ modified' if m['proxy_addon_dirty'] else ''}); {doc['seconds']:.0f} s.",
        "",
        "| protocol | c | target | p50 ms | p90 ms | added p50 ms | added p50 RTT | added p90 ms | added p90 RTT "
        "| upstream conns/write | conns/round, warm-up incl. | agent spoke | p50 per round | ok | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for r in doc["summary"]:
        lines.append(
            f"| {r['protocol']} | {r['concurrency']} | {r['target']} | {fmt(r['p50_ms'])} | {fmt(r['p90_ms'])} "
            f"| {signed(r['added_p50_ms'])} | {signed(r['added_p50_rtt'], 2)} | {signed(r['added_p90_ms'])} "
            f"| {signed(r['added_p90_rtt'], 2)} | {fmt(r['connections_per_write'], 2)} | {fmt(r.get('connections_with_warmup'), 0)} | {', '.join(sorted(r['http_versions']))} "
            f"| {' / '.join(fmt(v) for v in r['p50_rounds'])} | {r['ok']}/{r['requests']} "
            f"| {' '.join(f'{x:.1f}' for x in r['load1'])} |"
        )
    for tl in doc["timelines"]:
        lines += [
            "",
            f"Timeline, {tl['protocol']}, c=1, {tl['target']} (ms after the agent sent the write; the median over "
            f"{tl['matching']} of {tl['writes']} writes with this sequence; answered at {fmt(tl['answered_ms'])} ms). "
            f"Over all {tl['writes']} writes, medians: the proxy's first upstream event {fmt(tl['before_upstream_ms'])} ms "
            f"after the send; the agent had its answer {fmt(tl['after_answer_delivered_ms'])} ms after the upstream's "
            "last byte reached the proxy:",
            "",
            "| relay saw | bytes | arrived at the relay | delivered |",
            "|---|---:|---:|---:|",
        ]
        for st in tl["steps"]:
            lines.append(f"| {st['step']} | {st['bytes'] or ''} | {fmt(st['arrived_ms'])} | {fmt(st['delivered_ms'])} |")
    if doc["receipts"]:
        lines += ["", "Receipts: " + "; ".join(f"{c['target']} {c['states']} of {c['sent']} sent" for c in doc["receipts"])]
        lines += [
            "Outcome unknown on a reused upstream connection (`receipts_reused_connection_unknowns_total`): "
            + "; ".join(f"{c['target']} {c['reused_connection_unknowns']}" for c in doc["receipts"])
        ]
    if doc["failures"]:
        lines += ["", "FAILURES:", *(f"- {f}" for f in doc["failures"])]
    return "\n".join(lines) + "\n"


# -- command line --------------------------------------------------------------------------------------------


def csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def argument_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt", default=None, help="round-trip time the relay adds, e.g. 20ms (default 20ms; smoke 4ms)")
    p.add_argument("--protocol", type=csv, default=None, help="h1, h2 or h1,h2 (default h1,h2)")
    p.add_argument("--requests", type=int, default=None, help="measured writes per target, level and round (default 100)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured writes before each (default 10)")
    p.add_argument("--concurrency", type=lambda t: [int(x) for x in csv(t)], default=None, help="e.g. 1,8 (default 1,8)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument(
        "--targets",
        type=lambda t: [parse_target(x) for x in csv(t)],
        default=None,
        help="mitmdump,sqlite,postgres (default); KIND@OPTION=VALUE+... adds mitmproxy options to one, "
        "KIND~KEY=VALUE+... keys of the receipts config's defaults: (e.g. sqlite~upstream_connections=fresh)",
    )
    p.add_argument("--no-handshake", action="store_true", help="the relay does not model the TCP handshake's round trip")
    p.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--out", default=str(REPO / "bench" / "results-wan"))
    p.add_argument("--smoke", action="store_true", help="tiny: RTT 4 ms, 5 writes, c=1,2, one round, mitmdump and sqlite")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and the PostgreSQL databases")
    p.add_argument("--max-runtime", type=float, default=3600.0, help="the upstream and the relay stop by themselves after this")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = argument_parser().parse_args(argv)
    smoke = args.smoke
    defaults: dict[str, Any] = {
        "rtt": "4ms" if smoke else "20ms",
        "protocol": ["h1", "h2"],
        "requests": 5 if smoke else 100,
        "warmup": 2 if smoke else 10,
        "concurrency": [1, 2] if smoke else [1, 8],
        "rounds": 1 if smoke else 3,
    }
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.targets is None:
        specs = ["mitmdump", "sqlite"] if smoke else ["mitmdump", "sqlite", "postgres"]
        args.targets = [parse_target(x) for x in specs]
    for p in args.protocol:
        if p not in ("h1", "h2"):
            raise SystemExit(f"--protocol: {p!r} is not h1 or h2")
    if [t.key for t in args.targets].count("mitmdump") != 1:
        raise SystemExit("--targets: exactly one plain mitmdump, the baseline")
    if len({t.key for t in args.targets}) != len(args.targets):
        raise SystemExit("--targets: each target once")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if any(t.kind == "postgres" for t in args.targets) and (why := pg_unavailable(args.pg_admin_url)):
        raise SystemExit(f"PostgreSQL at {args.pg_admin_url} unavailable ({why}); leave postgres out of --targets")
    # mitmdump first: it creates the CA in the shared confdir
    args.targets.sort(key=lambda t: t.kind != "mitmdump")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="receipts-wan-"))
    run = Run(args, out, tmp, uuid.uuid4().hex[:8], parse_duration_ms(args.rtt))
    try:
        doc = execute(run, args.targets)
    except BenchError as e:
        print(f"wan: {e}", file=sys.stderr)
        return 1
    finally:
        run.procs.stop_all()
        if not args.keep:
            for t in args.targets:
                if t.kind == "postgres" and t.db is not None:
                    with contextlib.suppress(Exception):
                        pg_drop(args.pg_admin_url, pg_database(t))
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    (out / "wan.json").write_text(json.dumps(doc, indent=1))
    report = markdown(doc)
    (out / "wan.md").write_text(report)
    print(report)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
