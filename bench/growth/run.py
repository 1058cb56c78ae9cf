"""The growth scenario: what a receipt costs on a history that already holds many, on SQLite and PostgreSQL.

    .venv/bin/python bench/growth/run.py [--growth 0,100000,1000000] [--requests 3000] [--concurrency 1,32] [--out DIR]

The loopback benchmark (bench/loopback/run.py) with the receipts targets (c) sqlite and (d) postgres and the
history sizes of --growth (these defaults unless given): each target on an empty history first (interleaved
rounds), then once per history size on a database seeded with that many synthetic terminal receipts
(bench/core/seeding.py). Every other option, the results and the report are the loopback run's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from bench.loopback import run as loopback

GROWTH_DEFAULTS = {"--targets": "sqlite,postgres", "--growth": "0,100000,1000000"}


def with_defaults(argv: list[str]) -> list[str]:
    """`argv` with this scenario's defaults for the options it leaves out."""
    given = {a.partition("=")[0] for a in argv if a.startswith("--")}
    return [*argv, *(x for option, value in GROWTH_DEFAULTS.items() if option not in given for x in (option, value))]


if __name__ == "__main__":
    sys.exit(loopback.main(with_defaults(sys.argv[1:])))
