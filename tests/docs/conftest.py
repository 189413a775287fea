"""Reports, after the tests, how many doc blocks ran per page and how many of them passed."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    for outcome in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if "test_run_blocks.py" in nodeid and "[" in nodeid and report.when == "call":
                page = nodeid.split("[", 1)[1].rsplit(":", 1)[0]
                ran[page] += 1
                passed[page] += outcome == "passed"
    if ran:
        terminalreporter.write_line(
            "doc blocks run per page: " + ", ".join(f"{page} {passed[page]}/{n}" for page, n in sorted(ran.items()))
        )
