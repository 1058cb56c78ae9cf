"""The results document (results.json) and its Markdown report: the tables, the ratios to (b), the goals."""

from typing import Any

from bench.core.machine import machine
from bench.loopback.session import Row, Session
from bench.loopback.targets import RECEIPTS_TARGETS, TARGETS

MiB = 1024 * 1024


def document(session: Session, seconds: float) -> dict[str, Any]:
    args = session.args
    return {
        "meta": machine(args, session.run_id, seconds),
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "growth": args.growth,
            "targets": args.targets,
            "smoke": args.smoke,
            "body": "POST, ~90-byte unique JSON; upstream answers 201 with a ~20-byte JSON body",
        },
        "runs": session.runs,
        "rounds": session.rounds,
        "targets": session.targets_info,
        "ratios": ratios(session.runs),
        "goals": goals(session.runs),
        "growth": session.growth,
        "profiles": [dict(p) for p in session.profiles],
        "failures": session.failures,
        "ok": not session.failures,
    }


def find_run(runs: list[Row], target: str, concurrency: int) -> Row | None:
    """The run of `target` at `concurrency` on an empty history (the median of its rounds)."""
    return next((r for r in runs if r["target"] == target and r["concurrency"] == concurrency and r["growth"] == 0), None)


def ratios(runs: list[Row]) -> list[Row]:
    """Each receipts target against (b) mitmdump at the same concurrency, from the medians of their rounds."""
    out = []
    for c in sorted({r["concurrency"] for r in runs}):
        b = find_run(runs, "mitmdump", c)
        if not b or not b["rps"]:
            continue
        for key in RECEIPTS_TARGETS:
            x = find_run(runs, key, c)
            if not x:
                continue
            out.append(
                {
                    "target": key,
                    "vs": "mitmdump",
                    "concurrency": c,
                    "throughput_ratio": round(x["rps"] / b["rps"], 3),
                    "added_p50_ms": difference(x["p50_ms"], b["p50_ms"]),
                    "added_p99_ms": difference(x["p99_ms"], b["p99_ms"]),
                }
            )
    return out


def difference(x: float | None, b: float | None) -> float | None:
    return None if x is None or b is None else round(x - b, 3)


# the performance targets (docs/performance.md, "Targets, met or missed"), by target: throughput at c=32 as a share
# of mitmdump's, added p50 at c=1 in ms
TARGET_RATIO = {"sqlite": 0.8, "postgres": 0.6, "postgres-2": 0.6}
TARGET_ADDED_P50_MS = {"sqlite": 1.5, "postgres": 3.0, "postgres-2": 3.0}


def goals(runs: list[Row]) -> list[Row]:
    """The issue's targets (TARGET_RATIO, TARGET_ADDED_P50_MS), and flat memory."""
    out = []
    rs = ratios(runs)
    for key in RECEIPTS_TARGETS:
        for r in rs:
            if r["target"] == key and r["concurrency"] == 32:
                ratio, wanted = r["throughput_ratio"], TARGET_RATIO[key]
                out.append(goal(key, f"throughput >= {wanted} x mitmdump at c=32", ratio, ratio >= wanted))
            if r["target"] == key and r["concurrency"] == 1 and r["added_p50_ms"] is not None:
                added, most = r["added_p50_ms"], TARGET_ADDED_P50_MS[key]
                out.append(goal(key, f"added p50 <= {most} ms at c=1", added, added <= most))
        proxies = [r["proxy"] for r in runs if r["target"] == key and r.get("proxy")]
        growths = [p["rss_growth_in_level_mib"] for p in proxies if p.get("rss_growth_in_level_mib") is not None]
        if growths:
            worst = max(growths)
            out.append(
                goal(key, "memory flat (RSS growth within each level <= 2 MiB)", worst, worst <= 2.0)
                | {"note": "a heuristic over one level's samples; a long soak is the real test"}
            )
    return out


def goal(target: str, text: str, value: float, met: bool) -> Row:
    return {"target": target, "goal": text, "value": value, "met": met}


def markdown(doc: dict[str, Any]) -> str:
    lines = header(doc) + runs_table(doc) + cpu_table(doc) + proxies_table(doc) + goals_table(doc) + memory_table(doc)
    lines += growth_table(doc)
    lines += profile_lines(doc)
    verified = "every level's receipts matched (N succeeded, 3N transitions)" if doc["ok"] else "FAILED"
    lines += ["", "verification: " + verified]
    lines += [f"- {f}" for f in doc["failures"]]
    return "\n".join(lines)


def header(doc: dict[str, Any]) -> list[str]:
    m, s, v = doc["meta"], doc["settings"], doc["meta"]["versions"]
    postgresql = f", PostgreSQL {v['postgresql']}" if "postgresql" in v else ""
    modified = " (proxy_addon modified)" if m["git"].get("dirty") else ""
    return [
        f"## receipts benchmark ({'smoke' if s['smoke'] else 'full'}), run {m['run_id']}",
        "",
        (
            f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {v.get('python')}, mitmproxy "
            f"{v.get('mitmproxy')}, SQLite {v.get('sqlite')}{postgresql}"
            f"; load average at end {m['loadavg_at_end']}; git {m['git'].get('commit')}{modified}"
        ),
        f"{s['requests']} POSTs per level after {s['warmup']} warm-up; {m['durability']}.",
        rounds_line(s.get("rounds", 1)),
        "",
    ]


def rounds_line(rounds: int) -> str:
    if rounds == 1:
        return "One round: each target measured once per level."
    return (
        f"{rounds} rounds, interleaved (per level, each target in turn, {rounds} times): req/s, latencies and CPU "
        "are the medians of the rounds (req/s rounds: each round's), ratios to (b) from the medians."
    )


def runs_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        (
            "| target | c | req/s | req/s rounds | p50 ms | p99 ms | errors | proxy peak RSS MiB | proxy CPU ms/req "
            "| vs (b) req/s | added p50 ms vs (b) |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratio = {(r["target"], r["concurrency"]): r for r in doc["ratios"]}
    for r in sorted_runs(doc["runs"]):
        p = r.get("proxy") or {}
        rr = ratio.get((r["target"], r["concurrency"]))
        lines.append(
            f"| {r['label']} | {r['concurrency']} | {r['rps']:.0f} | {each_round(r)} | {ms(r['p50_ms'])} | {ms(r['p99_ms'])} "
            f"| {r['errors']} | {p.get('peak_rss_mib', '')} | {p.get('cpu_ms_per_request', '')} | "
            f"{rr['throughput_ratio'] if rr else ''} | {ms(rr['added_p50_ms']) if rr else ''} |"
        )
    return lines


def each_round(run: Row) -> str:
    rounds = run.get("rps_rounds") or []
    return " / ".join(f"{x:.0f}" for x in rounds) if len(rounds) > 1 else ""


def proxies_table(doc: dict[str, Any]) -> list[str]:
    """The targets with several proxies, (e): each proxy's share of the load and CPU per its own requests."""
    runs = [r for r in sorted_runs(doc["runs"]) if r.get("proxies")]
    if not runs:
        return []
    lines = [
        "",
        "| several proxies: target | c | proxy | requests ok (all rounds) | proxy CPU ms/req | writer CPU ms/req | proxy+writer CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for i, p in enumerate(r["proxies"], start=1):
            proxy, writer = p.get("proxy") or {}, p.get("writer") or {}
            lines.append(
                f"| {r['label']} | {r['concurrency']} | {i} | {p['ok']} | {cell(proxy.get('cpu_ms_per_request'))} "
                f"| {cell(writer.get('cpu_ms_per_request'))} | {cell(p.get('proxy_writer_cpu_ms_per_request'))} |"
            )
    return lines


def cpu_table(doc: dict[str, Any]) -> list[str]:
    """CPU per request of each proxy, its journal writer (empty if it runs none) and the PostgreSQL server."""
    runs = [r for r in sorted_runs(doc["runs"]) if r.get("proxy")]
    if not runs:
        return []
    lines = [
        "",
        (
            "| CPU per request | c | proxy CPU ms/req | writer CPU ms/req | proxy+writer CPU ms/req | writer peak RSS MiB "
            "| PostgreSQL CPU ms/req |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        writer = r.get("writer") or {}
        server = r.get("postgres_server") or {}
        lines.append(
            f"| {r['label']} | {r['concurrency']} | {cell(r['proxy'].get('cpu_ms_per_request'))} "
            f"| {cell(writer.get('cpu_ms_per_request'))} | {cell(r.get('proxy_writer_cpu_ms_per_request'))} "
            f"| {cell(writer.get('peak_rss_mib'))} | {cell(server.get('cpu_ms_per_request'))} |"
        )
    return lines


def sorted_runs(runs: list[Row]) -> list[Row]:
    """By concurrency, then in target order."""
    return sorted(runs, key=lambda r: (r["concurrency"], list(TARGETS).index(r["target"])))


def cell(v: object) -> str:
    return "" if v is None else str(v)


def goals_table(doc: dict[str, Any]) -> list[str]:
    if not doc["goals"]:
        return []
    lines = ["", "| goal | target | value | met |", "|---|---|---:|---|"]
    for g in doc["goals"]:
        lines.append(f"| {g['goal']} | {g['target']} | {g['value']} | {'yes' if g['met'] else 'NO'} |")
    return lines


def memory_table(doc: dict[str, Any]) -> list[str]:
    proxies = [v for v in doc["targets"].values() if v.get("peak_rss_mib")]
    if not proxies:
        return []
    lines = [
        "",
        "| proxy process | idle RSS MiB | peak RSS MiB (VmHWM) | RSS at end MiB | requests through it |",
        "|---|---:|---:|---:|---:|",
    ]
    for v in proxies:
        for i, p in enumerate(v.get("proxies") or [v], start=1):
            which = f", proxy {i}" if v.get("proxies") else ""
            sent = "" if i > 1 else f"{v.get('requests_sent', '')}{' (all its proxies)' if which else ''}"
            lines.append(
                f"| {v['label']} (history {v['growth']}{which}) | {p.get('rss_idle_mib', '')} | {p.get('peak_rss_mib', '')} "
                f"| {p.get('rss_end_mib', '')} | {sent} |"
            )
    return lines


def growth_table(doc: dict[str, Any]) -> list[str]:
    if not doc["growth"]:
        return []
    lines = [
        "",
        "| growth: target | receipts already stored | c | req/s | p50 ms | p99 ms | errors | seed s | db MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(doc["growth"], key=lambda r: (r["target"], r["concurrency"], r["growth"])):
        seed = doc["targets"].get(f"{r['target']}/g{r['growth']}", {}).get("seed", {})
        size = seed.get("db_bytes")
        lines.append(
            f"| {r['label']} | {r['growth']:,} | {r['concurrency']} | {r['rps']:.0f} | {ms(r['p50_ms'])} "
            f"| {ms(r['p99_ms'])} | {r['errors']} | {seed.get('seconds', '')} | {round(size / MiB) if size else ''} |"
        )
    skipped = [v for v in doc["targets"].values() if v.get("skipped")]
    lines += [f"- skipped: {v['label']} history {v['growth']}: {v['skipped']}" for v in skipped]
    return lines


def profile_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for p in doc["profiles"]:
        top = ", ".join(f"{x['name']} {x['percent']}%" for x in p["summary"]["self"][:8])
        lines += [
            "",
            (f"profile of {p['target']} ({p['mode']}, {p['seconds']} s, {p['summary']['samples']} samples), self time: {top}"),
        ]
    return lines


def ms(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"
