"""How long each verdict took to commit after its hand-over, read from a bench run's proxy logs.

Every committed verdict's log line (`receipt_<state>`, request/recording.py) carries `commit_ms` (hand-over to
commit) and `answered`: `before` (answer first: the agent had its answer while the journal still said
`submitted`, so this is the lag between what the agent was told and the journal) or `after` (the agent waited for
it). Run the loopback bench once per concurrency so that each log holds one level:

    .venv/bin/python bench/loopback/run.py --requests 2000 --concurrency 1 --rounds 3 --targets mitmdump,sqlite,postgres --no-chart --out /tmp/lag-c1
    .venv/bin/python bench/loopback/verdict_lag.py /tmp/lag-c1 /tmp/lag-c32

Prints a Markdown table: per run and proxy log, per `answered`, the count and p50 / p99 / max in ms.
"""

import argparse
import json
import sys
from pathlib import Path


def lags(log: Path) -> dict[str, list[float]]:
    """The commit_ms of every verdict in this log, by `answered`."""
    found: dict[str, list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"commit_ms"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if str(event.get("event", "")).startswith("receipt_") and "commit_ms" in event:
            found.setdefault(str(event.get("answered")), []).append(float(event["commit_ms"]))
    return found


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(runs: list[Path]) -> list[str]:
    rows = ["| run | proxy log | answered | verdicts | p50 ms | p99 ms | max ms |", "|---|---|---|---:|---:|---:|---:|"]
    for run in runs:
        for log in sorted((run / "logs").glob("*.log")):
            for answered, values in sorted(lags(log).items()):
                rows.append(
                    f"| {run.name} | {log.stem} | {answered} | {len(values)} | {quantile(values, 0.5):.2f} | "
                    f"{quantile(values, 0.99):.2f} | {max(values):.2f} |"
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench/loopback/run.py --out directories")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "logs").is_dir()]
    if missing:
        print(f"verdict_lag: no logs/ in {', '.join(missing)}", file=sys.stderr)
        return 2
    print("\n".join(table(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
