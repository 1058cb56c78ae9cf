"""The operation rules: `receipts rules check` (each read rule's verifier controls, run on the live upstream)."""

import argparse
import asyncio

from proxy_addon.cli.common import EXIT_OK, Commands, load, open_store
from proxy_addon.exceptions import ConfigError
from proxy_addon.views.terminal import print_json, table


def cmd_rules_check(args: argparse.Namespace) -> int:
    from proxy_addon.reconcile.check import check_rules
    from proxy_addon.views.rule_health import rows

    config = load(args)
    health = asyncio.run(check_rules(config, open_store(args, config)))
    if args.json:
        print_json([h.document() for h in health])
    else:
        table("read rules", ["host", "operation", "proven", "positive", "negative"], rows(health))
    return EXIT_OK


def cmd_rules_show(args: argparse.Namespace) -> int:
    """A preset's rules as shipped, to read or to copy under a host and change."""
    from proxy_addon import presets

    try:
        print(presets.preset_text(args.preset), end="")
    except KeyError:
        raise ConfigError(f"--preset: {presets.unknown_preset(args.preset)}") from None
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------------------------


def add_rules(commands: Commands) -> None:
    """`receipts rules ...`: a subcommand each."""
    rules = commands.group("rules", "the reconcile read rules")
    p = commands.command("check", cmd_rules_check, "run every read rule's verifier controls on the live upstream; say which are proven", rules)
    p.add_argument("--json", action="store_true")
    p = commands.command("show", cmd_rules_show, "print a preset's operation and read rules (preset: NAME on a host)", rules)
    p.add_argument("--preset", required=True, metavar="NAME", help="stripe, s3, dynamodb, sqs, ses, ...")


COMMANDS = {"rules": add_rules}
