"""Summarise a py-spy raw (collapsed-stack) profile of the receipts proxy: where does the time go?

    python bench/loopback/profile_summary.py /tmp/profile.txt [--json] [--rate 100 --seconds 15]

Input lines look like `thread (TID): NAME;func (file.py:12);func (other.py:3) COUNT` (py-spy record
-f raw --threads). Two views:
- self: each sample goes to the innermost frame that belongs to a known component; frames of the
  standard library (json, asyncio, ssl, ...) count for the component that called them, and a stack made
  only of standard-library frames is the event loop or the thread pool waiting/plumbing. Database time
  is split into waiting for SQLite's write lock (BEGIN IMMEDIATE), commit, statement execution, and
  SQLAlchemy's own Python;
- inclusive: the share of samples with at least one frame of a component anywhere on the stack.
Both are also split by thread (mitmproxy's event loop is MainThread; the journal pool is receipts-journal_N).
Recorded with --gil, the samples are the threads holding the GIL, i.e. where the one usable core goes.
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

Frame = tuple[str, str]  # (function, file)

# (category, parts of the file path); checked on each frame from the leaf upwards, first match wins
COMPONENTS: list[tuple[str, tuple[str, ...]]] = [
    ("receipts: rules/fingerprint.py", ("proxy_addon/rules/fingerprint.py",)),
    ("receipts: rules/intent.py, rules/verdicts.py, rules/duplicates.py", ("proxy_addon/rules/intent.py", "proxy_addon/rules/verdicts.py", "proxy_addon/rules/duplicates.py")),
    ("receipts: store/", ("proxy_addon/store/",)),
    ("receipts: request/sender.py", ("proxy_addon/request/sender.py",)),
    ("receipts: addons/receipts.py, request/handler.py, rules/answers.py", ("proxy_addon/addons/receipts.py", "proxy_addon/request/handler.py", "proxy_addon/rules/answers.py")),
    ("receipts: rules/account.py", ("proxy_addon/rules/account.py",)),
    ("receipts: recovery.py (heartbeat)", ("proxy_addon/recovery.py",)),
    ("receipts: db.py", ("proxy_addon/db.py",)),
    ("receipts: config/log", ("proxy_addon/config.py", "proxy_addon/log.py")),
    ("structlog (logging)", ("structlog/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("psycopg", ("psycopg/", "psycopg_binary/", "psycopg_pool/")),
    (
        "h11 and stream I/O, or httpx/httpcore (sending upstream)",
        ("httpx/", "httpcore/", "h11/", "anyio/", "sniffio/", "certifi/"),
    ),
    ("mitmproxy", ("mitmproxy/", "mitmproxy_rs/")),
    ("pydantic", ("pydantic/", "pydantic_core/")),
]
# proxy_addon/cli/ only starts the event loop: a stack whose innermost known frame is in cli/ is the loop
ROOT_ONLY = ("proxy_addon/cli/",)

BEGIN_WAIT = "DB: BEGIN IMMEDIATE (waiting for SQLite's write lock)"
COMMIT = "DB: commit (WAL write + fsync, or server round trip)"
EXECUTE = "DB: statement execute in the driver"
SA_PYTHON = "SQLAlchemy Python (compile, cache keys, rows)"
PG_WAIT = "psycopg (execute, wait for the server)"
LOOP = "event loop (asyncio, select) idle/plumbing"
POOL = "thread pool plumbing"
POOL_IDLE = "journal thread idle, waiting for work (py-spy counts it busy)"


def _fn(frame: Frame) -> str:
    """`Class.method` -> `method`."""
    return frame[0].rsplit(".", 1)[-1]


def _has(frames: list[Frame], names: set[str], part: str = "") -> bool:
    return any(_fn(f) in names and part in f[1] for f in frames)


def _any_file(frames: list[Frame], *parts: str) -> bool:
    return any(p in f[1] for f in frames for p in parts)


INCLUSIVE: list[tuple[str, Any]] = [
    ("mitmproxy (any frame)", lambda fs: _any_file(fs, "mitmproxy/")),
    ("receipts request hook, event-loop side", lambda fs: _has(fs, {"request"}, "proxy_addon/addons/receipts.py")),
    (
        "journal threads: _record + _record_verdict",
        lambda fs: _has(fs, {"_record", "<lambda>"}, "proxy_addon/request/handler.py") and _any_file(fs, "concurrent/futures"),
    ),
    ("build_intent (fingerprint, redaction, account)", lambda fs: _has(fs, {"build_intent"})),
    ("store: decide + planned insert + commit", lambda fs: _has(fs, {"_record"}, "proxy_addon/store/receipts.py")),
    ("store: submitted and verdict (compare-and-set)", lambda fs: _has(fs, {"apply"}, "proxy_addon/store/receipts.py")),
    (BEGIN_WAIT, lambda fs: _has(fs, {"_on_begin"}, "proxy_addon/db.py")),
    (COMMIT, lambda fs: _has(fs, {"do_commit"})),
    ("SQLAlchemy (any frame)", lambda fs: _any_file(fs, "sqlalchemy/")),
    ("sender.send_once (the upstream send)", lambda fs: _has(fs, {"send_once"})),
    ("h11 or httpx/httpcore (any frame)", lambda fs: _any_file(fs, "httpx/", "httpcore/", "h11/")),
    ("structlog (any frame)", lambda fs: _any_file(fs, "structlog/")),
    ("heartbeat / recovery sweep", lambda fs: _any_file(fs, "proxy_addon/recovery.py")),
]


def parse_line(line: str) -> tuple[str, list[Frame], int] | None:
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if not stack or not count.isdigit():
        return None
    parts = stack.split(";")
    thread = "?"
    if parts and parts[0].startswith("thread ("):
        head = parts.pop(0)
        thread = head.partition("): ")[2] or head
    frames: list[Frame] = []
    for p in parts:
        m = _FRAME.match(p)
        frames.append((m.group("func"), m.group("file")) if m else (p, ""))
    return re.sub(r"_\d+$", "_N", thread), frames, int(count)


def self_category(frames: list[Frame]) -> str:
    for func, file in reversed(frames):
        if any(p in file for p in ROOT_ONLY):
            break
        for category, parts in COMPONENTS:
            if not any(p in file for p in parts):
                continue
            if category == "SQLAlchemy":
                if _has(frames, {"_on_begin"}, "proxy_addon/db.py"):
                    return BEGIN_WAIT
                if _has(frames, {"do_commit"}):
                    return COMMIT
                if func.rsplit(".", 1)[-1] in ("do_execute", "do_executemany"):
                    return EXECUTE
                return SA_PYTHON
            if category == "psycopg":
                return COMMIT if _has(frames, {"do_commit"}) else PG_WAIT
            return category
    if _any_file(frames, "asyncio/", "selectors.py"):
        return LOOP
    if frames and _fn(frames[-1]) == "_worker" and "concurrent/futures/thread.py" in frames[-1][1]:
        return POOL_IDLE
    if _any_file(frames, "concurrent/futures", "threading.py", "queue.py"):
        return POOL
    return "other (stdlib)"


def summarise(path: str | Path, rate: float | None = None, seconds: float | None = None) -> dict[str, Any]:
    total = 0
    by_self: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    by_thread_self: dict[str, Counter[str]] = {}
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        thread, frames, count = parsed
        total += count
        category = self_category(frames)
        by_self[category] += count
        by_thread[thread] += count
        by_thread_self.setdefault(thread, Counter())[category] += count
        for name, predicate in INCLUSIVE:
            if predicate(frames):
                inclusive[name] += count
        if frames:
            leaves[f"{frames[-1][0]} ({frames[-1][1]})"] += count

    def pct(c: Counter[str], of: int, top: int | None = None) -> list[dict[str, Any]]:
        if not of:
            return []
        return [{"name": k, "samples": v, "percent": round(100.0 * v / of, 1)} for k, v in c.most_common(top)]

    return {
        "samples": total,
        # samples / (rate x seconds): how many threads were busy on average, in py-spy's sense of busy
        "busy_threads": round(total / (rate * seconds), 2) if rate and seconds else None,
        "self": pct(by_self, total),
        "inclusive": [
            {"name": n, "samples": inclusive[n], "percent": round(100.0 * inclusive[n] / total, 1) if total else 0.0}
            for n, _ in INCLUSIVE
        ],
        "threads": pct(by_thread, total),
        "threads_self": {t: pct(c, by_thread[t], 10) for t, c in by_thread_self.items()},
        "top_leaf_frames": pct(leaves, total, 15),
    }


def as_markdown(summary: dict[str, Any], title: str = "") -> str:
    busy = f", {summary['busy_threads']} threads busy on average" if summary.get("busy_threads") is not None else ""
    out = [f"{title}py-spy samples: {summary['samples']}{busy}; percentages of all samples", ""]
    out += ["| self time, by component | % |", "|---|---:|"]
    out += [f"| {r['name']} | {r['percent']} |" for r in summary["self"]]
    out += ["", "| inclusive (stack contains) | % |", "|---|---:|"]
    out += [f"| {r['name']} | {r['percent']} |" for r in summary["inclusive"]]
    out += ["", "| thread | % of samples |", "|---|---:|"]
    out += [f"| {r['name']} | {r['percent']} |" for r in summary["threads"]]
    for thread, rows in summary["threads_self"].items():
        out += ["", f"| {thread}: self time | % of the thread's samples |", "|---|---:|"]
        out += [f"| {r['name']} | {r['percent']} |" for r in rows]
    out += ["", "| hottest leaf frames | % |", "|---|---:|"]
    out += [f"| `{r['name']}` | {r['percent']} |" for r in summary["top_leaf_frames"]]
    return "\n".join(out) + "\n"


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", help="a `py-spy record -f raw --threads` output file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of Markdown")
    p.add_argument("--rate", type=float, help="the sampling rate used, to report busy threads")
    p.add_argument("--seconds", type=float, help="the recording's duration, to report busy threads")
    args = p.parse_args()
    summary = summarise(args.raw, args.rate, args.seconds)
    print(json.dumps(summary, indent=2) if args.json else as_markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
