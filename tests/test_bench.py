"""tools/bench.py cannot rot: its --quick run (MLP and LeNet at batch 32, edgetrain and PyTorch when installed)
writes well-formed JSON and markdown with finite, positive numbers and one first loss for every runtime, and its
FLOP count matches a closed form. No assertion here depends on how fast anything is."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tools" / "bench"
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_run_writes_its_files_outside_docs(quick):
    assert (quick / "benchmarks.json").is_file() and (quick / "benchmarks.md").is_file()
    assert (quick / "benchmarks.png").is_file() == HAS_MATPLOTLIB
    assert quick.resolve() != (ROOT / "docs").resolve()


def test_quick_json_holds_finite_positive_numbers(quick):
    doc = json.loads((quick / "benchmarks.json").read_text())
    assert doc["quick"] is True and doc["settings"]["threads"] == 1
    assert positive(doc["gemm_peak_gflops"]) and positive(doc["harness"]["total_s"])
    assert doc["machine"]["cpu"] and doc["versions"]["numpy"]
    rows = {r["config"]: r for r in doc["configs"]}
    assert set(rows) == {"mlp-b32", "lenet-b32"}
    runtimes = {"edgetrain", "torch"} if HAS_TORCH else {"edgetrain"}
    for row in rows.values():
        assert set(row["runtimes"]) == runtimes, row["runtimes"]
        for rt, r in row["runtimes"].items():
            assert "error" not in r, (row["config"], rt, r)
            for key in (
                "step_ms",
                "peak_rss_mb",
                "import_s",
                "first_loss",
                "artifact_bytes",
                "gemm_fraction",
            ):
                assert positive(r[key]), (row["config"], rt, key, r.get(key))
            assert r["rounds"] == 1 and all(positive(v) for v in r["round_step_ms"])
        facts = row["facts"]
        for key in (
            "step_flops",
            "forward_flops",
            "parameters",
            "edgetrain_bytes",
            "edgetrain_planned_peak_bytes",
        ):
            assert positive(facts[key]), (key, facts.get(key))
        # the same weights and batch give every runtime the same first loss
        assert row["first_loss"]["match"] is True, row["first_loss"]
        if HAS_TORCH:
            assert positive(row["ratios"]["edgetrain/torch"])
            assert row["targets"]["edgetrain/torch"]["target"] == 0.7
            assert isinstance(row["targets"]["edgetrain/torch"]["met"], bool)
        assert "edgetrain/ort" not in row["ratios"]  # the quick run leaves onnxruntime-training out
    for item in doc["targets"]:
        assert positive(item["value"]) and positive(item["target"]) and isinstance(item["met"], bool)


def test_quick_markdown_is_a_readable_table(quick):
    md = (quick / "benchmarks.md").read_text()
    assert md.startswith("# Training-step benchmark")
    for heading in ("## Per training step", "## Memory, import time and files", "## Issue 12's targets"):
        assert heading in md
    for describe in ("MLP 784-128-10, batch 32", "LeNet, batch 32"):
        rows = [ln for ln in md.splitlines() if ln.startswith(f"| {describe} |")]
        assert len(rows) == 3, rows  # the step, memory and arithmetic tables
    assert "nan" not in md.lower() and "inf " not in md


def test_step_flops_of_the_mlp_match_the_closed_form(tmp_path):
    sys.path.insert(0, str(BENCH))
    import models
    import onnx
    import prepare

    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), path)
    b = 4
    fc1, fc2 = 2 * b * 784 * 128, 2 * b * 128 * 10
    full = prepare.step_flops(path, b, {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
    # fc1: forward + weight gradient (its input is data); fc2: forward + weight and input gradients
    assert full == {"forward_flops": fc1 + fc2, "step_flops": 2 * fc1 + 3 * fc2}
    head = prepare.step_flops(path, b, {"fc2.weight", "fc2.bias"})
    assert head == {"forward_flops": fc1 + fc2, "step_flops": fc1 + 2 * fc2}


def test_configs_select_names_globs_and_the_quick_set():
    sys.path.insert(0, str(BENCH))
    import configs

    assert [c.name for c in configs.select(None, quick=True)] == ["mlp-b32", "lenet-b32"]
    assert all(c.steps <= 20 for c in configs.select(None, quick=True))
    assert [c.name for c in configs.select(["resnet18-*"], quick=False)] == ["resnet18-full", "resnet18-head"]
    every = configs.select(None, quick=False)
    assert {c.name for c in every} >= {
        "mlp-b1",
        "mlp-b64",
        "lenet-b64",
        "mobilenet_v2-epoch",
        "efficientnet_b0-head",
    }
    with pytest.raises(SystemExit):
        configs.select(["no-such-model"], quick=False)


def test_recurrent_configs_run_when_named_and_write_their_own_files():
    sys.path.insert(0, str(BENCH))
    import configs

    recurrent = configs.select(["lstm*", "gru*", "bilstm*"], quick=False)
    assert [c.name for c in recurrent] == [
        "lstm-b32-full",
        "lstm-b32-head",
        "lstm-b1-full",
        "gru-b32-full",
        "bilstm2-b32-full",
    ]
    assert all(c.family == "recurrent" and configs.ratio_targets(c) == {} for c in recurrent)
    assert configs.output_stem(recurrent) == "benchmarks-recurrent"
    default = configs.select(None, quick=False)  # issue 12's run, written to docs/benchmarks.*
    assert not any(c.family == "recurrent" for c in default)
    assert configs.output_stem(default) == "benchmarks"


def test_step_flops_of_an_lstm_match_the_closed_form(tmp_path):
    sys.path.insert(0, str(BENCH))
    import numpy as np
    import onnx
    import prepare
    from onnx import TensorProto, helper, numpy_helper

    t, n, i, h = 5, 3, 4, 6
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), name)
        for name, s in (("W", (1, 4 * h, i)), ("R", (1, 4 * h, h)), ("B", (1, 8 * h)))
    ]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=h)],
        "lstm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [t, n, i])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [t, 1, n, h])],
        inits,
    )
    path = tmp_path / "lstm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    fi, fr = 2 * t * n * 4 * h * i, 2 * t * n * 4 * h * h
    # X is data: the input product once more for W's gradient; the recurrent one for R's and for back through time
    assert prepare.step_flops(path, n, {"W", "R", "B"}) == {
        "forward_flops": fi + fr,
        "step_flops": 2 * fi + 3 * fr,
    }
    assert prepare.step_flops(path, n, set()) == {"forward_flops": fi + fr, "step_flops": fi + fr}
