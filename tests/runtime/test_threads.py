"""threads= on the sessions sets numpy's BLAS threads (the process's): read back from the OpenBLAS library numpy
bundles, asked directly here through its own getter; bad values are refused; a BLAS out of reach is said, not
ignored."""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edgetrain as et
from edgetrain.runtime import threads as threads_mod

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "harness"


def _bundled_openblas_getter():
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in (
            "scipy_openblas_get_num_threads64_",
            "openblas_get_num_threads64_",
            "openblas_get_num_threads",
        ):
            if hasattr(lib, name):
                return getattr(lib, name)
    return None


def test_threads_set_numpys_blas(tmp_path):
    if _bundled_openblas_getter() is None:
        pytest.skip("this numpy does not bundle OpenBLAS (a wheel from PyPI does)")
    script = textwrap.dedent(
        f"""
        import sys; sys.path[:0] = [{str(ROOT)!r}, {str(HARNESS)!r}, {str(ROOT / "tests" / "runtime")!r}]
        import models, edgetrain as et
        from test_threads import _bundled_openblas_getter
        get = _bundled_openblas_getter()
        art = et.convert(models.mlp(batch=2), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1))
        art.save({str(tmp_path / "m.etrain")!r})
        seen = []
        for n in (2, 1, 3):
            s = et.TrainingSession({str(tmp_path / "m.etrain")!r}, threads=n)
            seen.append((s.threads, int(get())))
        i = et.InferenceSession(models.mlp(batch=2), threads=2)
        seen.append((i.threads, int(get())))
        print(seen)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(2, 2), (1, 1), (3, 3), (2, 2)]"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(et.ConfigError, match="threads must be a whole number >= 1"):
        threads_mod.blas_threads(bad)


def test_a_blas_out_of_reach_is_said(monkeypatch, tmp_path):
    monkeypatch.setattr(threads_mod, "_openblas_libraries", lambda: [])
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # not installed
    now, how = threads_mod.blas_threads(2)
    assert now is None and "OMP_NUM_THREADS" in how
    import models

    with pytest.warns(RuntimeWarning, match="threads=2 was not applied"):
        s = et.InferenceSession(models.mlp(batch=2), threads=2)
    assert s.threads is None
