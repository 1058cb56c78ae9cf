"""The `receipts` command: set up the database, run the proxy, and look at or settle receipts.

A module per command group, each listing its commands in `COMMANDS` (name -> what adds it to the parser):
proxy.py (init, db, proxy, env, admin), receipts.py (reconcile, ls, show, resolve, stats, prune), approvals.py
(approvals, approve, deny), audit.py (verify, checkpoint, scrub), rules.py (rules ...), agents.py (agents ...),
mcp.py (mcp); common.py is what they share. `build_parser` puts them together.

Exit codes: 0 success, 1 a failed operation, 2 bad usage (including a bad config or URL).
"""

import argparse
import sys
from collections.abc import Sequence

from proxy_addon import __version__
from proxy_addon.cli import agents, approvals, audit, mcp, proxy, receipts, rules
from proxy_addon.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Adder, Commands, UsageParser
from proxy_addon.exceptions import ConfigError, InvalidResolutionError, OpenApiError, ReceiptsError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

GROUPS = (proxy, rules, receipts, approvals, audit, agents, mcp)
# the order `receipts --help` lists the commands in; a command not named here comes after them
HELP_ORDER = (
    "init", "db", "rules", "proxy", "env", "agents", "reconcile", "ls", "show", "resolve", "admin", "scrub",
    "approvals", "approve", "deny", "stats", "prune", "verify", "checkpoint", "mcp",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="receipts", description="Durable receipts for the writes AI agents make over HTTP.")
    parser.add_argument("--version", action="version", version=f"receipts {__version__}")
    commands = Commands(parser.add_subparsers(dest="command", required=True, parser_class=UsageParser))
    adders: dict[str, Adder] = {}
    for group in GROUPS:
        adders.update(group.COMMANDS)
    listed = sorted(adders, key=lambda name: HELP_ORDER.index(name) if name in HELP_ORDER else len(HELP_ORDER))
    for name in listed:
        adders[name](commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, InvalidResolutionError, OpenApiError) as e:
        print(f"receipts: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ReceiptsError as e:
        print(f"receipts: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED
