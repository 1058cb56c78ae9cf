"""How the `receipts` command prints (views/terminal.py): ages, cells as plain text (no terminal escape, no rich
markup), tables whose ids are never broken, and a journaled exchange with its body folded. The commands that use
them, on a real journal: test_cli.py."""

import re
from datetime import UTC, datetime, timedelta

import pytest

from proxy_addon.views import terminal
from proxy_addon.views.journaled import FOLD_LINES, body_view


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (86399, "23h"), (86400, "1d"), (40 * 86400, "40d")],
)
def test_an_age_in_its_largest_whole_unit(seconds, shown):
    assert terminal.age(ago(seconds + 0.2)) == shown


def test_no_time_is_a_dash():
    assert terminal.age(None) == "-"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, ""),
        (42, "42"),
        ("clear \x1b[2J screen", "clear \\x1b[2J screen"),
        ("bell\x07 and nul\x00", "bell\\x07 and nul\\x00"),
        ("c1 \x9b31m csi", "c1 \\x9b31m csi"),  # the 8-bit CSI some terminals obey
        ("del\x7f", "del\\x7f"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),  # layout, not control: kept
        ("caf\u00e9 \u2713 [bold]", "caf\u00e9 \u2713 [bold]"),
    ],
)
def test_a_cell_is_plain_text(value, shown):
    assert terminal.printable(value) == shown


def test_a_table_shows_cells_as_text_and_never_breaks_an_id(capsys):
    op = "op_" + "0123456789abcdef" * 2
    long = "long-segment/" * 30
    columns = ["operation_id", "path", *"abcdefghi", "blocking_operation_id"]  # more than 240 columns can hold
    terminal.table("receipts [bold]x[/bold]", columns,
                   [(op, long, *[long] * 9, op), ("op_2", "[red]b[/red]", "\x1b[31mred", *[""] * 8, "")])
    out = capsys.readouterr().out
    assert len(re.findall(op, out)) == 2  # both ids whole, on one line, in a table the other columns fold to fit
    assert "[red]b[/red]" in out and "receipts [bold]x[/bold]" in out  # markup shown, not applied
    assert "\x1b" not in out and "\\x1b[31mred" in out
    assert max(len(line) for line in out.splitlines()) <= 240  # piped: as wide as the table needs, up to 240


def test_an_exchange_folds_a_long_body_and_says_where_the_rest_is(capsys):
    body = body_view("\n".join(f"line {i}" for i in range(FOLD_LINES + 5)).encode(), None, False, None, "text/plain")
    terminal.exchange_table("request", "POST https://api.example.com/x", {"content-type": "text/plain"}, body, "op_9")
    out = capsys.readouterr().out
    assert "line 0" in out and f"line {FOLD_LINES - 1}" in out and f"line {FOLD_LINES}" not in out
    assert "5 more lines folded: `receipts show op_9 --json` has it all" in out
    assert "content-type: text/plain" in out


def test_an_exchange_without_headers_or_body_says_so(capsys):
    terminal.exchange_table("answer", "204", {}, body_view(b"", 0, False, None, None), "op_1")
    out = capsys.readouterr().out
    assert re.search(r"headers\s*│\s*-", out) and "no body" in out and "folded" not in out
