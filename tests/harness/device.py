"""Running code as a device would: a fresh interpreter where onnx, onnxruntime and torch (or any packages named)
cannot be imported, with this interpreter's numpy and, when tools/test.sh made it, numpy 1.24 (Debian 12's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_SIDE = ("onnx", "onnxruntime", "torch")

# Prepended to a device script: any import of a blocked package fails, as on a phone without it.
BLOCKER = """
import sys
_BLOCKED = {blocked!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ImportError(f"blocked: {{name}}")
sys.meta_path.insert(0, _Block())
"""

# Appended: the script's last check, that nothing blocked was imported after all.
NOTHING_LEAKED = """
_leaked = sorted(m for m in sys.modules if m.split(".")[0] in _BLOCKED)
assert not _leaked, _leaked
"""

# tools/test.sh makes a venv holding numpy 1.24 and nothing else, and names its python here.
NUMPY124 = os.environ.get("EDGETRAIN_NUMPY124_PYTHON")
PYTHONS = [
    pytest.param(sys.executable, id="this-numpy"),
    pytest.param(
        NUMPY124,
        id="numpy-1.24",
        marks=pytest.mark.skipif(
            not NUMPY124,
            reason="set EDGETRAIN_NUMPY124_PYTHON (tools/test.sh does) to a python with numpy 1.24",
        ),
    ),
]


def run_on_device(
    python: str, script: str, *args: str, blocked=BUILD_SIDE, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs `script` in a fresh `python` with the repository on the path, where the `blocked` packages cannot be
    imported and must not have been by the end; returns the finished process."""
    source = BLOCKER.format(blocked=tuple(blocked)) + textwrap.dedent(script) + NOTHING_LEAKED
    return subprocess.run(
        [python, "-c", source, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
