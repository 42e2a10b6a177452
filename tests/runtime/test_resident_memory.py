"""A session's resident memory holds its own copies, not the file's pages as well (issue 25's peak RSS).

An artifact's tensors are read-only maps of the file. Verifying the checksum reads every page, and copying the
parameters out reads theirs again: without release, the process's RSS counts each trained weight twice (the file's
page and the session's copy), 42.6 MB of ResNet18's 232. These run in a fresh process each, on Linux, where
/proc/self/status splits RSS into anonymous and file pages."""

from __future__ import annotations

import mmap
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists() or not hasattr(mmap, "MADV_DONTNEED"),
    reason="needs Linux's /proc/self/status and madvise",
)

MB = 1 << 20


def _wide_mlp(path: Path, trainable: str | None) -> Path:
    """x [n, 2048] -> Gemm 2048x4096 -> Relu -> Gemm 4096x10: 32 MiB in the first weight."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((2048, 4096)) * 0.02).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4096, 10)) * 0.02).astype(np.float32), "w2")
    g = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2"], ["y"]),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        [w1, w2],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    art = et.convert(
        model, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.01), batch_size=4, trainable=trainable
    )
    art.save(path)
    return path


PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import edgetrain as et

    def status():
        out = {}
        for line in open("/proc/self/status"):
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = int(line.split()[1]) * 1024
        return out

    before = status()
    sess = et.TrainingSession(sys.argv[1])
    loaded = status()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 2048)).astype(np.float32), rng.integers(0, 10, 4)
    losses = [sess.train_step(x, y) for _ in range(3)]
    print(json.dumps({"before": before, "loaded": loaded, "stepped": status(), "losses": losses}))
    """
)


def _probe(path: Path) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_trained_weights_are_resident_once(tmp_path):
    r = _probe(_wide_mlp(tmp_path / "full.etrain", None))
    file_pages = r["loaded"]["RssFile"] - r["before"]["RssFile"]
    own = r["loaded"]["RssAnon"] - r["before"]["RssAnon"]
    assert own >= 32 * MB  # the session's copy of w1
    assert file_pages < 12 * MB, file_pages  # not the file's 32 MiB as well (a few MB: modules loaded)
    assert r["stepped"]["RssFile"] - r["before"]["RssFile"] < 12 * MB
    assert r["losses"][-1] < r["losses"][0]


def test_frozen_weights_read_in_place_still_train_the_head(tmp_path):
    """Head-only: w1 stays in the file and is read in place; its pages come back as the step reads them."""
    r = _probe(_wide_mlp(tmp_path / "head.etrain", "w2"))
    assert r["stepped"]["RssAnon"] - r["before"]["RssAnon"] < 24 * MB  # w1 is not copied
    assert r["stepped"]["RssFile"] - r["before"]["RssFile"] >= 30 * MB  # it is read from the file's pages
    assert r["losses"][-1] < r["losses"][0]
