"""`edgetrain check`: the trainability report, end to end in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import onnx
from models import resnet_tiny
from onnx import TensorProto, helper, numpy_helper


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_check_reports_ops_parameters_and_success(tmp_path):
    path = tmp_path / "resnet_tiny.onnx"
    onnx.save(resnet_tiny(), path)
    proc = run_cli("check", str(path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Conv" in out and "BatchNormalization" in out and "GlobalAveragePool" in out
    lines = {
        line.split()[0]: line for line in out.splitlines() if line[:1].isupper() and len(line.split()) >= 4
    }
    assert lines["Conv"].split()[1:3] == ["3", "3"] and lines["Conv"].endswith("yes")
    assert re.search(r"stem_bn.running_mean +\[8\] +running mean of BatchNormalization", out)
    assert "stem.weight" in out and "OK: a training step derives" in out


def test_check_names_the_op_that_blocks_training(tmp_path):
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Mod", ["h", "three"], ["f"], name="modulo", fmod=1),
            helper.make_node("MatMul", ["f", "w2"], ["y"], name="mm2"),
        ],
        "blocked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.full((1,), 3.0, np.float32), "three"),
        ],
    )
    path = tmp_path / "blocked.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = run_cli("check", str(path))
    assert proc.returncode == 1
    assert "Mod" in proc.stdout and "MISSING" in proc.stdout
    assert "NOT TRAINABLE as is: node 'modulo' (Mod) has no gradient rule" in proc.stdout
    assert "trainable=['w2']" in proc.stdout


def test_check_bad_file_is_one_clear_line(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_text("not a model")
    proc = run_cli("check", str(path))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "is not an ONNX model" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert run_cli("check").returncode == 2  # usage error
