"""The operation rules: `receipts rules check` (each read rule's verifier controls, run on the live upstream),
`rules show` (a preset's rules), `rules suggest` (rules from an API's OpenAPI document, to paste)."""

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

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


def cmd_rules_suggest(args: argparse.Namespace) -> int:
    """Rules from an OpenAPI document, printed to paste into config.yaml; the counts on stderr."""
    from proxy_addon.suggest import suggest_from_file
    from proxy_addon.suggest.render import summary_line

    suggested = suggest_from_file(Path(args.openapi), args.host, args.operation or (), args.header or ())
    print(suggested.text, end="")
    print(f"receipts: {summary_line(suggested.suggestions)}", file=sys.stderr)
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------------------------

SUGGEST_HELP = "print operation and read rules from an API's OpenAPI document, to paste into config.yaml (writes nothing)"


def _header_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME: VALUE (e.g. 'Authorization: Bearer ${{GITHUB_TOKEN}}')")
    return name.strip(), value.strip()


def _add_suggest(rules: Any) -> None:
    p = rules.add_parser("suggest", help=SUGGEST_HELP, description=SUGGEST_HELP)
    p.set_defaults(handler=cmd_rules_suggest)
    p.add_argument("--openapi", required=True, metavar="FILE", help="an OpenAPI 3.x document, JSON or YAML")
    p.add_argument("--host", help="the host (or host:port) the rules are for (default: the document's first server)")
    p.add_argument("--operation", action="extend", nargs="+", metavar="ID", help="only these writes (operationIds)")
    p.add_argument("--header", action="append", type=_header_arg, metavar="'NAME: VALUE'",
                   help="a header every read carries, e.g. 'Authorization: Bearer ${GITHUB_TOKEN}' (default: the "
                        "document's security schemes, from the environment)")  # fmt: skip


def add_rules(commands: Commands) -> None:
    """`receipts rules ...`: a subcommand each."""
    rules = commands.group("rules", "the reconcile read rules")
    p = commands.command("check", cmd_rules_check, "run every read rule's verifier controls on the live upstream; say which are proven", rules)
    p.add_argument("--json", action="store_true")
    p = commands.command("show", cmd_rules_show, "print a preset's operation and read rules (preset: NAME on a host)", rules)
    p.add_argument("--preset", required=True, metavar="NAME", help="stripe, s3, dynamodb, sqs, ses, ...")
    _add_suggest(rules)


COMMANDS = {"rules": add_rules}
