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


def test_check_ops_lists_every_supported_op_grouped_with_gradient_rules():
    from edgetrain.derive.autodiff import rules  # noqa: F401
    from edgetrain.derive.autodiff.registry import RULES
    from edgetrain.runtime import supported_ops

    proc = run_cli("check", "--ops")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= 100  # wrapped
    assert "convolution and pooling (8):" in out and "activations" in out
    listed = re.findall(r"\S+", "\n".join(ln for ln in out.splitlines() if ln.startswith("  ")))
    ops = supported_ops()
    assert sorted(w.strip("[]") for w in listed) == ops  # each supported op exactly once
    assert {w.strip("[]") for w in listed if w.startswith("[")} == {op for op in ops if op not in RULES}
    assert "[Mod]" in listed and "Conv" in listed and "[brackets] have none" in out


def test_check_and_convert_name_an_unsupported_op_in_one_short_line(tmp_path):
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("FastGelu", ["h"], ["y"], name="act", domain="com.microsoft"),
        ],
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    path = tmp_path / "contrib.onnx"
    onnx.save(helper.make_model(g, opset_imports=opsets), path)
    for args in (["check", str(path)], ["convert", str(path), "-o", str(tmp_path / "m.etrain")]):
        proc = run_cli(*args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(
            f"edgetrain {args[0]}: error: {path}: node 'act' (FastGelu) is in domain 'com.microsoft'"
        )
        assert "its standard form is Gelu with approximate='tanh'" in line and "torch.onnx.export" in line
        assert "`edgetrain check --ops`" in line and len(line) - len(str(path)) < 400
    assert not (tmp_path / "m.etrain").exists()

    # with --ops, check lists the ops first, then reports on the model
    proc = run_cli("check", "--ops", str(path))
    assert (
        proc.returncode == 1
        and "convolution and pooling" in proc.stdout
        and "'act' (FastGelu)" in proc.stderr
    )
