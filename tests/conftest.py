"""Shared test plumbing: a `report` fixture whose lines are printed in pytest's terminal summary
(model timings, node-case counts), so CI logs carry the numbers; a `background` fixture that runs the long, mostly
idle parts of slow tests (real Flower federations) side by side."""

from __future__ import annotations

import re
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# The tests follow the package's layers, a folder each (core, graph, onnx_io, derive, runtime; cli, federated,
# android_demo, loaders; project: what spans the repository); what they share is in tests/harness, importable by
# name from every folder (`from models import MODELS`).
HARNESS = Path(__file__).resolve().parent / "harness"
sys.path.insert(0, str(HARNESS))
# A few test modules share helpers with another folder's (the command-line runner of tests/cli/test_cli.py, the
# quantized models of tests/derive/test_quantized_models.py): every folder is importable by name, so a file runs
# alone as it runs in the whole suite (test files' names are unique across folders).
sys.path.extend(
    str(d)
    for d in sorted(HARNESS.parent.iterdir())
    if d.is_dir() and d.name not in ("harness", "data", "plugins")
)

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


# A real Flower federation spends most of its minute waiting: on Flower's polling (every 3 s), on the processes it
# starts for every message. Several side by side take little more time than one. A test marked
# `@pytest.mark.background(job=job)` takes `job(folder)`'s result from its `background` fixture: when the first such
# test is reached, the jobs of every selected test so marked start, BACKGROUND_JOBS at a time in the tests' order,
# each in a folder of its own; each test waits for its own job, then checks what it did.
BACKGROUND_JOBS = 3
_BACKGROUND: dict[str, tuple[Future, Path]] = {}
_POOL: list[ThreadPoolExecutor] = []


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "background(job=job): job(folder) runs beside other tests' (tests/conftest.py)"
    )


@pytest.fixture
def background(request, tmp_path_factory):
    """(what the test's background job returned, the job's folder); a job's exception fails the test."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=BACKGROUND_JOBS, thread_name_prefix="background"))
        for item in request.session.items:
            mark = item.get_closest_marker("background")
            if mark is not None:
                folder = tmp_path_factory.mktemp(re.sub(r"\W", "_", item.name)[:30])
                _BACKGROUND[item.nodeid] = (_POOL[0].submit(mark.kwargs["job"], folder), folder)
    future, folder = _BACKGROUND.pop(request.node.nodeid)
    return future.result(), folder


def pytest_sessionfinish(session):
    for pool in _POOL:  # a session stopped early (-x, Ctrl-C) starts no more jobs; it waits for those running
        pool.shutdown(wait=True, cancel_futures=True)
