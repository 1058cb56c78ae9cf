"""The fault suite: real proxies, workers and databases, killed and starved on purpose (docs/testing.md).

Each scenario checks invariants.py and adds its counts to invariants.SUMMARY; the table is printed at the
end of the pytest run. Other fault tests may add rows too: `from faults.invariants import SUMMARY, ScenarioRow`.
"""

from collections.abc import Iterator

import pytest
from support.e2e import migrate
from support.recording_upstream import RecordingUpstream

from faults.invariants import SUMMARY, ScenarioRow


@pytest.fixture
def upstream() -> Iterator[RecordingUpstream]:
    up = RecordingUpstream().start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request) -> str:
    """A migrated database: each test that takes it runs on a SQLite file and on PostgreSQL."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    migrate(url)
    return url


_COLUMNS = (
    ("scenario", "scenario"),
    ("requests sent", "sent"),
    ("upstream received", "received"),
    ("receipts", "receipts"),
    ("duplicates forwarded", "duplicates"),
    ("receipts lost", "lost"),
)


def _cells(row: ScenarioRow) -> list[str]:
    return [str(getattr(row, attr)) for _, attr in _COLUMNS]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not SUMMARY.rows:
        return
    total = SUMMARY.totals()
    body = [_cells(r) for r in SUMMARY.rows]
    foot = _cells(total)
    foot[0] = f"total: {len(SUMMARY.rows)} scenarios run"
    headers = [h for h, _ in _COLUMNS]
    widths = [max(len(x) for x in column) for column in zip(headers, *body, foot)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    tr = terminalreporter
    tr.write_sep("=", "fault suite summary")
    tr.write_line(line(headers))
    tr.write_line(line(["-" * w for w in widths]))
    for cells, row in zip(body, SUMMARY.rows):
        tr.write_line(line(cells) + ("" if row.ok else "   <- invariant violated"))
    tr.write_line(line(["-" * w for w in widths]))
    tr.write_line(line(foot))
    verdict = "ok" if total.duplicates == 0 and total.lost == 0 and total.ok else "FAILED"
    tr.write_line(f"duplicates forwarded must be 0, receipts lost must be 0: {verdict}")
