"""`edgetrain demo --quantized`, end to end in a subprocess on a small budget (5 epochs): the LeNet quantized to int8
by onnxruntime, personalized as int8 and as float, exported int8 and float. The table's rows are on screen and in
the JSON, the personalized int8 models beat the base int8 model on the new user's held-out digits, the int8
exports are int8 QDQ models onnxruntime runs, and the numbers printed are what onnxruntime computes on the exported
files (recomputed here). Without onnxruntime, the demo says to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from device import run_on_device

from loaders import MnistDataView

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "edgetrain" / "data"
EPOCHS = 5  # the small budget: 25 steps per variant (the README's table is the default 20 epochs)
ROWS = [
    "base model, float",
    "base model, int8",
    "head-only, float",
    "head-only, int8",
    "head-only, int8 -> float export",
    "full, float",
    "full, int8",
    "full, int8 -> float export",
]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-int8")
    t0 = time.perf_counter()
    proc = cli("--quantized", "--epochs", str(EPOCHS), "--json", str(out / "r.json"), cwd=out)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # without --out, the files go to ./edgetrain-demo-int8
    return proc, json.loads((out / "r.json").read_text()), out / "edgetrain-demo-int8", seconds


def _heldout(split_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw uint8 digits, the same / 255 as float32, labels)."""
    view = MnistDataView.from_dir(split_dir, split, normalize=False)
    x, y = view.get_batch(np.arange(len(view)))
    return x.astype(np.uint8), (x / np.float32(255)).astype(np.float32), y


def _onnxruntime_accuracy(path: Path, raw: np.ndarray, normalized: np.ndarray, y: np.ndarray) -> float:
    """onnxruntime with its defaults (all graph optimizations), as a deployment runs the file."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    first = sess.get_inputs()[0]
    x = raw if first.type == "tensor(uint8)" else normalized
    return float(np.mean(sess.run(None, {first.name: x})[0].argmax(1) == y))


def test_the_table_and_int8_personalization_beats_the_base_int8_model(demo, report):
    proc, r, files, seconds = demo
    rows = {row["name"]: row for row in r["rows"]}
    assert list(rows) == ROWS
    for name in ROWS:
        assert name in proc.stdout, name
    for head in ("new user", "original", "model", "artifact", "median", "ms/step"):
        assert head in proc.stdout, head
    base8 = rows["base model, int8"]["user_accuracy"]
    report(
        f"demo (edgetrain demo --quantized --epochs {EPOCHS})",
        "new user's held-out digits, onnxruntime on the files: "
        + ", ".join(f"{k} {v['user_accuracy']:.1%}" for k, v in rows.items())
        + f"; median ms a step: full float {rows['full, float']['median_step_ms']:.1f}, full int8 "
        f"{rows['full, int8']['median_step_ms']:.1f}; wall time {seconds:.1f} s",
    )
    assert (
        rows["base model, float"]["original_accuracy"] > 0.95
        and rows["base model, int8"]["original_accuracy"] > 0.95
    )
    assert abs(base8 - rows["base model, float"]["user_accuracy"]) < 0.05  # quantization costs little
    for variant in ("head-only", "full"):
        assert rows[f"{variant}, int8"]["user_accuracy"] >= base8 + 0.2, (variant, base8)
        assert rows[f"{variant}, int8 -> float export"]["user_accuracy"] >= base8 + 0.2, variant
        for kind in ("float", "int8"):
            row = rows[f"{variant}, {kind}"]
            assert row["steps"] == EPOCHS * 5 and row["median_step_ms"] > 0 and row["artifact_bytes"] > 0
            # edgetrain's own run gives onnxruntime's accuracy: to the digit for float; for int8 within a few of
            # 400 digits (onnxruntime's fused integer kernels move an output by a quantization step, which can
            # break a tie between two classes)
            tolerance = 0 if kind == "float" else 0.01
            assert abs(row["edgetrain_user_accuracy"] - row["user_accuracy"]) <= tolerance, row["name"]
    # the int8 exports are a quarter of the float ones, and head-only's int8 artifact keeps its frozen weights int8
    assert rows["full, int8"]["model_bytes"] < rows["full, float"]["model_bytes"] / 3
    assert rows["head-only, int8"]["artifact_bytes"] < rows["head-only, float"]["artifact_bytes"] / 3
    q = r["quantization"]
    assert q["quant_format"] == "QDQ" and q["per_channel"] and q["calibration_samples"] == 1050
    assert "onnxruntime fuses the int8 graph" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_the_numbers_are_onnxruntime_on_the_exported_files(demo):
    _, r, files, _ = demo
    rows = {row["name"]: row for row in r["rows"]}
    user = _heldout(DATA / "newuser", "test")
    original = _heldout(DATA / "digits", "test")
    for name in ("base model, int8", "full, int8", "head-only, int8 -> float export"):
        path = files.parent / rows[name]["path"]  # as given: relative to the demo's working directory
        assert path.parent == files and path.stat().st_size == rows[name]["model_bytes"], name
        assert _onnxruntime_accuracy(path, *user) == pytest.approx(rows[name]["user_accuracy"], abs=1e-12), (
            name
        )
        assert _onnxruntime_accuracy(path, *original) == pytest.approx(
            rows[name]["original_accuracy"], abs=1e-12
        ), name
    assert f"{100 * rows['full, int8']['user_accuracy']:.1f}%" in next(
        line for line in demo[0].stdout.splitlines() if line.strip().startswith("full, int8 ")
    )


def test_the_int8_export_is_an_int8_qdq_model(demo):
    """The personalized int8 model keeps the base int8 model's nodes and its weights int8 (trained, requantized);
    onnxruntime runs it on raw digits, the input pipeline inside."""
    _, r, files, _ = demo
    base = onnx.load(str(files / "base-int8.onnx")).graph
    for variant in ("head-only", "full"):
        model = onnx.load(str(files / f"personalized-{variant}-int8.onnx")).graph
        ops = [n.op_type for n in model.node]
        assert ops.count("DequantizeLinear") == [n.op_type for n in base.node].count("DequantizeLinear")
        weights = {t.name: t for t in model.initializer if t.name.endswith(".weight_quantized")}
        assert len(weights) == 5, sorted(weights)
        assert all(t.data_type == onnx.TensorProto.INT8 for t in weights.values())
        assert not any(t.name.endswith(".weight") for t in model.initializer)  # no float master left
        base_fc3 = next(t for t in base.initializer if t.name == "fc3.weight_quantized")
        assert weights["fc3.weight_quantized"].raw_data != base_fc3.raw_data  # trained
        sess = ort.InferenceSession(
            str(files / f"personalized-{variant}-int8.onnx"), providers=["CPUExecutionProvider"]
        )
        assert sess.get_inputs()[0].type == "tensor(uint8)"


def test_without_onnxruntime_it_says_to_install_it(tmp_path):
    """onnxruntime cannot be imported (onnx can): exit 1 and one line saying what to install."""
    script = """
import sys
from edgetrain.cli import main
sys.exit(main(["demo", "--quantized", "--out", sys.argv[1]]))
"""
    proc = run_on_device(sys.executable, script, str(tmp_path / "out"), blocked=("onnxruntime",))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pip install onnxruntime" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_the_recurrent_models_are_refused(tmp_path):
    proc = cli("--quantized", "--model", "lstm", cwd=tmp_path)
    assert proc.returncode == 2 and "--quantized runs with the LeNet" in proc.stderr, proc.stderr
