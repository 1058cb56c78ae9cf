"""What each real SDK's own retry did, per SDK x service x fault x path (no proxy, proxy refusing, proxy waiting):
the upstream effects counted on the server and what the SDK call returned. The e2e conftest prints the table at
the end of the run; `python -m support.sdk_results FILE` prints a saved one."""

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MODES = ("direct", "refuse", "wait")
HEADINGS = {"direct": "no proxy", "refuse": "proxy, in_flight refuse", "wait": "proxy, in_flight wait"}
SAVED = Path(__file__).resolve().parents[1] / "artifacts" / "sdk_retries.json"


@dataclass(frozen=True)
class Outcome:
    sdk: str
    service: str
    fault: str  # how the retry was provoked: delay (read timeout), reset, 500, or a proxy kill
    mode: str  # one of MODES
    effects: int  # upstream effects, counted on the server
    returned: str  # what the SDK call returned: success, or the error


ROWS: list[Outcome] = []
FULL_TABLE = bool(os.environ.get("RECEIPTS_SDK_FULL_TABLE"))


def cases(every: list, default: list) -> list:
    """The cases a run takes: `default` (every SDK and service, every fault kind, each at least once, chosen
    where the bug showed before the fix), or `every` one with RECEIPTS_SDK_FULL_TABLE=1, for the whole table."""
    assert set(default) <= set(every), set(default) - set(every)
    return every if FULL_TABLE else default


def record(outcome: Outcome) -> None:
    ROWS.append(outcome)
    SAVED.parent.mkdir(parents=True, exist_ok=True)
    SAVED.write_text(json.dumps([asdict(r) for r in ROWS], indent=1))


def table(rows: list[Outcome]) -> str:
    """A Markdown table: one line per SDK x service x fault, one column per mode: `effects: returned`."""
    cells: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        cells.setdefault((r.sdk, r.service, r.fault), {})[r.mode] = f"{r.effects}: {r.returned}"
    head = ["SDK", "service", "retry provoked by", *(HEADINGS[m] for m in MODES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (sdk, service, fault), by_mode in cells.items():
        lines.append("| " + " | ".join([sdk, service, fault, *(by_mode.get(m, "-") for m in MODES)]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else SAVED
    print(table([Outcome(**r) for r in json.loads(path.read_text())]))
