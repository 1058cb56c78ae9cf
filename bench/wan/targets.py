"""The WAN mode's targets (`KIND@OPTION=VALUE+...~KEY=VALUE+...`), a protocol's leg (its upstream and the relay
in front of it), and one run's state."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.databases import Db
from bench.core.processes import Process, Processes

Row = dict[str, Any]
KINDS = ("mitmdump", "sqlite", "postgres")
LABELS = {"mitmdump": "mitmdump", "sqlite": "receipts SQLite", "postgres": "receipts PostgreSQL"}


@dataclass
class Target:
    spec: str  # as given: KIND, KIND@OPTION=VALUE+..., KIND~KEY=VALUE+...
    kind: str
    options: list[str]
    key: str  # a file-name-safe form of spec
    defaults: list[str] = field(default_factory=list)  # KEY=VALUE for the receipts config's `defaults:`
    port: int = 0
    proc: Process | None = None
    db: Db | None = None
    sent: int = 0  # writes sent to it (warm-up included), for the receipts check

    @property
    def label(self) -> str:
        return LABELS[self.kind] + (f" ({', '.join(self.options)})" if self.options else "")


@dataclass
class Leg:
    """One protocol's upstream and the relay in front of it."""

    protocol: str
    upstream_port: int
    relay_port: int
    trace: Path


@dataclass
class Run:
    args: argparse.Namespace
    out: Path
    tmp: Path
    run_id: str
    rtt_ms: float
    procs: Processes = field(default_factory=Processes)
    rounds: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def parse_target(spec: str) -> Target:
    """KIND, then optionally @OPTION=VALUE+... (mitmproxy options) and ~KEY=VALUE+... (the receipts config's
    `defaults:`), e.g. `sqlite@connection_strategy=eager` or `sqlite~upstream_connections=fresh`."""
    head, _, config = spec.partition("~")
    kind, _, opts = head.partition("@")
    if kind not in KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown target {kind!r} (one of {', '.join(KINDS)}, then @OPTION=VALUE+... ~KEY=VALUE+...)"
        )
    options = [o for o in opts.split("+") if o]
    defaults = [o for o in config.split("+") if o]
    for o in options + defaults:
        if "=" not in o:
            raise argparse.ArgumentTypeError(f"{o!r}: options are OPTION=VALUE")
    if defaults and kind == "mitmdump":
        raise argparse.ArgumentTypeError(f"{spec!r}: mitmdump has no receipts config")
    key = "".join(ch if ch.isalnum() else "-" for ch in spec).strip("-")
    return Target(spec, kind, options, key, defaults=defaults)
