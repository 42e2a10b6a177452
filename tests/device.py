"""Running code as a device would: a fresh interpreter where onnx, onnxruntime and torch cannot be imported, with
this interpreter's numpy and, when tools/test.sh made it, numpy 1.24 (Debian 12's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Prepended to a device script: any import of the build side fails, as on a phone without it.
BLOCK_BUILD_SIDE = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("onnx", "onnxruntime", "torch"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, _Block())
"""

# A script's last check: nothing of the build side was imported.
NOTHING_LEAKED = """
_leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnxruntime", "torch"))
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
    python: str, script: str, *args: str, timeout: float = 300, cwd=None
) -> subprocess.CompletedProcess:
    """Runs BLOCK_BUILD_SIDE + script in `python` with the repository on the path; returns the finished process."""
    return subprocess.run(
        [python, "-c", BLOCK_BUILD_SIDE + script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
