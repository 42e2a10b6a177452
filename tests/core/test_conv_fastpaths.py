"""The convolution kernels' fast paths (edgetrain.core.fastpaths: conv1x1, conv1x1_batched, conv_strided_flat,
conv_gi_as_conv, depthwise, depthwise_dense; maxpool_grad_grid) against the plain im2col / col2im path they replace,
on varied shapes (groups, depthwise, dilations, strides, pads, 1x1, odd sizes, batch 1, 1-D and 3-D); the new paths
against onnxruntime's Conv and float64 finite differences; torchvision CNNs trained with every path on and off."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import check_grad
from kernel_harness import ort_run, spy

from edgetrain.core import fastpaths
from edgetrain.core.kernels import conv as conv_kernels
from edgetrain.core.kernels import depthwise, nn_grad, window
from edgetrain.core.kernels import pool as pool_kernels

PATHS = (
    conv_kernels.CONV1X1,
    conv_kernels.CONV1X1_BATCHED,
    conv_kernels.STRIDED_FLAT,
    conv_kernels.GI_AS_CONV,
    conv_kernels.DEPTHWISE,
    depthwise.DENSE,
    nn_grad.MAXPOOL_GRAD_GRID,
)
# 1e-6 of the result's largest magnitude: the paths sum the same products in another order (other GEMM shapes)
RTOL = 1e-6

# name -> (X shape, W shape, attributes, the new paths it must take: "batched", "phases", "dense")
CASES = {
    "1x1_few_positions": ((3, 40, 3, 5), (24, 40, 1, 1), {}, {"batched"}),
    "1x1_batch1": ((1, 16, 2, 2), (8, 16, 1, 1), {}, {"batched"}),
    "1x1_one_position": ((4, 12, 1, 1), (20, 12, 1, 1), {}, set()),
    "1x1_many_positions": ((2, 6, 9, 11), (5, 6, 1, 1), {}, set()),
    "1x1_stride2_odd": ((2, 8, 5, 7), (6, 8, 1, 1), {"strides": [2, 2]}, {"batched"}),
    "1x1_group2": ((2, 8, 3, 3), (6, 4, 1, 1), {"group": 2}, set()),
    "1x1_1d": ((3, 5, 4), (7, 5, 1), {}, {"batched"}),
    "1x1_3d": ((2, 6, 2, 3, 2), (4, 6, 1, 1, 1), {}, {"batched"}),
    "stem_7x7_s2": ((2, 3, 19, 17), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, {"phases"}),
    "stem_batch1": ((1, 3, 16, 16), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"phases"}),
    "strides23_asym_pads": (
        (2, 4, 17, 19),
        (6, 4, 3, 2),
        {"strides": [2, 3], "pads": [1, 0, 2, 1]},
        {"phases"},
    ),
    "strided_dilated_group2": (
        (2, 4, 23, 21),
        (6, 2, 3, 3),
        {"strides": [3, 2], "dilations": [2, 1], "pads": [2, 1, 0, 1], "group": 2},
        {"phases"},
    ),
    "strided_1d": ((2, 3, 29), (5, 3, 5), {"strides": [2], "pads": [2, 2]}, {"phases"}),
    "strided_3d": (
        (1, 3, 9, 10, 11),
        (4, 3, 2, 3, 2),
        {"strides": [2, 2, 3], "pads": [1, 0, 1, 1, 1, 0]},
        {"phases"},
    ),
    "stride_gt_kernel": ((2, 2, 11, 10), (3, 2, 2, 2), {"strides": [3, 3], "pads": [1, 0, 0, 1]}, {"phases"}),
    "same_upper_strided": (
        (2, 2, 13, 12),
        (3, 2, 3, 3),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        set(),
    ),
    "depthwise_s2": (
        (2, 6, 9, 9),
        (6, 1, 3, 3),
        {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]},
        set(),
    ),
    "depthwise_mult2": ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, set()),
    "depthwise_few_positions": ((2, 12, 4, 4), (12, 1, 5, 5), {"group": 12, "pads": [2, 2, 2, 2]}, {"dense"}),
    "depthwise_dense_odd": (
        (1, 6, 5, 4),
        (6, 1, 3, 3),
        {"group": 6, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 2, 0, 1]},
        {"dense"},
    ),
    "depthwise_8x8_5x5": ((2, 4, 8, 8), (4, 1, 5, 5), {"group": 4, "pads": [2, 2, 2, 2]}, {"dense"}),
    "depthwise_3d": ((1, 3, 3, 2, 3), (3, 1, 2, 2, 2), {"group": 3, "pads": [1, 0, 1, 1, 1, 0]}, {"dense"}),
    "depthwise_1d_batch1": ((1, 5, 6), (5, 1, 3), {"group": 5, "pads": [1, 1]}, {"dense"}),
    "3x3_same_s1": ((2, 5, 8, 7), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}, set()),
    "3x3_same_s1_batch1": ((1, 4, 6, 6), (3, 4, 3, 3), {"pads": [1, 1, 1, 1]}, set()),
}


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _explicit(attrs: dict, x_shape, k) -> dict:
    """The gradient kernels take explicit pads: auto_pad resolved as the Conv rule does."""
    if "auto_pad" not in attrs:
        return {a: v for a, v in attrs.items()}
    _, p = window.conv_output_shape(x_shape[2:], k, auto_pad=attrs["auto_pad"], strides=attrs.get("strides"))
    return {**{a: v for a, v in attrs.items() if a != "auto_pad"}, "pads": list(p)}


def _all_three(x, w, b, dy, attrs):
    """Conv (with bias), ConvGradInput and ConvGradWeight (with dB) at these inputs."""
    k = list(w.shape[2:])
    geo = _explicit(attrs, x.shape, k)
    y = conv_kernels.conv(x, w, b, **attrs)
    dx = nn_grad.conv_grad_input(dy, w, output_shape=list(x.shape[2:]), **geo)
    dw, db = nn_grad.conv_grad_weight(dy, x, kernel_shape=k, noutputs=2, **geo)
    return y, dx, dw, db


def _eager(monkeypatch):
    """Thresholds at their lowest, so that the small shapes here take the paths that large layers take."""
    monkeypatch.setattr(conv_kernels, "PHASE_MIN_POSITIONS", 1)
    monkeypatch.setattr(conv_kernels, "FLAT_MAX_WASTE", 100.0)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("case", list(CASES))
def test_fast_paths_equal_plain(monkeypatch, case):
    """Each kernel with every path on against every path off (and against each path off alone): within 1e-6 of
    the result's scale; the new paths the case is there for are taken."""
    _eager(monkeypatch)
    xs, ws, attrs, expect = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    x, w, b = _rand(rng, xs), _rand(rng, ws), _rand(rng, ws[:1])
    y = conv_kernels.conv(x, w, b, **attrs)
    dy = _rand(rng, y.shape)
    calls = {
        "phases": (spy(monkeypatch, conv_kernels, "PhaseColumns"), spy(monkeypatch, nn_grad, "PhaseColumns")),
        "batched": (
            spy(monkeypatch, conv_kernels, "batch_columns"),
            spy(monkeypatch, nn_grad, "batch_columns"),
        ),
        "dense": (
            spy(monkeypatch, depthwise, "_dense_weights"),
            spy(monkeypatch, depthwise, "_grad_weight_dense"),
        ),
    }
    fast = _all_three(x, w, b, dy, attrs)
    for path in expect:
        assert all(calls[path]) if path == "dense" else any(calls[path]), f"{case}: {path} not taken"
    with fastpaths.plain(*PATHS):
        plain = _all_three(x, w, b, dy, attrs)
    for name, f, p in zip(("Y", "dX", "dW", "dB"), fast, plain):
        assert f.shape == p.shape and f.dtype == p.dtype, (name, f.shape, p.shape)
        assert _rel(f, p) <= RTOL, f"{case}: {name} differs from the plain path by {_rel(f, p):.2e}"
    for path in PATHS:
        with fastpaths.plain(path):
            one_off = _all_three(x, w, b, dy, attrs)
        for name, f, p in zip(("Y", "dX", "dW", "dB"), one_off, plain):
            assert _rel(f, p) <= RTOL, f"{case}: {name} with {path} off differs by {_rel(f, p):.2e}"


def test_plain_env_turns_paths_off(monkeypatch):
    """EDGETRAIN_PLAIN names the paths off for a whole process, as fastpaths.plain() does for a block."""
    _eager(monkeypatch)
    xs, ws, attrs, _ = CASES["stem_7x7_s2"]
    rng = np.random.default_rng(1)
    x, w = _rand(rng, xs), _rand(rng, ws)
    calls = spy(monkeypatch, conv_kernels, "PhaseColumns")
    monkeypatch.setenv("EDGETRAIN_PLAIN", conv_kernels.STRIDED_FLAT)
    conv_kernels.conv(x, w, **attrs)
    assert not calls
    monkeypatch.delenv("EDGETRAIN_PLAIN")
    conv_kernels.conv(x, w, **attrs)
    assert calls


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if v[3]])
def test_new_paths_vs_onnxruntime(monkeypatch, case):
    """The forward through the new paths against onnxruntime's Conv."""
    _eager(monkeypatch)
    xs, ws, attrs, _ = CASES[case]
    rng = np.random.default_rng(len(case))
    x, w, b = _rand(rng, xs), _rand(rng, ws), _rand(rng, ws[:1])
    expected = ort_run("Conv", [x, w, b], attrs)[0]
    got = conv_kernels.conv(x, w, b, **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(expected))))


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if v[3]])
def test_new_paths_gradients_vs_finite_differences(monkeypatch, case):
    """dX, dW and dB through the new paths against float64 finite differences, and the emitted backward run by
    onnxruntime (the private gradient ops' function bodies) against edgetrain's kernels."""
    _eager(monkeypatch)
    xs, ws, attrs, expect = CASES[case]
    phases = spy(monkeypatch, conv_kernels, "PhaseColumns"), spy(monkeypatch, nn_grad, "PhaseColumns")
    batched = spy(monkeypatch, conv_kernels, "batch_columns"), spy(monkeypatch, nn_grad, "batch_columns")
    dense = spy(monkeypatch, depthwise, "_dense_weights"), spy(monkeypatch, depthwise, "_grad_weight_dense")
    rng = np.random.default_rng(3 + len(case))
    check_grad("Conv", [rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[:1])], attrs)
    taken = {"phases": phases, "batched": batched, "dense": dense}
    for path in expect:
        assert all(taken[path]) if path == "dense" else any(taken[path]), f"{case}: {path} not taken"


def test_one_position_pointwise_takes_no_transposes(monkeypatch):
    """A 1x1 conv over 1x1 images (squeeze-and-excitation) multiplies [N, C] by W^T directly: no batch copies."""
    calls = spy(monkeypatch, conv_kernels, "batch_columns"), spy(monkeypatch, nn_grad, "batch_columns")
    rng = np.random.default_rng(5)
    x, w, dy = _rand(rng, (8, 96, 1, 1)), _rand(rng, (4, 96, 1, 1)), _rand(rng, (8, 4, 1, 1))
    y = conv_kernels.conv(x, w)
    dx = nn_grad.conv_grad_input(dy, w, output_shape=[1, 1])
    dw = nn_grad.conv_grad_weight(dy, x, kernel_shape=[1, 1])
    assert not any(calls)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    np.testing.assert_allclose(
        y, np.einsum("nc,mc->nm", x64[:, :, 0, 0], w64[:, :, 0, 0])[..., None, None], 1e-5
    )
    np.testing.assert_allclose(dx[:, :, 0, 0], dy64[:, :, 0, 0] @ w64[:, :, 0, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw[:, :, 0, 0], dy64[:, :, 0, 0].T @ x64[:, :, 0, 0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- real models: every path on against every one off

CNNS = ("mobilenet_v2", "mobilenet_v3_small", "resnet18", "efficientnet_b0")


def _train(path, x, y, steps: int):
    import edgetrain as et

    sess = et.TrainingSession(path)
    losses = [sess.train_step(x, y) for _ in range(steps)]
    return losses, sess.parameters()


@pytest.mark.slow
@pytest.mark.parametrize("model", CNNS)
def test_torchvision_cnn_trains_alike_with_paths_off(tmp_path_factory, model):
    """The benchmark's torchvision CNNs (3x64x64, TorchScript export with BatchNorm folded, SGD with momentum and
    weight decay, batch 4): three training steps with every convolution path on and with every one off give the
    same losses and parameters (1e-6 of the loss; 1e-5 of each parameter's scale after three steps, which
    amplify the first step's rounding differences)."""
    exports = pytest.importorskip("exports", reason="the exports need torch")
    exports.declare_torchvision_ops()  # before torchvision's first import (see tests/harness/exports.py)
    pytest.importorskip("torchvision", reason="torchvision is optional: pip install torchvision==0.28.0")

    import edgetrain as et

    ex = exports.export(model, tmp_path_factory.mktemp("exports"), mode="eval", batch=4)
    art = et.convert(
        str(ex.path),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        batch_size=4,
    )
    path = tmp_path_factory.mktemp("art") / f"{model}.etrain"
    art.save(path)
    rng = np.random.default_rng(0)
    x, y = _rand(rng, (4, 3, 64, 64)), rng.integers(0, 10, 4).astype(np.int64)
    fast_losses, fast = _train(path, x, y, 3)
    with fastpaths.plain(*PATHS):
        plain_losses, plain = _train(path, x, y, 3)
    np.testing.assert_allclose(fast_losses, plain_losses, rtol=1e-6)
    for name, p in plain.items():
        assert _rel(fast[name], p) <= 1e-5, f"{model}: {name} differs by {_rel(fast[name], p):.2e}"


# ---------------------------------------------------------------- MaxPoolGrad on the phase grid

POOLS = {
    "resnet_3x3_s2": ((2, 5, 12, 12), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "odd_ceil": ((2, 3, 13, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "asym_pads_strides": ((1, 4, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    "dilated": ((2, 2, 11, 9), {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1]}),
    "3d": ((1, 2, 6, 7, 5), {"kernel_shape": [3, 3, 2], "strides": [2, 2, 1], "pads": [1, 1, 0, 1, 0, 1]}),
    "wide_few_pixels": ((3, 40, 4, 4), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", list(POOLS))
def test_max_pool_grad_grid_equals_plain_bitwise(monkeypatch, case, ties):
    """maxpool_grad_grid runs the plain loop's operations in its order on the phase grid: the same bits, ties (the
    first maximum in window order wins) and padding (never a maximum) included."""
    calls = spy(monkeypatch, nn_grad, "_max_pool_grad_grid")
    xs, attrs = POOLS[case]
    rng = np.random.default_rng(len(case))
    x = rng.integers(-3, 3, xs).astype(np.float32) if ties else _rand(rng, xs)
    y = pool_kernels.max_pool(x, **attrs)
    dy = _rand(rng, y.shape)
    got = nn_grad.max_pool_grad(dy, x, y, **attrs)
    assert calls
    with fastpaths.plain(nn_grad.MAXPOOL_GRAD_GRID):
        expected = nn_grad.max_pool_grad(dy, x, y, **attrs)
    assert len(calls) == 1
    np.testing.assert_array_equal(got, expected)
    assert np.isclose(got.sum(), dy.sum(), rtol=1e-5)  # each dY lands on exactly one element


@pytest.mark.parametrize("case", ["resnet_3x3_s2", "odd_ceil", "3d"])
def test_max_pool_grad_grid_vs_finite_differences(monkeypatch, case):
    """MaxPool's gradient through the grid path against float64 finite differences (distinct values: no ties,
    away from kinks) and the emitted backward in onnxruntime."""
    calls = spy(monkeypatch, nn_grad, "_max_pool_grad_grid")
    xs, attrs = POOLS[case]
    n = int(np.prod(xs))
    x = (np.random.default_rng(2).permutation(n).reshape(xs) - n / 2) * 0.01
    check_grad("MaxPool", [x], attrs)
    assert calls


# ---------------------------------------------------------------- switches read when a step is compiled


def _stem_model():
    """X [2, 3, 16, 16] -> Conv 8x3x3x3 stride 2 (its columns from the stride phases) -> Relu -> global pool -> Gemm."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(_rand(rng, (8, 3, 3, 3)) * 0.3, "w"),
        numpy_helper.from_array(_rand(rng, (8,)) * 0.1, "b"),
        numpy_helper.from_array(_rand(rng, (10, 8)) * 0.3, "fc_w"),
        numpy_helper.from_array(_rand(rng, (10,)) * 0.1, "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compiled_step_reads_switches_when_compiled(monkeypatch):
    """A training step reads the paths' switches when it is compiled (the interpreter's lean hook): compiled with
    conv_strided_flat off, it keeps it off when run outside the block, and compiled with it on, keeps it on inside
    one; both train alike."""
    import edgetrain as et

    art = et.convert(_stem_model(), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1, momentum=0.9))
    rng = np.random.default_rng(1)
    x, y = _rand(rng, (2, 3, 16, 16)), np.array([1, 7], np.int64)
    calls = spy(monkeypatch, conv_kernels, "PhaseColumns")
    with fastpaths.plain(conv_kernels.STRIDED_FLAT):
        off = et.TrainingSession(art)
    on_ = et.TrainingSession(art)
    assert off._step_program._compiled is not None
    off.train_step(x, y)
    forward_off = len(calls)
    with fastpaths.plain(conv_kernels.STRIDED_FLAT):
        on_.train_step(x, y)
    # the step compiled with the path on took it in its forward (the lean Conv) even inside plain()
    assert len(calls) > forward_off
    for a, b in zip(off.parameters().values(), on_.parameters().values()):
        assert _rel(a, b) <= 1e-6
