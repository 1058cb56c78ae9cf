"""How the `receipts` command prints: rich tables (ids never broken, nothing in a cell taken as markup or as a
terminal escape), JSON documents, ages, and a journaled exchange (request or answer) with its body folded."""

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from proxy_addon.views.documents import dumps
from proxy_addon.views.journaled import BodyView, body_lines, body_summary, fold


def print_json(document: Any) -> None:
    sys.stdout.write(dumps(document))
    sys.stdout.write("\n")


def age(since: datetime | None) -> str:
    if since is None:
        return "-"
    seconds = int((datetime.now(UTC) - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


_UNBROKEN_COLUMNS = frozenset({"operation_id", "blocking_operation_id"})
_PIPED_WIDTH = 240


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(32), *range(0x7F, 0xA0)] if chr(c) not in "\t\n"}


def printable(value: Any) -> str:
    """A cell as plain text: control characters (an escape sequence in a journaled body) shown as `\\x1b`."""
    return "" if value is None else str(value).translate(_CONTROL)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], lines: bool = False, header: bool = True) -> None:
    from rich.table import Table
    from rich.text import Text

    cells = [[printable(v) for v in row] for row in rows]
    rich_table = Table(title=Text(title), show_lines=lines, show_header=header)
    for i, c in enumerate(columns):
        # ids are copied and grepped: never broken across lines; the rest folds to fit
        if c in _UNBROKEN_COLUMNS:
            rich_table.add_column(c, no_wrap=True, min_width=max([len(c), *(len(r[i]) for r in cells)]))
        else:
            rich_table.add_column(c, overflow="fold")
    for row in cells:
        rich_table.add_row(*(Text(cell) for cell in row))  # Text: a `[bold]` in a path or a body is not markup
    # a terminal's own width; piped output (grep, less, a file) as wide as the table needs
    console().print(rich_table)


@contextmanager
def progress_bar(what: str, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on a terminal (stderr), advanced by the callback it yields (`done`, `total`); None when
    not a terminal or not `enabled` (a script reading --json), so that nothing is counted for it."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(what, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH, highlight=False)


def exchange_table(
    title: str, first: str, headers: dict[str, str], body: BodyView, operation_id: str, whole: str | None = None
) -> None:
    """`whole`: the command that shows a folded body whole (default: the receipt's `receipts show ID --json`)."""
    folded = fold(body_lines(body))
    shown = folded.head
    if folded.rest:
        shown += f"\n... {folded.more} folded: `{whole or f'receipts show {operation_id} --json'}` has it all"
    rows = [("", first), ("headers", "\n".join(f"{k}: {v}" for k, v in headers.items()) or "-"), ("body", body_summary(body))]
    if shown:
        rows.append(("", shown))
    table(title, ["part", "value"], rows, lines=True, header=False)
