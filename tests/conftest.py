"""Shared test plumbing: a `report` fixture whose lines are printed in pytest's terminal summary
(model timings, node-case counts), so CI logs carry the numbers."""

from __future__ import annotations

import pytest

_REPORT: dict[str, list[str]] = {}


@pytest.fixture(scope="session")
def report():
    def add(section: str, line: str) -> None:
        _REPORT.setdefault(section, []).append(line)

    return add


def pytest_terminal_summary(terminalreporter):
    for section, lines in _REPORT.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
