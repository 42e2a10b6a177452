"""The frozen-prefix feature cache: head-only and partial fine-tuning with the cache train bit for bit as without it
(batches reshuffled every epoch, so cached rows meet new neighbours), on hand-built nets and real PyTorch exports;
the cut never crosses a node that mixes samples; the cache is off, saying why, where it cannot be exact or gains
nothing; its memory is bounded; changed samples are recomputed; the Trainer, `edgetrain train` and the phone app
use it by themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import MODELS, _Net, lenet, resnet_tiny
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.runtime import feature_cache as prefix_mod
from loaders import ArrayDataView, DataLoader

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4
SAMPLES = 12


def _artifact(tmp_path, model, trainable, *, batch=BATCH, name="m", opt=None, loss=None) -> str:
    art = et.convert(
        model,
        loss=loss or et.CrossEntropyLoss(),
        optimizer=opt or et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
        trainable=trainable,
        batch_size=batch,
    )
    path = str(tmp_path / f"{name}.etrain")
    art.save(path)
    return path


def _data(shape, classes, n=SAMPLES, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(dtype), rng.integers(0, classes, n)


def _train(path, x, y, *, cache, fused=True, epochs=3, batch=BATCH, max_bytes=None):
    """(losses, parameters, cache info) of `epochs` shuffled epochs, batches drawn anew every epoch."""
    sess = et.TrainingSession(path, fused=fused)
    if cache:
        sess.enable_feature_cache(max_bytes)
    losses = []
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(x))
        for i in range(0, len(x), batch):
            idx = order[i : i + batch]
            losses.append(sess.train_step(x[idx], y[idx]))
    return losses, sess.parameters(), sess.feature_cache_info()


def _assert_identical(path, x, y, *, fused=True, hits=True, **kw):
    la, pa, info = _train(path, x, y, cache=True, fused=fused, **kw)
    lb, pb, _ = _train(path, x, y, cache=False, fused=fused, **kw)
    assert la == lb  # bit for bit
    for k in pb:
        assert np.array_equal(pa[k], pb[k]), k
    if hits:
        assert info["enabled"] and info["hits"] > 0, info
    return info


# ---- hand-built nets ------------------------------------------------------------------------------------------------
HEADS = {  # model -> (head-only trainable, a deeper partial fine-tuning)
    "lenet": (["fc3.*"], ["fc2.*", "fc3.*"]),
    "resnet_tiny": (["fc.*"], ["block.conv2.weight", "block.bn2.*", "fc.*"]),
    "depthwise_separable": (["head.*"], ["pw.*", "head.*"]),
}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "graph"])
@pytest.mark.parametrize("depth", [0, 1], ids=["head-only", "partial"])
@pytest.mark.parametrize("name", list(HEADS))
def test_cached_training_is_bit_for_bit_the_uncached(tmp_path, name, depth, fused):
    build, shape, classes = MODELS[name]
    path = _artifact(tmp_path, build(batch=BATCH), HEADS[name][depth])
    x, y = _data(shape, classes)
    info = _assert_identical(path, x, y, fused=fused)
    assert info["samples"] == SAMPLES and info["misses"] == SAMPLES  # each sample through the prefix once
    assert info["hits"] == 2 * SAMPLES  # epochs 2 and 3 entirely from the cache


def test_adam_and_a_regression_loss_too(tmp_path):
    x, _ = _data((3, 12, 12), 10)
    y = np.random.default_rng(1).standard_normal((SAMPLES, 10)).astype(np.float32)
    path = _artifact(tmp_path, resnet_tiny(batch=BATCH), ["fc.*"], opt=et.Adam(lr=0.01), loss=et.MSELoss())
    _assert_identical(path, x, y)


def test_the_boundary_is_where_the_trained_part_starts(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    info = et.TrainingSession(path).enable_feature_cache()
    g = et.TrainingSession(path).artifact.program
    (boundary,) = info["boundary"]
    readers = [n for n in g.nodes if boundary in n.inputs]
    assert any(n.op_type == "Gemm" and "fc3.weight" in n.inputs for n in readers)  # the head reads it
    assert info["prefix_nodes"] == 11  # conv, relu, pool x2, flatten, (gemm, relu) x2


# ---- where the cut must stop -------------------------------------------------------------------------------------
def _net(tmp_path, middle, *, extra_inits=(), name="net") -> tuple[str, np.ndarray, np.ndarray]:
    """input [4, 3, 6, 6] -> Conv (frozen) -> `middle` nodes reading 'c' and writing 'm' [4, 3, 6, 6] -> Flatten ->
    Gemm head (trained) -> logits [4, 5]."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 3, 3, 3)).astype(np.float32) * 0.3, "conv.weight"),
        numpy_helper.from_array(rng.standard_normal((5, 108)).astype(np.float32) * 0.1, "head.weight"),
        numpy_helper.from_array(np.zeros(5, np.float32), "head.bias"),
        *extra_inits,
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight"], ["c"], pads=[1, 1, 1, 1]),
        *middle,
        helper.make_node("Flatten", ["m"], ["f"]),
        helper.make_node("Gemm", ["f", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 3, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = _artifact(tmp_path, model, ["head.*"], name=name)
    x, y = _data((3, 6, 6), 5, seed=3)
    return path, x, y


def _const(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


MIXING = {  # a node between the conv and the head that mixes the samples of a batch: never cached past it
    "batchnorm_training_mode": (
        [helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["m"], training_mode=1)],
        [
            _const("s", np.ones(3)),
            _const("b", np.zeros(3)),
            _const("mu", np.zeros(3)),
            _const("var", np.ones(3)),
        ],
    ),
    "mean_over_the_batch": (
        [
            helper.make_node("ReduceMean", ["c"], ["mu"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["c", "mu"], ["m"]),
        ],
        [],
    ),
    "a_constant_per_batch_position": (
        [helper.make_node("Add", ["c", "pos"], ["m"])],
        [_const("pos", np.arange(BATCH * 108).reshape(BATCH, 3, 6, 6) * 0.01)],
    ),
    "softmax_across_the_batch": ([helper.make_node("Softmax", ["c"], ["m"], axis=0)], []),
    "transpose_batch_and_channels": (
        [
            helper.make_node("Transpose", ["c"], ["t"], perm=[1, 0, 2, 3]),
            helper.make_node("Relu", ["t"], ["u"]),
            helper.make_node("Transpose", ["u"], ["m"], perm=[1, 0, 2, 3]),
        ],
        [],
    ),
}


@pytest.mark.parametrize("case", list(MIXING))
def test_the_cut_stops_before_a_node_that_mixes_samples(tmp_path, case):
    middle, inits = MIXING[case]
    path, x, y = _net(tmp_path, middle, extra_inits=inits)
    info = _assert_identical(path, x, y)  # exact: the conv's rows are cached, the mixing node runs every step
    assert info["boundary"] == ["c"], info


KEEPING = {  # nodes that keep samples apart: cached through
    "softmax_over_channels": [helper.make_node("Softmax", ["c"], ["m"], axis=1)],
    "mean_over_space": [
        helper.make_node("ReduceMean", ["c"], ["mu"], axes=[2, 3], keepdims=1),
        helper.make_node("Sub", ["c", "mu"], ["m"]),
    ],
    "reshape_keeping_the_batch": [
        helper.make_node("Reshape", ["c", "shape1"], ["r"]),
        helper.make_node("Relu", ["r"], ["r2"]),
        helper.make_node("Reshape", ["r2", "shape2"], ["m"]),
    ],
    "transpose_within_a_sample": [
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Sigmoid", ["t"], ["u"]),
        helper.make_node("Transpose", ["u"], ["m"], perm=[0, 3, 1, 2]),
    ],
}
KEEPING_INITS = [
    numpy_helper.from_array(np.array([BATCH, 3, 36], np.int64), "shape1"),
    numpy_helper.from_array(np.array([BATCH, 3, 6, 6], np.int64), "shape2"),
]


@pytest.mark.parametrize("case", list(KEEPING))
def test_the_cut_passes_nodes_that_keep_samples_apart(tmp_path, case):
    inits = KEEPING_INITS if case.startswith("reshape") else []
    path, x, y = _net(tmp_path, KEEPING[case], extra_inits=inits)
    info = _assert_identical(path, x, y)
    assert info["boundary"] == ["f"], info  # everything up to the head's input


# ---- off, and why ----------------------------------------------------------------------------------------------------
def test_full_fine_tuning_has_nothing_to_cache(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), None)
    info = et.TrainingSession(path).enable_feature_cache()
    assert not info["enabled"] and "full fine-tuning" in info["reason"]


def test_a_first_node_that_mixes_samples_is_named(tmp_path):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["input"], ["s"], axis=0),
            helper.make_node("Gemm", ["s", "w", "b"], ["logits"], transB=1),
        ],
        "batch_softmax",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 3])],
        [
            numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "w"),
            _const("b", np.zeros(3)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    info = et.TrainingSession(_artifact(tmp_path, model, ["w", "b"])).enable_feature_cache()
    assert not info["enabled"] and "(Softmax): it mixes the samples of a batch" in info["reason"], info


def test_only_a_scaling_before_the_trained_part_is_not_cached(tmp_path):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["input", "scale"], ["s"]),
            helper.make_node("Gemm", ["s", "w", "b"], ["logits"], transB=1),
        ],
        "scaled",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 3])],
        [
            _const("scale", [0.5]),
            numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "w"),
            _const("b", np.zeros(3)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    info = et.TrainingSession(_artifact(tmp_path, model, ["w", "b"])).enable_feature_cache()
    assert not info["enabled"] and "too cheap" in info["reason"] and "Mul" in info["reason"]


def test_rows_that_depend_on_their_position_turn_the_cache_off_after_the_first_batch(tmp_path, monkeypatch):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    monkeypatch.setattr(prefix_mod.FeatureCache, "rows_independent", lambda self, data: False)
    x, y = _data((1, 28, 28), 10)
    losses, params, info = _train(path, x, y, cache=True)
    assert not info["enabled"] and "position in the batch" in info["reason"]
    assert losses == _train(path, x, y, cache=False)[0]


def test_a_product_that_rounds_rows_by_position_is_cut_off_the_prefix(tmp_path, monkeypatch):
    """A BLAS may round a row of a matrix product differently by where the row sits in the batch (OpenBLAS 0.3.31
    does on some CPUs, at a batch of 10). The cache then keeps the part before the product (the convolutions) and
    runs the products in every step: still on, still bit for bit."""
    import dataclasses

    from edgetrain.core.kernels import KERNELS
    from edgetrain.core.ops import record

    gemm = KERNELS["Gemm"]

    def by_position(a, b, c=None, **kw):
        y = gemm.fn(a, b, c, **{k: v for k, v in kw.items() if k != "out"})
        return y + np.float32(1e-3) * np.arange(len(y), dtype=np.float32)[:, None]  # row i gets i * 1e-3

    monkeypatch.setattr(record("Gemm"), "kernel", dataclasses.replace(gemm, fn=by_position, writes_out=False))
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10)
    info = _assert_identical(path, x, y)
    graph = et.convert(lenet(batch=BATCH), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1)).graph
    producers = {o: n.op_type for n in graph.nodes for o in n.outputs}
    assert [producers[b] for b in info["boundary"]] == ["Flatten"], info["boundary"]


# ---- memory, changed samples, sharing ---------------------------------------------------------------------------
def test_a_small_budget_caches_what_fits_and_stays_exact(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10)
    row = et.TrainingSession(path).enable_feature_cache()["row_bytes"]
    info = _assert_identical(path, x, y, max_bytes=5 * row, hits=False)
    assert info["capacity"] == 5 and info["samples"] == 5 and info["bytes"] <= 5 * row
    off = _train(path, x, y, cache=True, max_bytes=0)[2]
    assert off["capacity"] == 0 and off["samples"] == 0 and off["hits"] == 0


def test_a_changed_sample_is_computed_again(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10)
    a, b = et.TrainingSession(path), et.TrainingSession(path)
    a.enable_feature_cache()
    for sess in (a, b):
        sess.train_step(x[:BATCH], y[:BATCH])
    x2 = x[:BATCH].copy()
    x2[1, 0, 5, 5] += 1.0  # one sample changed (the user drew it again)
    assert a.train_step(x2, y[:BATCH]) == b.train_step(x2, y[:BATCH])
    info = a.feature_cache_info()
    # the batch went through the prefix again (which runs whole batches); the new sample's rows were kept
    assert info["misses"] == 2 * BATCH and info["hits"] == 0 and info["samples"] == BATCH + 1
    for k, v in b.parameters().items():
        assert np.array_equal(a.parameters()[k], v)


def test_a_later_session_of_the_same_artifact_takes_the_rows_over(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10)
    first = et.TrainingSession(path)
    first.enable_feature_cache()
    first.train_step(x[:BATCH], y[:BATCH])
    second = et.TrainingSession(path)
    second.enable_feature_cache(rows=first.feature_rows)
    second.train_step(x[:BATCH], y[:BATCH])
    assert second.feature_cache_info()["hits"] == BATCH
    # another artifact of the same structure but other frozen weights never reads them
    other = _artifact(tmp_path, lenet(batch=BATCH, seed=5), ["fc3.*"], name="other")
    third = et.TrainingSession(other)
    third.enable_feature_cache(rows=first.feature_rows)
    plain = et.TrainingSession(other)
    assert third.train_step(x[:BATCH], y[:BATCH]) == plain.train_step(x[:BATCH], y[:BATCH])
    assert third.feature_cache_info()["hits"] == 0


# ---- the users: Trainer, edgetrain train, the phone -----------------------------------------------------------
def _loader(x, y, **kw):
    return DataLoader(ArrayDataView(x, y), BATCH, shuffle=True, seed=7, **kw)


def test_the_trainer_uses_it_and_says_so(tmp_path):
    path = _artifact(tmp_path, resnet_tiny(batch=BATCH), ["fc.*"])
    x, y = _data((3, 12, 12), 10)
    runs = {}
    for on in (True, False):
        events = []
        sess = et.TrainingSession(path)
        trainer = et.Trainer(sess, _loader(x, y), epochs=3, feature_cache=on, progress=events.append)
        trainer.fit()
        runs[on] = (trainer.history, sess.parameters(), events)
    (h_on, p_on, ev_on), (h_off, p_off, ev_off) = runs[True], runs[False]
    for k in p_off:
        assert np.array_equal(p_on[k], p_off[k]), k
    assert [r["train_loss"] for r in h_on] == [r["train_loss"] for r in h_off]
    told = [e for e in ev_on if e["event"] == "feature_cache"]
    assert len(told) == 1 and told[0]["enabled"]
    assert [r.get("feature_cache_hits") for r in h_on] == [0, SAMPLES, SAMPLES]
    assert "feature_cache_hits" not in h_off[0]
    assert [e for e in ev_off if e["event"] == "feature_cache"][0]["reason"] == "turned off"


def test_the_trainer_leaves_it_off_under_augmentation(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10)
    sess = et.TrainingSession(path)
    flip = lambda a, b: (a[..., ::-1].copy(), b)  # noqa: E731
    trainer = et.Trainer(sess, _loader(x, y, transform=flip), epochs=1)
    assert not trainer.feature_cache["enabled"] and "transform" in trainer.feature_cache["reason"]


def test_edgetrain_train_says_it_uses_the_cache(tmp_path):
    path = _artifact(tmp_path, lenet(batch=BATCH), ["fc3.*"])
    x, y = _data((1, 28, 28), 10, n=16)
    np.savez(tmp_path / "d.npz", x=x, y=y)

    def train(*extra):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgetrain.cli",
                "train",
                path,
                "--data",
                str(tmp_path / "d.npz"),
                "--epochs",
                "2",
                "--log",
                str(tmp_path / "log.jsonl"),
                "--overwrite",
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr, [json.loads(s) for s in (tmp_path / "log.jsonl").read_text().splitlines()]

    err, log = train()
    assert "feature cache on" in err and "samples' frozen features from the cache" in err
    assert [r.get("feature_cache_hits") for r in log] == [0, 16]
    err_off, log_off = train("--feature-cache-mb", "0")
    assert "feature cache off: turned off" in err_off
    assert [r["train_loss"] for r in log_off] == [r["train_loss"] for r in log]


def test_the_phone_app_keeps_the_cache_across_bursts_and_reports_it(tmp_path):
    from android_demo.app import Home
    from android_demo.simulate import _new_user

    art = et.convert(
        str(ROOT / "edgetrain" / "data" / "digits_lenet.onnx"),
        loss=et.CrossEntropyLoss(ignore_index=-100),
        optimizer=et.SGD(lr=0.01, momentum=0.9),
        trainable=["fc3.*"],
        batch_size=10,
    )
    art.save(str(tmp_path / "head.etrain"))
    user, _ = _new_user()
    homes = {}
    for mb in (16.0, 0.0):
        home = Home.init(
            tmp_path / f"home{mb}",
            tmp_path / "head.etrain",
            max_seconds=None,
            max_steps=6,
            feature_cache_mb=mb,
        )
        for i in range(40):
            home.add(*user.get_item(i))
        homes[mb] = [home.personalize(force=True) for _ in range(2)], home
    (on, home_on), (off, home_off) = homes[16.0], homes[0.0]
    assert on[0].feature_cache.startswith("on") and on[1].feature_cache.startswith("on: ")
    hits = int(on[1].feature_cache.split("on: ")[1].split(" of ")[0])
    assert hits > 0  # the second burst's session found the first burst's rows
    assert off[0].feature_cache.startswith("off")
    assert [r.losses for r in on] == [r.losses for r in off]
    p_on, p_off = home_on.session().parameters(), home_off.session().parameters()
    for k in p_off:
        assert np.array_equal(p_on[k], p_off[k]), k


def test_the_phone_apps_full_fine_tuning_says_why_it_has_no_cache(tmp_path):
    from android_demo.app import Home
    from android_demo.simulate import ARTIFACT, _new_user

    user, _ = _new_user()
    home = Home.init(tmp_path / "home", ARTIFACT, max_seconds=None, max_steps=2)
    for i in range(30):
        home.add(*user.get_item(i))
    r = home.personalize(force=True)
    assert r.feature_cache.startswith("off: ") and "full fine-tuning" in r.feature_cache


# ---- real exports -------------------------------------------------------------------------------------------------
REAL = [
    ("mobilenet_v2", "torchscript", "eval"),
    ("resnet18", "torchscript", "preserve"),
    ("efficientnet_b0", "dynamo", "eval"),
    ("bert", "torchscript", "eval"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model,exporter,mode", REAL, ids=["-".join(c) for c in REAL])
def test_real_exports_head_only_with_the_cache_bit_for_bit(tmp_path_factory, model, exporter, mode):
    pytest.importorskip("torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)")
    import exports

    exports.declare_torchvision_ops()
    if model == exports.BERT:
        pytest.importorskip(
            "transformers", reason="transformers is optional: pip install transformers==4.57.6"
        )
    else:
        pytest.importorskip("torchvision", reason="torchvision is optional: pip install torchvision==0.28.0")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    ex = exports.export(model, tmp_path_factory.mktemp("exports"), exporter=exporter, mode=mode, batch=None)
    head = exports.HEADS.get(model, "classifier")
    trainable = [onnx_name for torch_name, onnx_name in ex.names.items() if torch_name.startswith(head)]
    assert trainable
    tmp = tmp_path_factory.mktemp("art")
    path = _artifact(tmp, onnx.load(str(ex.path)), trainable, batch=BATCH)
    if model == exports.BERT:
        x = np.random.default_rng(0).integers(1, 100, (8, *ex.sample_shape)).astype(np.int64)
    else:
        x = _data(ex.sample_shape, ex.num_classes, n=8)[0]
    y = np.random.default_rng(1).integers(0, ex.num_classes, len(x))
    _assert_identical(path, x, y, epochs=2)


# ---- kernels that put several samples in one product ----------------------------------------------------------------
def _pointwise_net() -> onnx.ModelProto:
    """A stride-4 stem to 2x2 positions, then 1x1 convolutions over those few positions (the fast path that runs
    them as one GEMM over the batch: fastpaths.BATCH_MIXING), global pooling and a Gemm head ("fc")."""
    net = _Net(3)
    h = net.node("Relu", [net.conv("input", "c0", 3, 32, 4, strides=[4, 4])])
    for k, (cin, cout) in enumerate([(32, 64), (64, 96), (96, 64)], start=1):
        h = net.node("Relu", [net.conv(h, f"c{k}", cin, cout, 1)])
    h = net.node("Flatten", [net.node("GlobalAveragePool", [h])])
    net.gemm(h, "fc", 64, 5)
    return net.model(["n", 3, 8, 8], 5, "pointwise")


def test_the_frozen_prefix_computes_each_sample_on_its_own_so_the_cache_reaches_the_head(
    tmp_path, monkeypatch
):
    """A 1x1 convolution over few positions runs as one GEMM over the batch, where a BLAS may round a sample's
    result by its position (OpenBLAS 0.3.31 does on MobileNetV2's last layers: the cache then stopped 62 nodes short
    of the head). Nodes of the frozen prefix compute each sample on its own, in the step with the cache and without
    it alike, so the cache reaches the head and stays bit for bit; a trained 1x1 convolution keeps the batched GEMM."""
    from edgetrain.core.kernels import conv

    x, y = _data((3, 8, 8), 5, n=16)
    head = _artifact(tmp_path, _pointwise_net(), ["fc.*"], batch=8, name="head")
    full = _artifact(tmp_path, _pointwise_net(), None, batch=8, name="full")
    calls: list[str] = []
    batched = conv.batch_columns
    monkeypatch.setattr(conv, "batch_columns", lambda a3: calls.append("batched") or batched(a3))
    info = _assert_identical(head, x, y, batch=8)
    g = et.TrainingSession(head).artifact.program
    (boundary,) = info["boundary"]
    readers = [n for n in g.nodes if boundary in n.inputs]
    assert any(n.op_type == "Gemm" and "fc.weight" in n.inputs for n in readers), info  # the head reads it
    assert info["prefix_nodes"] == 10, info  # 4 convs, 4 relus, the pooling, the flatten: every frozen node
    assert not calls  # no frozen node put samples in one product
    sess = et.TrainingSession(full)
    sess.train_step(x[:8], y[:8])
    assert calls  # where the layers train, the batched GEMM still runs
