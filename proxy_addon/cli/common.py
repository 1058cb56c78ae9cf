"""What every command group shares: the exit codes, the parser that exits 2 on bad usage, where a group adds its
commands (`Commands`), and the config and store a command opens."""

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.db import check_schema, make_engine, resolve_database_url
from proxy_addon.store import ReceiptStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

Handler = Callable[[argparse.Namespace], int]


def argument[T](parse: Callable[[str], T], keep_text: bool = False) -> Callable[[str], Any]:
    """An argparse `type` from a parser that raises ValueError: its message becomes the usage error (exit 2).
    `keep_text`: the argument is checked only, and kept as it was written."""

    def convert(text: str) -> Any:
        try:
            parsed = parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text if keep_text else parsed

    return convert


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Commands:
    """Where a command group adds its commands: `receipts NAME` (`command`), or a group of its own with commands
    under it, `receipts GROUP NAME` (`group`, then `command(..., parent=it)`)."""

    sub: Any  # argparse's subparsers action: `receipts NAME`

    def command(self, name: str, handler: Handler, help: str, parent: Any = None) -> argparse.ArgumentParser:
        """`receipts NAME` (or `receipts GROUP NAME` under `parent`), with the `--config` every command takes."""
        p: argparse.ArgumentParser = (parent or self.sub).add_parser(name, help=help, description=help)
        p.add_argument("--config", default="config.yaml", help="config file (default ./config.yaml)")
        p.set_defaults(handler=handler)
        return p

    def group(self, name: str, help: str) -> Any:
        """`receipts NAME ...`: a command whose subcommands are added with `command(..., parent=...)`."""
        group = self.sub.add_parser(name, help=help)
        return group.add_subparsers(dest=f"{name}_command", required=True, parser_class=UsageParser)


Adder = Callable[[Commands], None]  # what a group module lists in its COMMANDS: adds one command to the parser


def load(args: argparse.Namespace) -> ReceiptsConfig:
    return load_config(args.config)


def open_store(args: argparse.Namespace, config: ReceiptsConfig | None = None) -> ReceiptStore:
    config = config or load(args)
    return store_at(resolve_database_url(config.database.url))


def store_at(url: str) -> ReceiptStore:
    """The store on this database, once its schema is checked to be migrated."""
    engine = make_engine(url)
    check_schema(engine)
    return ReceiptStore(engine)
