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
    import sys

    harness = sys.modules.get("grad_harness")
    if harness is not None and harness.WORST:
        worst = harness.WORST
        terminalreporter.section("gradient rules: largest finite-difference relative error per op")
        for op in sorted(worst):
            terminalreporter.write_line(f"{op:50s} {worst[op]:.2e}")
        top = max(worst, key=worst.get)
        terminalreporter.write_line(f"largest of all: {worst[top]:.2e} ({top}; {len(worst)} ops)")
    for section, lines in _REPORT.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
