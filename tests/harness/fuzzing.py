"""Bounded fuzzing of edgetrain's readers of outside bytes, each in a child process under a memory ceiling.

A target is a `FuzzTarget(strategy, run)` at module level in a test module: `strategy` is a hypothesis strategy
of inputs (usually bytes, or a structure that `run` writes to a file), `run(example, workdir)` hands one input to the
reader. The only acceptable outcomes are a return (the input was valid) or an `edgetrain.EdgeTrainError` (refused,
with a message). Anything else fails the test with hypothesis's shrunk example: a bare Python or numpy exception,
a `MemoryError` that is not a LimitError (the child's address space is capped with RLIMIT_AS, so an allocation far
beyond what the input holds fails), or an input that runs longer than `per_example_s` (SIGALRM).

    run_target("test_fuzz_container:CONTAINER")  ->  {"tried": 300, "refused": 287, "accepted": 13, ...}

The budget: EDGETRAIN_FUZZ_EXAMPLES inputs per target (default 150, seconds per target in CI); a developer runs
`python tools/fuzz.py --examples 20000` (or EDGETRAIN_FUZZ_EXAMPLES=20000 pytest -k fuzz) for a long run.
EDGETRAIN_FUZZ_SEED fixes the seed (default: a fixed one, so CI is repeatable; `random` draws a new one and
prints it). With EDGETRAIN_FUZZ_REPORT=path, each run appends its counts to that JSON-lines file.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXAMPLES = 150
DEFAULT_SEED = 20261122
MEMORY_CEILING = 2 << 30  # the child's address space (numpy, onnx and the interpreter need ~0.6-1 GiB of it)


@dataclasses.dataclass(frozen=True)
class FuzzTarget:
    strategy: Any  # a hypothesis strategy
    run: Callable[
        [Any, Path], Any
    ]  # (example, a fresh empty folder) -> anything; raises EdgeTrainError to refuse
    per_example_s: float = 20.0  # longer is a hang
    memory: int = MEMORY_CEILING


def examples() -> int:
    return int(os.environ.get("EDGETRAIN_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))


def seed() -> int:
    text = os.environ.get("EDGETRAIN_FUZZ_SEED", str(DEFAULT_SEED))
    return int.from_bytes(os.urandom(4), "little") if text == "random" else int(text)


def run_target(spec: str, *, n: int | None = None, timeout: float | None = None) -> dict:
    """Fuzz the target `module:NAME` with n inputs in a child process; return its counts, or fail (AssertionError)
    with the child's report of the first input that escaped."""
    n = examples() if n is None else n
    s = seed()
    target = _load(spec)
    # the repository, the harness and every folder of tests, where the target's module may be
    folders = sorted(
        str(d) for d in (ROOT / "tests").iterdir() if d.is_dir() and not d.name.startswith((".", "_"))
    )
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "harness"), *folders])
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=path)
    limit = target.memory

    def cap():  # in the child, before it starts Python
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [sys.executable, str(Path(__file__).resolve()), spec, str(n), str(s)]
    budget = timeout if timeout is not None else 120 + n * 2.0
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, preexec_fn=cap, capture_output=True, text=True, timeout=budget
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"fuzzing {spec} (seed {s}) hung: no result in {budget:.0f} s\n{e.stdout}\n{e.stderr}"
        ) from None
    tail = (proc.stdout + proc.stderr)[-12000:]
    assert proc.returncode == 0, f"fuzzing {spec} (seed {s}, {n} inputs) found an input that escaped:\n{tail}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FUZZ-RESULT ")]
    assert lines, f"fuzzing {spec}: the child printed no result\n{tail}"
    result = json.loads(lines[-1][len("FUZZ-RESULT ") :])
    result.update(target=spec, seed=s, seconds=round(time.perf_counter() - start, 1))
    report = os.environ.get("EDGETRAIN_FUZZ_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(result) + "\n")
    print(
        f"fuzz {spec}: {result['tried']} inputs, {result['refused']} refused, {result['accepted']} accepted"
    )
    return result


def _load(spec: str) -> FuzzTarget:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


class _Hang(BaseException):  # not an Exception: no reader's except clause may swallow it
    pass


def _child(spec: str, n: int, s: int) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from edgetrain.core.errors import EdgeTrainError

    target = _load(spec)
    counts: Counter = Counter()
    refused: Counter = Counter()

    def alarm(signum, frame):
        raise _Hang(f"one input ran longer than {target.per_example_s} s")

    signal.signal(signal.SIGALRM, alarm)

    @hseed(s)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(target.strategy)
    def fuzz(example):
        counts["tried"] += 1
        with tempfile.TemporaryDirectory(prefix="edgetrain-fuzz-") as work:
            signal.setitimer(signal.ITIMER_REAL, target.per_example_s)
            try:
                target.run(example, Path(work))
                counts["accepted"] += 1
            except EdgeTrainError as e:
                counts["refused"] += 1
                refused[type(e).__name__] += 1
                assert str(e).strip(), f"{type(e).__name__} with an empty message"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

    fuzz()
    result = {"tried": counts["tried"], "refused": counts["refused"], "accepted": counts["accepted"]}
    result["errors"] = dict(refused.most_common())
    print("FUZZ-RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
