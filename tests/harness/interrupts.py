"""Child processes that a test interrupts, made safe to wait for. Under nohup or in a background job the test's own
process may ignore SIGINT, and its children inherit that: a SIGINT would do nothing and the test would wait forever.
A child started with `python_m` gets Python's Ctrl-C handler (and SIGTERM's default) back before it runs, and every
wait here ends by a deadline, failing the test with what the child printed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

import pytest

# Runs `python -m MODULE ARGS...` with the signals a terminal's process has, whatever this process ignores.
SIGNALS_RESTORED = """
import runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
pause = float(sys.argv[1])
if pause:
    import time
    from edgetrain.runtime.training import TrainingSession
    step = TrainingSession.train_step
    def paced(self, *a, **k):
        time.sleep(pause)
        return step(self, *a, **k)
    TrainingSession.train_step = paced
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def python_m(module: str, *args, step_pause: float = 0.0) -> list[str]:
    """The argv of `python -m module args...` whose process answers Ctrl-C even when this one ignores it.
    step_pause: seconds every training step waits first (numbers unchanged), so that a signal sent some time into
    an epoch lands in it on a fast machine as on a slow one."""
    return [sys.executable, "-c", SIGNALS_RESTORED, str(float(step_pause)), module, *map(str, args)]


class Lines:
    """A child's text stream read in a thread, so that a test can wait for a line with a deadline."""

    def __init__(self, stream: TextIO):
        self.lines: list[str] = []
        self._ended = False
        self._new = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()
        with self._new:
            self._ended = True
            self._new.notify_all()

    def wait_for(self, test: Callable[[str], bool], what: str, timeout: float = 120) -> str:
        """The first line that passes `test`; fails the test when the stream ends or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        with self._new:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if test(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    why = "the stream ended" if self._ended else f"{timeout:g} s passed"
                    pytest.fail(f"{why} before {what}; it said:\n{self.text()}")
                self._new.wait(left)

    def text(self, timeout: float = 0) -> str:
        """What the stream gave so far (all of it, once the child has ended and `timeout` lets the reader finish)."""
        self._thread.join(timeout)
        with self._new:
            return "".join(self.lines)


def finish(proc: subprocess.Popen, timeout: float = 120, *streams: Lines) -> int:
    """The child's exit code once it ends; fails the test (after killing it) when it runs past `timeout`."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        said = "\n".join(s.text(5) for s in streams)
        pytest.fail(f"the child did not end within {timeout:g} s (killed); it said:\n{said}")
