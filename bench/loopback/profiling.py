"""py-spy recordings of the receipts proxy under concurrency-32 load, summarised per component."""

import subprocess
import time
from pathlib import Path

from bench.core.processes import Process, log_tail, tool
from bench.loopback import profile_summary
from bench.loopback.session import Session
from bench.loopback.targets import Target

SAMPLES_PER_SECOND = 100
LOAD_CONCURRENCY = 32
REQUESTS_PER_LOAD = 500
MAX_LOADS = 100


def profile(session: Session, target: Target, pid: int, port: int) -> int:
    """py-spy the proxy under load twice: every busy thread, then only the GIL holder.

    Returns how many requests were sent (all journaled, so the final receipt count includes them).
    """
    return sum(record(session, target, pid, port, mode) for mode in ("active", "gil"))


def record(session: Session, target: Target, pid: int, port: int, mode: str) -> int:
    seconds = session.args.profile
    raw = session.out / f"profile-{target.key}-{mode}.txt"
    raw.unlink(missing_ok=True)
    log = session.logs / f"py-spy-{target.key}-{mode}.log"
    spy = session.procs.start(py_spy_cmd(pid, seconds, raw, gil_only=mode == "gil"), log)
    sent = 0
    try:
        time.sleep(1.0)  # py-spy attaches
        sent = load_while_recording(session, target, port, mode, spy)
        spy.wait(seconds + 30)
    except subprocess.TimeoutExpired:
        session.failures.append(f"py-spy ({mode}) did not finish")
    finally:
        session.procs.stop(spy)
    if not raw.exists():
        session.failures.append(f"py-spy ({mode}) wrote no profile{log_tail(log)}")
        return sent
    summarise(session, target, mode, raw)
    return sent


def py_spy_cmd(pid: int, seconds: int, raw: Path, gil_only: bool) -> list[str]:
    cmd = [
        tool("py-spy"),
        "record",
        *("--pid", str(pid), "--duration", str(seconds), "--rate", str(SAMPLES_PER_SECOND)),
        *("--format", "raw", "--threads", "--output", str(raw)),
    ]
    return cmd + (["--gil"] if gil_only else [])


def load_while_recording(session: Session, target: Target, port: int, mode: str, spy: Process) -> int:
    """Rounds of load until py-spy's duration is over, bounded by time and count; returns the requests sent."""
    deadline = time.monotonic() + session.args.profile + 1
    sent = 0
    for i in range(MAX_LOADS):
        if time.monotonic() >= deadline or spy.poll() is not None:
            break
        prefix = f"/profile/{session.run_id}/{target.key}/{mode}/{i}"
        result = session.load(port, True, REQUESTS_PER_LOAD, LOAD_CONCURRENCY, prefix, True)
        sent += result["requests"]
        if result["errors"]:
            session.failures.append(f"profile load on {target.label}: {result['errors']} errors {result['error_kinds']}")
    return sent


def summarise(session: Session, target: Target, mode: str, raw: Path) -> None:
    seconds = session.args.profile
    summary = profile_summary.summarise(raw, SAMPLES_PER_SECOND, seconds)
    sampled = "--gil (GIL holder only)" if mode == "gil" else "(all busy threads)"
    title = f"receipts proxy on {target.db}, c=32, {seconds} s, py-spy {sampled}: "
    (session.out / f"profile-{target.key}-{mode}.md").write_text(profile_summary.as_markdown(summary, title))
    session.profiles.append({"target": target.key, "mode": mode, "seconds": seconds, "raw": str(raw), "summary": summary})
    print(f"  profiled {target.label} ({mode}) for {seconds}s: {summary['samples']} samples -> {raw}", flush=True)
