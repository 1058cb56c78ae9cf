"""The WAN mode: what a journaled HTTPS write costs when the upstream is a round trip away.

    python bench/wan/run.py --rtt 20ms --protocol h1,h2 --requests 200 --concurrency 1,8 --rounds 3 --out /tmp/wan
    python bench/wan/run.py --smoke --out /tmp/wan-smoke     # a few seconds; what tests/e2e/test_bench_smoke.py runs

Between the proxies and the upstream sits bench/wan/relay.py, a TCP relay on 127.0.0.1 that delays each direction
by rtt/2 (and a new connection's first bytes by its TCP handshake's round trip). The upstream is
bench/wan/upstream.py (hypercorn, HTTPS with a certificate of a throw-away CA that the proxies trust through
mitmproxy's `ssl_verify_upstream_trusted_ca`): `--protocol h1` offers only HTTP/1.1, `h2` offers h2 and
HTTP/1.1. The agent is bench/wan/client.py: one httpx client, kept alive, tunnelling with CONNECT and TLS
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
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.core.certs import throwaway_ca
from bench.core.databases import Db, migrate, pg_drop, pg_unavailable, settled
from bench.core.processes import (
    REPO,
    BenchError,
    bench_env,
    free_port,
    log_tail,
    read_line,
    receipts_cmd,
    tool,
    wait_port,
    write_proxy_config,
)
from bench.wan.relay import parse_duration_ms
from bench.wan.report import count_connections, machine_info, markdown, medians, percentile, read_trace, timelines
from bench.wan.targets import Leg, Run, Target, parse_target

WAN = Path(__file__).resolve().parent  # the relay, the upstream and the agent run from here
Row = dict[str, Any]


# -- processes ---------------------------------------------------------------------------------------------


def start_leg(run: Run, protocol: str, cert: Path, key: Path) -> Leg:
    logs = run.out / "logs"
    life = str(run.args.max_runtime)
    up_log = logs / f"upstream-{protocol}.log"
    up = run.procs.start(
        [sys.executable, WAN / "upstream.py", "--cert", cert, "--key", key, "--alpn", protocol, "--max-lifetime", life],
        up_log,
        env=bench_env(),
        stdout=subprocess.PIPE,
    )
    line = read_line(up, 30)
    if not line.startswith("LISTENING "):
        raise BenchError(f"upstream said {line!r}{log_tail(up_log)}")
    upstream_port = int(line.split()[1])
    trace = logs / f"trace-{protocol}.jsonl"
    relay_cmd = [sys.executable, WAN / "relay.py", "--target", f"127.0.0.1:{upstream_port}", "--rtt", f"{run.rtt_ms}ms"]
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
        str(WAN / "client.py"),
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
            "command": " ".join(["python bench/wan/run.py", *sys.argv[1:]]),
        },
        "machine": machine_info(),
        "seconds": round(seconds, 1),
        "summary": summary,
        "timelines": timelines(run.rounds, traces),
        "receipts": checks,
        "rounds": [{k: v for k, v in r.items() if k != "writes"} for r in run.rounds],
    }
    return doc


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
