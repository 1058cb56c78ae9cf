"""The WAN mode's figures and report: the medians of the rounds, the upstream connections the relay saw per
write, the relay's timeline of a write, where the numbers come from, and `wan.md`."""

import bisect
import contextlib
import json
import os
import platform
import statistics
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from bench.core.processes import REPO
from bench.wan.targets import KINDS

Row = dict[str, Any]


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
