"""The interleaved rounds: every target started once, then, for each concurrency level and each round, each
target in turn, so that the machine's noise (2 shared cores) falls on all targets alike; per target and
level, the median of its rounds."""

import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.core.processes import BenchError
from bench.loopback.levels import TargetRun, progress_line
from bench.loopback.session import Row, Session
from bench.loopback.targets import TARGETS

# The worst of the rounds, not their median: memory only grows, and a goal is about the worst level.
WORST_KEYS = ("peak_rss_mib", "rss_end_mib", "rss_max_sampled_mib", "rss_growth_in_level_mib", "threads", "max_ms")
# A level's own figures that a median of several levels does not keep (results.json's "rounds" has them).
ROUND_ONLY_KEYS = ("round", "rss_timeline_mib", "rss_samples", "pid", "gone", "port", "clients", "error_kinds", "verify")


def run_interleaved(session: Session) -> None:
    """Every target on an empty history, `--rounds` times per level, interleaved; medians into session.runs."""
    args = session.args
    started: list[TargetRun] = []
    try:
        for key in args.targets:
            run = TargetRun(session, TARGETS[key], 0)
            started.append(run)
            if not guarded(session, run, "start", run.start)[0]:
                run.stop()
        live = [run for run in started if run.procs or run.target.kind == "direct"]
        for concurrency in args.concurrency:
            rows: dict[str, list[Row]] = {run.target.key: [] for run in live}
            for round_no in range(args.rounds):
                for run in list(live):
                    _, row = guarded(session, run, f"c{concurrency} round {round_no}", partial(run.level, concurrency, round_no))
                    if row is None:
                        live.remove(run)
                        run.stop()
                        continue
                    session.rounds.append(row)
                    rows[run.target.key].append(row)
                    print(f"  {progress_line(row)}", flush=True)
            for measured in rows.values():
                if measured:
                    median = median_row(measured)
                    session.runs.append(median)
                    if args.rounds > 1:
                        print(f"  {progress_line(median)} (median)", flush=True)
        for run in live:
            guarded(session, run, "final checks", run.finish)
    finally:
        for run in started:
            run.stop()


def guarded[T](session: Session, run: TargetRun, what: str, step: Callable[[], T]) -> tuple[bool, T | None]:
    """(True, step()); on a failure, recorded (the target then stops, the run goes on with the others), (False, None)."""
    try:
        return True, step()
    except Exception as e:  # a BenchError, a driver or an OS error: record it, drop this target, go on
        message = str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"
        session.failures.append(f"{run.target.label} {what}: {message}")
        print(f"  {run.target.label} {what}: FAILED: {message}", flush=True)
        return False, None


def median_row(rows: list[Row]) -> Row:
    """One target's rounds at one level as one row: medians of the rates, latencies and CPU, the worst memory,
    the requests, successes and errors summed, the receipts checks all of them; `*_rounds` lists each round's."""
    first = rows[0]
    out: Row = {k: first[k] for k in ("target", "label", "concurrency", "growth")}
    out["rounds"] = len(rows)
    out.update(medians(rows, ("rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "elapsed_s", "loadavg_1m")))
    for key in ("requests", "ok", "errors"):
        out[key] = sum(r[key] for r in rows)
    out["error_kinds"] = summed([r["error_kinds"] for r in rows])
    for key in ("rps", "p50_ms", "p99_ms"):
        out[f"{key}_rounds"] = [r[key] for r in rows]
    for key in ("proxy", "writer", "postgres_server"):
        parts = [r[key] for r in rows if r.get(key)]
        out[key] = medians(parts, parts[0].keys()) if parts else None
    out["proxy_writer_cpu_ms_per_request"] = medians(rows, ("proxy_writer_cpu_ms_per_request",))[
        "proxy_writer_cpu_ms_per_request"
    ]
    if first.get("proxies"):
        out["proxies"] = [proxy_median([r["proxies"][i] for r in rows]) for i in range(len(first["proxies"]))]
    if any("verify" in r for r in rows):
        checks = [r["verify"] for r in rows]
        out["verify"] = {
            "ok": all(v["ok"] for v in checks),
            "states": summed([v["states"] for v in checks]),
            "transitions": sum(v["transitions"] for v in checks),
            "expected_succeeded": sum(v["expected_succeeded"] for v in checks),
        }
    return out


def proxy_median(rounds: list[Row]) -> Row:
    """One proxy of several (target (e)) across the rounds."""
    out: Row = {"ok": sum(r["ok"] for r in rounds)}
    for key in ("proxy", "writer"):
        parts = [r[key] for r in rounds if r.get(key)]
        out[key] = medians(parts, parts[0].keys()) if parts else None
    out.update(medians(rounds, ("proxy_writer_cpu_ms_per_request",)))
    return out


def medians(rows: list[Row], keys: Any) -> Row:
    """Per key, the median (or for WORST_KEYS the maximum) of the rows' numbers; None if none has one."""
    out: Row = {}
    for key in keys:
        if key in ROUND_ONLY_KEYS:
            continue
        values = [r.get(key) for r in rows]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if not numbers:
            if all(v is None or isinstance(v, int | float) for v in values):
                out[key] = None
            elif isinstance(values[0], str):
                out[key] = values[0]
            continue
        value = max(numbers) if key in WORST_KEYS else statistics.median(numbers)
        if isinstance(value, float):
            value = int(value) if value.is_integer() and all(isinstance(n, int) for n in numbers) else round(value, 3)
        out[key] = value
    return out


def summed(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
