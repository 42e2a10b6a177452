"""Activation recomputation and training within a memory budget (issue 25).

Recomputation must change nothing but memory: a step that recomputes saved activations gives the losses and
weights of the step that keeps them, bit for bit, over several steps on the device's own path (the saved artifact,
its memory plan, the fused optimizer), and its planned arena is smaller where there is something to recompute. A
budgeted artifact's step fits its budget as `edgetrain inspect` counts it, and trains exactly what
`edgetrain check --memory-budget` announced."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core.errors import EdgeTrainError, ModelError, UnsupportedError
from edgetrain.derive.budget import parse_bytes
from edgetrain.derive.pipeline import memory_options
from edgetrain.graph.footprint import FUSED_CHUNK
from edgetrain.graph.sections import ChannelsSection, MemoryBudgetSection
from edgetrain.runtime.describe import artifact_step_memory
from edgetrain.runtime.fused import CHUNK

BATCH = 8
LEVELS = ("cheap", "segments")


def _convert(model, **kw):
    opt = kw.pop("optimizer", et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4))
    return et.convert(model, loss=et.CrossEntropyLoss(), optimizer=opt, batch_size=BATCH, **kw)


def _run(path, x, y, steps: int = 3):
    sess = et.TrainingSession(path)
    losses = [sess.train_step(x, y) for _ in range(steps)]
    return losses, sess.parameters()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("level", LEVELS)
def test_recomputation_is_bit_for_bit_the_step_that_keeps_everything(name, level, tmp_path):
    build, _, _ = MODELS[name]
    model = build()
    x, y = batch_for(name, BATCH)
    kept = _convert(model)
    kept.save(tmp_path / "kept.etrain")
    again = _convert(model, recompute=level)
    again.save(tmp_path / "again.etrain")
    losses0, params0 = _run(tmp_path / "kept.etrain", x, y)
    losses1, params1 = _run(tmp_path / "again.etrain", x, y)
    assert losses0 == losses1
    assert params0.keys() == params1.keys()
    for p in params0:
        assert np.array_equal(params0[p], params1[p]), p
    assert losses0[-1] < losses0[0]  # it trains


def _mobile_like():
    """Conv -> Clip (Relu6) blocks, the MobileNet pattern: the Clip's gradient reads the convolution's output,
    the next weight gradient the Clip's, so 'cheap' recomputation halves what is kept."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    h, c = "input", 3
    for k, out in enumerate((8, 16, 16, 32)):
        w = onnx.numpy_helper.from_array(
            (rng.standard_normal((out, c, 3, 3)) * 0.3).astype(np.float32), f"w{k}"
        )
        b = onnx.numpy_helper.from_array(np.zeros(out, np.float32), f"b{k}")
        inits += [w, b]
        nodes.append(onnx.helper.make_node("Conv", [h, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(onnx.helper.make_node("Clip", [f"c{k}", "lo", "hi"], [f"r{k}"]))
        h, c = f"r{k}", out
    inits += [
        onnx.numpy_helper.from_array(np.float32(0), "lo"),
        onnx.numpy_helper.from_array(np.float32(6), "hi"),
    ]
    nodes.append(onnx.helper.make_node("GlobalAveragePool", [h], ["gap"]))
    nodes.append(onnx.helper.make_node("Flatten", ["gap"], ["flat"]))
    fc = onnx.numpy_helper.from_array((rng.standard_normal((c, 10)) * 0.1).astype(np.float32), "fc.weight")
    inits.append(fc)
    nodes.append(onnx.helper.make_node("MatMul", ["flat", "fc.weight"], ["logits"]))
    graph = onnx.helper.make_graph(
        nodes,
        "mobile_like",
        [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_recomputation_shrinks_the_arena_and_onnxruntime_runs_the_step(tmp_path):
    model = _mobile_like()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, BATCH)
    arenas = {}
    for level in ("none", *LEVELS):
        art = _convert(model, recompute=level)
        art.save(tmp_path / f"{level}.etrain")
        arenas[level] = artifact_step_memory(tmp_path / f"{level}.etrain")["arena_bytes"]
        ops = {n.op_type for n in art.graph.nodes}
        assert ("After" in ops) == (level != "none")
        # the emitted step (After as Identity) runs in onnxruntime and gives edgetrain's loss and weights
        sess = ort.InferenceSession(
            art.training_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
        )
        feeds = {art.data_inputs[0]: x, art.target: y.astype(np.int64), art.lr: np.asarray(0.01, np.float32)}
        got = dict(zip(art.graph.outputs, sess.run(None, feeds)))
        losses, params = _run(tmp_path / f"{level}.etrain", x, y, steps=1)
        assert np.isclose(float(got[art.loss]), losses[0], rtol=1e-5)
        for p, new in art.updates.items():
            if p in params:
                np.testing.assert_allclose(got[new], params[p], rtol=1e-4, atol=1e-6)
    assert arenas["cheap"] < arenas["none"]
    assert arenas["segments"] < arenas["none"]


@pytest.mark.parametrize("budget_share", [1.0, 0.6, 0.45])
def test_a_budgeted_artifact_fits_its_budget_and_trains_what_check_announced(budget_share, tmp_path):
    model = MODELS["lenet"][0]()
    full = _convert(model)
    full.save(tmp_path / "full.etrain")
    peak = artifact_step_memory(tmp_path / "full.etrain")["budgeted_bytes"]
    budget = int(peak * budget_share)
    options, pick = memory_options(
        model,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        memory_budget=budget,
        batch_size=BATCH,
    )
    art = _convert(model, memory_budget=budget)
    art.save(tmp_path / "budget.etrain")
    mem = artifact_step_memory(tmp_path / "budget.etrain")
    assert mem["budgeted_bytes"] <= budget
    assert pick is not None and sorted(art.parameters) == sorted(pick.trainable)
    assert (
        art.section(MemoryBudgetSection).chosen["budgeted_bytes"] == mem["budgeted_bytes"]
    )  # planned as inspect counts it
    if budget_share == 1.0:
        assert sorted(art.parameters) == sorted(full.parameters)
    else:
        assert len(art.parameters) < len(full.parameters)
        assert any(not o.peak <= budget for o in options)  # it weighed what did not fit, and said so
    x, y = batch_for("lenet", BATCH)
    losses, params = _run(tmp_path / "budget.etrain", x, y, steps=5)
    assert losses[-1] < losses[0]
    split = {
        s.weight: s for s in getattr(art.section(ChannelsSection), "splits", [])
    }  # on first input channels
    frozen = [p for p in full.parameters if p not in art.parameters]
    sess = et.TrainingSession(tmp_path / "budget.etrain")
    sess.train_step(x, y)
    exported = tmp_path / "personal.onnx"
    sess.export_onnx(exported)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(exported)).graph.initializer}
    for p in frozen:  # what the budget froze stays as it was (the other channels of a split weight)
        s = split.get(p)
        if s is None:
            assert np.array_equal(weights[p], full.initial[p]), p
            continue
        rest = range(s.count, s.total)
        assert np.array_equal(np.take(weights[p], rest, s.axis), np.take(full.initial[p], rest, s.axis)), p
        assert not np.array_equal(weights[p], full.initial[p]), p  # and its first channels trained


def test_a_budget_nothing_fits_is_refused_with_the_smallest_option():
    with pytest.raises(ModelError, match=r"no way to train this model fits .* smallest planned peak is"):
        _convert(MODELS["lenet"][0](), memory_budget="10KB")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("24MB", 24_000_000),
        ("24MiB", 24 << 20),
        ("24M", 24 << 20),
        ("512KB", 512_000),
        ("1.5GiB", 3 << 29),
        (4096, 4096),
    ],
)
def test_budget_sizes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["24 parsecs", "-3MB", "0", "", "MB"])
def test_a_bad_budget_says_what_would_work(bad):
    with pytest.raises(UnsupportedError, match="24MB"):
        parse_bytes(bad)


def test_the_planned_peak_uses_the_fused_optimizers_chunk():
    assert FUSED_CHUNK == CHUNK


def test_check_lists_the_options_and_convert_picks_the_one_it_marks(tmp_path):
    path = tmp_path / "lenet.onnx"
    onnx.save(MODELS["lenet"][0](), path)
    cmd = [sys.executable, "-m", "edgetrain.cli", "check", str(path), "--memory-budget", "400KiB"]
    cmd += ["--batch-size", str(BATCH)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "<- convert picks" in out.stdout and "planned peak" in out.stdout
    picked = next(line for line in out.stdout.splitlines() if line.startswith("convert --memory-budget"))
    cmd = [sys.executable, "-m", "edgetrain.cli", "convert", str(path), "--memory-budget", "400KiB"]
    cmd += ["--batch-size", str(BATCH), "-o", str(tmp_path / "a.etrain")]
    conv = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert conv.returncode == 0, conv.stderr
    note = next(line for line in conv.stdout.splitlines() if "memory budget" in line)
    name = picked.split(" trains ", 1)[1].split(" (recompute")[0]
    assert f"trains {name} (" in note
    assert artifact_step_memory(tmp_path / "a.etrain")["budgeted_bytes"] <= 400 * 1024
    with pytest.raises(EdgeTrainError):
        parse_bytes("lots")


@pytest.mark.parametrize("name", ["lenet", "resnet_tiny", "depthwise_separable"])
def test_a_frozen_part_in_chunks_gives_the_same_steps_in_a_smaller_arena(name, tmp_path):
    from edgetrain.derive.budget import layers

    model = MODELS[name][0]()
    x, y = batch_for(name, BATCH)
    head = layers(_convert(model))[-1]
    whole = _convert(model, trainable=head)
    whole.save(tmp_path / "whole.etrain")
    options, pick = memory_options(
        model,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        memory_budget=artifact_step_memory(tmp_path / "whole.etrain")["budgeted_bytes"] - 1,
        trainable=head,
        batch_size=BATCH,
    )
    assert pick is not None and pick.chunks > 1 and sorted(pick.trainable) == sorted(head)
    art = _convert(model, trainable=head, memory_budget=pick.peak)
    art.save(tmp_path / "chunked.etrain")
    assert art.section(MemoryBudgetSection).chosen["chunks"] == pick.chunks
    mem = [artifact_step_memory(tmp_path / f"{k}.etrain") for k in ("whole", "chunked")]
    assert mem[1]["arena_bytes"] < mem[0]["arena_bytes"]
    losses0, params0 = _run(tmp_path / "whole.etrain", x, y)
    losses1, params1 = _run(tmp_path / "chunked.etrain", x, y)
    np.testing.assert_allclose(losses1, losses0, rtol=1e-6)
    for p in params0:
        np.testing.assert_allclose(params1[p], params0[p], rtol=1e-6, atol=1e-7)
    # the step as standard ONNX (Split, the chunks, After as Identity, Concat) runs in onnxruntime
    sess = ort.InferenceSession(art.training_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {art.data_inputs[0]: x, art.target: y.astype(np.int64), art.lr: np.asarray(0.01, np.float32)}
    got = dict(zip(art.graph.outputs, sess.run(None, feeds)))
    assert np.isclose(float(got[art.loss]), losses0[0], rtol=1e-5)
