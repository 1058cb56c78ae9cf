"""One benchmark run's shared state: its settings, where it writes, what it started, what it measured."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.processes import LoadSpec, Processes, run_loadgen, run_loadgens

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
    pg_databases: set[str] = field(default_factory=set)  # created on the server, dropped at the end
    runs: list[Row] = field(default_factory=list)  # per target and concurrency, the median of its rounds
    rounds: list[Row] = field(default_factory=list)  # every round's level as measured
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

    def load_many(self, specs: list[LoadSpec], proxied: bool, journaled: bool) -> list[Row]:
        """One load client per spec, all at once; with every request's latency, for merged percentiles."""
        return run_loadgens(
            specs,
            run_id=self.run_id,
            upstream_port=self.upstream_port if proxied else None,
            expect_receipt=journaled,
            latencies=True,
        )
