"""One benchmark run's shared state: its settings, where it writes, what it started, what it measured."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processes import Processes, run_loadgen

Row = dict[str, Any]


@dataclass
class Session:
    args: argparse.Namespace
    run_id: str
    out: Path
    logs: Path
    tmp: Path
    procs: Processes = field(default_factory=Processes)
    upstream_port: int = 0
    pg_used: bool = False
    runs: list[Row] = field(default_factory=list)
    growth: list[Row] = field(default_factory=list)
    targets_info: dict[str, Row] = field(default_factory=dict)
    profiles: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def load(self, port: int, proxied: bool, requests: int, concurrency: int, prefix: str, journaled: bool) -> Row:
        """Sends `requests` POSTs to `port`; `journaled` expects every answer to say its receipt succeeded."""
        return run_loadgen(
            port,
            requests=requests,
            concurrency=concurrency,
            prefix=prefix,
            run_id=self.run_id,
            upstream_port=self.upstream_port if proxied else None,
            expect_receipt=journaled,
        )
