"""The end-to-end tests' run summary: the table of what real SDKs' own retries did (support/sdk_results.py)."""

from support import sdk_results


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not sdk_results.ROWS:
        return
    terminalreporter.write_sep("-", "SDK retries: upstream effects: what the SDK call returned")
    terminalreporter.write_line(sdk_results.table(sdk_results.ROWS))
