"""`edgetrain demo --model lstm` (and gru), end to end in a subprocess as a user runs it: a sequence model that reads
each digit row by row is personalized on the device; head-only and full fine-tuning beat the base model on the new
user's held-out digits by a clear margin, head-only's program has no backward through the recurrence, the exported
models keep the one compact LSTM (GRU) node, with its weights trained by full fine-tuning only, and onnxruntime
agrees with edgetrain on them. Also: the shipped base models are the ones tools/build_demo_assets.py builds."""

from __future__ import annotations

import importlib.util
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
from onnx import numpy_helper

import edgetrain as et
from loaders import MnistDataView

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "edgetrain" / "data"

# Measured when the assets were built (tools/build_demo_assets.py, 2026-11-22), 20 epochs on the user's 50 samples:
#   lstm: base 21.8% on the new user's held-out digits -> head-only 56.2%, full 63.2% (97.0% on the original test)
#   gru:  base 27.8% -> head-only 62.7%, full 72.5% (96.3% on the original test)
# The asserted margins leave room for BLAS and platform differences.
HEAD_MARGIN, FULL_MARGIN = 0.20, 0.25
PARAMETERS = {
    "lstm": 4 * 64 * (28 + 64 + 2) + 650,
    "gru": 3 * 64 * (28 + 64 + 2) + 650,
}  # W, R, B and the head


def _load_build_tool():
    spec = importlib.util.spec_from_file_location(
        "build_demo_assets", ROOT / "tools" / "build_demo_assets.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _initializers(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.fixture(scope="module", params=["lstm", pytest.param("gru", marks=pytest.mark.slow)])
def demo(request, tmp_path_factory):
    model = request.param
    out = tmp_path_factory.mktemp(f"demo-{model}")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "demo", "--model", model, "--json", str(out / "r.json")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # without --out, the files go to ./edgetrain-demo-MODEL, beside the LeNet demo's ./edgetrain-demo
    return model, proc, json.loads((out / "r.json").read_text()), out / f"edgetrain-demo-{model}", seconds


def test_personalization_beats_the_base_model(demo, report):
    model, proc, r, _, seconds = demo
    base = r["base_user_accuracy"]
    head, full = r["variants"]["head-only"], r["variants"]["full"]
    report(
        f"demo (edgetrain demo --model {model})",
        f"new user's held-out digits: base {base:.1%} -> head-only {head['user_accuracy']:.1%} "
        f"({head['train_seconds']:.1f} s), full {full['user_accuracy']:.1%} ({full['train_seconds']:.1f} s); "
        f"original handwriting: base {r['base_original_accuracy']:.1%}; wall time {seconds:.1f} s",
    )
    assert r["model"] == model
    assert r["base_original_accuracy"] > 0.93  # the base model reads the handwriting it learned
    assert base < 0.4  # and not the new user's
    assert head["user_accuracy"] >= base + HEAD_MARGIN, (base, head["user_accuracy"])
    assert full["user_accuracy"] >= base + FULL_MARGIN, (base, full["user_accuracy"])
    assert head["trainable"] == 650 and full["trainable"] == PARAMETERS[model]
    assert r["user_train_samples"] == 50 and r["user_heldout_samples"] == 400
    op = model.upper()
    for text in (
        f"digits_{model}.onnx",
        "head-only (fc) and full",
        f"head-only has no backward through the {op}; full goes back through it, all 28 steps",
        f"{100 * base:.1f}%",
        f"{100 * full['user_accuracy']:.1f}%",
        "onnxruntime runs them with the same accuracy",
        f"the {op} stays one ONNX node: head-only's weights as shipped; full's {model}.W, {model}.R, {model}.B "
        "trained",
    ):
        assert text in proc.stdout, text
    assert "Traceback" not in proc.stderr


def test_head_only_program_has_no_backward_through_the_recurrence(demo):
    model, _, _, files, _ = demo
    op = model.upper()
    ops = {
        name: {n.op_type for n in et.TrainingSession(str(files / f"{name}.etrain")).artifact.program.nodes}
        for name in ("head-only", "full")
    }
    assert op in ops["head-only"] and f"{op}Grad" not in ops["head-only"], sorted(ops["head-only"])
    assert f"{op}Grad" in ops["full"], sorted(ops["full"])


def test_exported_models_keep_the_recurrent_node_and_run_in_onnxruntime(demo):
    model, _, r, files, _ = demo
    op = model.upper()
    held = MnistDataView.from_dir(DATA / "newuser", "test", normalize=False)
    x, y = held.get_batch(np.arange(len(held)))
    x = x.astype(np.uint8)  # the digits as stored: the exported model holds its input pipeline (x / 255)
    shipped_path = DATA / f"digits_{model}.onnx"
    shipped = _initializers(shipped_path)
    shipped_ops = [n.op_type for n in onnx.load(str(shipped_path)).graph.node]
    recurrent = [f"{model}.W", f"{model}.R", f"{model}.B"]
    for name, v in r["variants"].items():
        path = files.parent / v["onnx_path"]  # relative to the directory the demo ran in
        assert path.parent == files and path.exists(), path
        exported = onnx.load(str(path))
        onnx.checker.check_model(exported, full_check=True)
        # the same compact graph: one recurrent node, nothing unrolled, after the input pipeline's nodes
        pre = [n.op_type for n in exported.graph.node if n.name.startswith("preprocessing")]
        assert pre == ["Cast", "Div", "Identity"], name
        assert [
            n.op_type for n in exported.graph.node if not n.name.startswith("preprocessing")
        ] == shipped_ops
        (node,) = [n for n in exported.graph.node if n.op_type == op]
        assert list(node.input[1:4]) == recurrent
        mine = _initializers(path)
        changed = [k for k in recurrent if not np.array_equal(mine[k], shipped[k])]
        assert changed == (recurrent if name == "full" else []), (name, changed)
        assert not np.array_equal(mine["fc.weight"], shipped["fc.weight"]), name  # both trained the head
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (probs,) = sess.run(None, {"image": x})
        assert float(np.mean(probs.argmax(1) == y)) == pytest.approx(v["user_accuracy"], abs=1e-9), name
        assert v["onnxruntime_max_diff"] < 1e-4
    for name in ("head-only.etck", "full.etck", "summary.json"):
        assert (files / name).exists(), name


def test_the_default_demo_is_still_lenet():
    from edgetrain.cli import build_parser

    args = build_parser().parse_args(["demo"])
    assert args.model == "lenet" and args.out is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--model", "cnn"])
    with pytest.raises(et.EdgeTrainError, match="lenet, lstm, gru"):
        from edgetrain.demo import run_demo

        run_demo("unused", model="cnn")


@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_shipped_base_model_is_the_build_tools_graph(model):
    """The committed asset has the graph tools/build_demo_assets.py writes (before training): image [N, 1, 28, 28]
    read row by row by one forward LSTM/GRU of 64 units, the last hidden state into Gemm "fc", a Softmax."""
    tool = _load_build_tool()
    fresh = tool.BASE_MODELS[model]["build"](tool.SEED)
    shipped = onnx.load(str(DATA / f"digits_{model}.onnx"))
    strip = lambda g: [(n.op_type, list(n.input), list(n.output)) for n in g.node]  # noqa: E731
    assert strip(shipped.graph) == strip(fresh.graph)
    (node,) = [n for n in shipped.graph.node if n.op_type == model.upper()]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["hidden_size"] == 64 and attrs.get("direction", b"forward") == b"forward"
    assert attrs.get("layout", 0) == 0
    fresh_init = {t.name: numpy_helper.to_array(t) for t in fresh.graph.initializer}
    for name, value in _initializers(DATA / f"digits_{model}.onnx").items():
        assert value.shape == fresh_init[name].shape and value.dtype == fresh_init[name].dtype, name
        if value.dtype == np.int64:  # shape constants, never trained
            np.testing.assert_array_equal(value, fresh_init[name])
    assert (DATA / f"digits_{model}.onnx").stat().st_size < 150_000


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_shipped_base_model_is_reproducible(model, tmp_path):
    """Training it again from scratch (30 epochs, about 15 s with one BLAS thread) gives the committed file. Should
    the arithmetic round differently (another BLAS; issue 25's LSTM backward, whose gradients differ from the old
    loop's by 6e-8 relative), the same model up to that: the same graph and test accuracy within two points (that
    rounding alone moved the 30 epochs' LSTM from 96.97% to 95.29%)."""
    from edgetrain.demo import _blas_threads

    tool = _load_build_tool()
    path = tmp_path / f"digits_{model}.onnx"
    with _blas_threads(1):  # the tool sets one thread for the process; this puts the setting back after
        recipe = tool.BASE_MODELS[model]
        tool.train_base(str(DATA / "digits"), str(path), epochs=recipe["epochs"], seed=tool.SEED, model=model)
    committed = DATA / f"digits_{model}.onnx"
    if path.read_bytes() == committed.read_bytes():
        return
    test = MnistDataView.from_dir(DATA / "digits", "test")
    x, y = test.get_batch(np.arange(len(test)))
    acc = {}
    for key, p in (("rebuilt", path), ("committed", committed)):
        sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        acc[key] = float(np.mean(sess.run(None, {"image": x})[0].argmax(1) == y))
    assert abs(acc["rebuilt"] - acc["committed"]) <= 0.02, acc
