"""Gradient rules of convolution and pooling (Conv, ConvTranspose, Max/Average/Global pools, LRN) against float64
finite differences and onnxruntime running the emitted backward; the fused kernels against their bodies."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import build, check_grad
from kernel_harness import spy

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.kernels import conv as conv_kernels
from edgetrain.core.kernels import nn_grad
from edgetrain.core.kernels import pool as pool_kernels
from edgetrain.derive.autodiff import GradContext, ShapedBuilder, inline_private
from edgetrain.derive.autodiff.registry import RULES


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _distinct(seed, *shape):
    """Values 0.01 apart in random order: no ties (max pools) and far from any kink, in float32 too."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n).reshape(shape) - n / 2) * 0.01


_check = check_grad


# ---------------------------------------------------------------- Conv

CONV_CASES = {
    "2d_pads_asym_strides": ((2, 3, 7, 6), (4, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    "2d_dilations_group2": ((2, 4, 7, 6), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "strides": [1, 2]}),
    "depthwise_mult2": ((2, 3, 6, 6), (6, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    "depthwise_stride2": ((1, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [0, 1, 1, 0]}),
    # many channels over a few pixels: the depthwise kernels' channels-last layout (a row per position)
    "depthwise_wide": ((2, 40, 3, 3), (40, 1, 3, 3), {"group": 40, "pads": [1, 1, 1, 1]}),
    "depthwise_wide_mult2_s2": (
        (1, 20, 4, 4),
        (40, 1, 3, 3),
        {"group": 20, "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "same_upper_dil": (
        (2, 2, 7, 6),
        (3, 2, 3, 3),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2], "dilations": [1, 2]},
    ),
    "same_upper": ((2, 2, 7, 6), (3, 2, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower": ((2, 2, 7, 8), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "valid_remainder": ((2, 2, 8, 7), (3, 2, 3, 2), {"auto_pad": "VALID", "strides": [2, 3]}),
    "stride_gt_kernel": ((1, 2, 9, 8), (2, 2, 2, 2), {"strides": [3, 3], "pads": [1, 0, 0, 1]}),
    "pointwise_group": ((2, 4, 5, 5), (6, 2, 1, 1), {"group": 2}),
    "pointwise_stride2": ((2, 4, 5, 5), (3, 4, 1, 1), {"strides": [2, 2]}),
    "1d": ((2, 3, 9), (4, 3, 3), {"pads": [2, 1], "strides": [2], "dilations": [2]}),
    "3d": ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 0], "strides": [1, 2, 1]}),
    "3d_group": (
        (2, 4, 3, 4, 3),
        (2, 2, 2, 2, 2),
        {"group": 2, "dilations": [1, 2, 1], "pads": [0, 1, 0, 1, 0, 1]},
    ),
}


# cases whose forward onnxruntime refuses (checked against finite differences alone), with the reason
NO_ORT = {
    "same_upper_dil": "onnxruntime's Conv rejects dilations with auto_pad SAME_*",
    "output_shape_extend": "onnxruntime's ConvTranspose rejects an output_shape past the full result",
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case):
    xs, ws, attrs = CONV_CASES[case]
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs, ort=case not in NO_ORT)


@pytest.mark.parametrize("wrt", [[0], [1], [2], [0, 2], [1, 2]])
def test_conv_partial(wrt):
    """Only the wanted gradients are built: dX alone (frozen weights), dW without dB, dB alone."""
    xs, ws, attrs = CONV_CASES["2d_dilations_group2"]
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs, wrt=wrt)


def test_conv_builds_no_input_grad_for_data():
    graph, _, _ = build("Conv", [_rand(1, 2, 3, 5, 5), _rand(2, 4, 3, 3, 3)], {}, [1], 1, 0, np.float32)
    ops = [n.op_type for n in graph.nodes]
    assert "ConvGradInput" not in ops and ops.count("ConvGradWeight") == 1


# ---------------------------------------------------------------- ConvTranspose

CONV_T_CASES = {
    "strides_pads_outpad_group": (
        (2, 4, 4, 3),
        (4, 3, 3, 2),
        {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
    ),
    "dilations": ((2, 2, 3, 4), (2, 3, 2, 3), {"dilations": [2, 1], "strides": [1, 2], "pads": [0, 1, 1, 0]}),
    "outpad_past_kernel": ((1, 2, 3, 3), (2, 2, 2, 2), {"strides": [3, 3], "output_padding": [2, 1]}),
    "output_shape": ((2, 2, 3, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [6, 8]}),
    "output_shape_extend": ((1, 2, 3, 3), (2, 2, 2, 2), {"strides": [2, 2], "output_shape": [8, 7]}),
    "outpad_dilations": (
        (1, 2, 3, 3),
        (2, 2, 2, 2),
        {"strides": [2, 2], "dilations": [2, 2], "output_padding": [1, 1]},
    ),
    "same_upper": ((2, 2, 3, 4), (2, 2, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    "same_lower": ((2, 2, 3, 4), (2, 2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "1d": ((2, 3, 5), (3, 2, 3), {"strides": [2], "pads": [1, 0]}),
    "3d_group": (
        (1, 4, 2, 3, 2),
        (4, 1, 2, 2, 2),
        {"group": 2, "strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]},
    ),
}


@pytest.mark.parametrize("case", CONV_T_CASES)
def test_conv_transpose(case):
    xs, ws, attrs = CONV_T_CASES[case]
    m = ws[1] * attrs.get("group", 1)
    _check("ConvTranspose", [_rand(1, *xs), _rand(2, *ws), _rand(3, m)], attrs, ort=case not in NO_ORT)


def test_conv_transpose_partial():
    xs, ws, attrs = CONV_T_CASES["strides_pads_outpad_group"]
    for wrt in ([0], [1], [2]):
        _check("ConvTranspose", [_rand(1, *xs), _rand(2, *ws), _rand(3, 6)], attrs, wrt=wrt)


# ---------------------------------------------------------------- MaxPool, AveragePool

POOL_CASES = {
    "2x2_s2": ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "3x3_s1_pads_overlap": ((2, 2, 5, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "asym_pads_strides": ((2, 3, 7, 6), {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 1]}),
    "ceil_mode_pads": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [1, 1, 1, 0], "ceil_mode": 1},
    ),
    "dilations": ((1, 2, 7, 6), {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [1, 2]}),
    "same_upper": ((2, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((2, 2, 5, 7), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "1d": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2, 4, 5, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
}


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool(case):
    xs, attrs = POOL_CASES[case]
    _check("MaxPool", [_distinct(4, *xs)], attrs)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_with_indices_output(storage_order):
    xs, attrs = POOL_CASES["asym_pads_strides"]
    _check("MaxPool", [_distinct(5, *xs)], {**attrs, "storage_order": storage_order}, n_outputs=2)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(case, count_include_pad):
    xs, attrs = POOL_CASES[case]
    ort = "dilations" not in attrs  # AveragePool has dilations from opset 19 (the harness emits opset 18)
    _check("AveragePool", [_rand(6, *xs)], {**attrs, "count_include_pad": count_include_pad}, ort=ort)


# ---------------------------------------------------------------- global pools, LRN


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (1, 2, 3, 2, 3)])
def test_global_average_pool(shape):
    _check("GlobalAveragePool", [_rand(7, *shape)])


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (1, 2, 3, 2, 3)])
def test_global_max_pool(shape):
    _check("GlobalMaxPool", [_distinct(8, *shape)])


@pytest.mark.parametrize(
    "attrs",
    [
        {"size": 3, "alpha": 0.5, "beta": 0.75, "bias": 1.5},
        {"size": 2, "alpha": 0.3, "beta": 0.6, "bias": 1.0},  # even size: window [c, c + 1]
        {"size": 1, "alpha": 0.2, "beta": 1.2, "bias": 2.0},
        {"size": 7},  # wider than the 5 channels; default alpha, beta, bias
    ],
)
def test_lrn(attrs):
    # onnxruntime's LRN takes odd sizes only
    _check("LRN", [_rand(9, 2, 5, 3, 2)], attrs, ort=attrs["size"] % 2 == 1)


def test_lrn_3d_input():
    """onnxruntime's LRN takes 4-D inputs only: finite differences alone for a 3-D one."""
    _check("LRN", [_rand(10, 2, 5, 4)], {"size": 3, "alpha": 0.5}, ort=False)


# ---------------------------------------------------------------- fused kernels vs their bodies, in edgetrain


def _fused_vs_body(op, inputs, attrs, wrt):
    graph, _, feeds = build(op, inputs, attrs, wrt, 1, 0, np.float64)
    assert any(n.domain for n in graph.nodes), "no fused op emitted"
    fused = Interpreter(graph, preallocate=False).run(feeds)
    inlined = Interpreter(inline_private(graph), preallocate=False).run(feeds)
    for a, b in zip(fused, inlined):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "case", ["2d_dilations_group2", "depthwise_stride2", "valid_remainder", "pointwise_group", "3d_group"]
)
def test_conv_grad_bodies(case):
    xs, ws, attrs = CONV_CASES[case]
    _fused_vs_body("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs, [0, 1, 2])


@pytest.mark.parametrize("case", ["ceil_mode_pads", "dilations", "same_lower", "3d"])
def test_pool_grad_bodies(case):
    xs, attrs = POOL_CASES[case]
    _fused_vs_body("MaxPool", [_distinct(4, *xs)], attrs, [0])
    _fused_vs_body("AveragePool", [_rand(4, *xs)], {**attrs, "count_include_pad": 1}, [0])


def test_conv_grads_chunked(monkeypatch):
    """Columns built a batch chunk at a time (memory budget) give the same dX, dW and dB."""
    dy, x, w = _rand(1, 5, 4, 3, 3), _rand(2, 5, 6, 7, 7), _rand(3, 4, 3, 3, 3)
    attrs = {"group": 2, "strides": [2, 2], "pads": [0, 0, 1, 1]}
    whole = nn_grad.conv_grad_weight(dy, x, kernel_shape=[3, 3], noutputs=2, **attrs)
    whole_dx = nn_grad.conv_grad_input(dy, w, output_shape=[7, 7], **attrs)
    monkeypatch.setattr(nn_grad, "IM2COL_BUDGET", 2 * 6 * 9 * 9 * 8)  # two batch rows per chunk
    monkeypatch.setattr(conv_kernels, "CACHE_BUDGET", 1)  # dW's batch-last columns: one output row at a time
    monkeypatch.setattr(conv_kernels, "GEMM_MIN_COLUMNS", 1)
    for a, b in zip(whole, nn_grad.conv_grad_weight(dy, x, kernel_shape=[3, 3], noutputs=2, **attrs)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        nn_grad.conv_grad_input(dy, w, output_shape=[7, 7], **attrs), whole_dx, rtol=1e-12
    )


FLAT_CASES = {
    "2d_pads": ((2, 3, 7, 6), (4, 3, 3, 2), {"pads": [1, 0, 2, 1]}),
    "2d_one_channel": ((3, 1, 6, 7), (4, 1, 3, 3), {"pads": [2, 2, 2, 2]}),
    "2d_dilations_group2": (
        (2, 4, 7, 6),
        (6, 2, 3, 3),
        {"group": 2, "dilations": [2, 1], "pads": [1, 1, 0, 2]},
    ),
    "1d": ((2, 3, 9), (4, 3, 3), {"pads": [2, 1], "dilations": [2]}),
    "3d": ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 0]}),
}


@pytest.mark.parametrize("case", list(FLAT_CASES))
def test_conv_flattened_rows(monkeypatch, case):
    """Stride-1 Conv and its dW through the flattened-rows columns (conv._flat_conv, nn_grad._weight_grad_flat),
    one image per chunk, against finite differences and onnxruntime."""
    monkeypatch.setattr(conv_kernels, "FLAT_MIN_POSITIONS", 1)
    monkeypatch.setattr(conv_kernels, "FLAT_MAX_WASTE", 100.0)
    monkeypatch.setattr(conv_kernels, "CACHE_BUDGET", 1)
    monkeypatch.setattr(nn_grad, "CACHE_BUDGET", 1)
    calls = spy(monkeypatch, nn_grad, "_weight_grad_flat")
    xs, ws, attrs = FLAT_CASES[case]
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs)
    assert calls


def test_conv_weight_grad_lenet_first_layer_takes_flattened_rows(monkeypatch):
    """LeNet's first layer (one input channel, 28x28, pads 2) at the default thresholds: dW and dB through the
    flattened rows, equal to the batch-last columns' in float64."""
    calls = spy(monkeypatch, nn_grad, "_weight_grad_flat")
    dy, x = _rand(1, 3, 6, 28, 28), _rand(2, 3, 1, 28, 28)
    dw, db = nn_grad.conv_grad_weight(dy, x, kernel_shape=[5, 5], pads=[2] * 4, noutputs=2)
    assert calls
    geo = ((5, 5), (28, 28), (2, 2, 2, 2), (1, 1), (1, 1), (32, 32))
    ref_w, ref_b = nn_grad._weight_grad_columns(dy, x, 1, *geo, True)
    np.testing.assert_allclose(dw, ref_w.reshape(dw.shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, ref_b, rtol=1e-12, atol=1e-12)


GI_AS_CONV_CASES = {
    "2d_same": ((3, 3, 6, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_group2_dil_asym": (
        (3, 4, 7, 6),
        (6, 2, 3, 2),
        {"group": 2, "dilations": [2, 1], "pads": [2, 0, 2, 1]},
    ),
    "1d": ((4, 3, 9), (2, 3, 5), {"pads": [2, 2]}),
    "3d": ((2, 2, 4, 5, 4), (3, 2, 3, 1, 3), {"pads": [1, 0, 1, 1, 0, 1]}),
}


@pytest.mark.parametrize("case", list(GI_AS_CONV_CASES))
def test_conv_grad_input_as_convolution(monkeypatch, case):
    """Stride-1 convs with same-size pads: dX as the convolution of dY with the flipped, transposed kernel."""
    calls = spy(monkeypatch, nn_grad, "im2col_conv")
    xs, ws, attrs = GI_AS_CONV_CASES[case]
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs, wrt=[0])
    assert calls


@pytest.mark.parametrize("group", [1, 2])
def test_pointwise_weight_grad_over_few_positions(monkeypatch, group):
    """1x1 convs with many channels over a few positions (MobileNetV2's last layers): dW as one GEMM over the
    batch-last copies rather than per-image products summed."""
    calls = spy(monkeypatch, nn_grad, "_weight_grad_columns")
    xs, ws = ((3, 32, 1, 2), (48, 32, 1, 1)) if group == 1 else ((3, 64, 1, 1), (96, 32, 1, 1))
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], {"group": group}, wrt=[1, 2])
    assert calls


@pytest.mark.parametrize("positions_max", [0, 16])
@pytest.mark.parametrize("case", ["depthwise_wide", "depthwise_wide_mult2_s2", "5x5_2x2", "one_channel"])
def test_depthwise_few_positions_both_paths(monkeypatch, positions_max, case):
    """Depthwise dX and dW over a few output positions: on those positions (dead offsets skipped) and, with that
    path off, on the phase grid."""
    from edgetrain.core.kernels import depthwise

    monkeypatch.setattr(depthwise, "POSITIONS_MAX", positions_max)
    calls = []
    for name in ("_grad_input_positions", "_grad_weight_positions"):
        fn = getattr(depthwise, name)
        monkeypatch.setattr(depthwise, name, lambda *a, fn=fn: calls.append(fn.__name__) or fn(*a))
    extra = {
        "5x5_2x2": ((2, 12, 2, 2), (12, 1, 5, 5), {"group": 12, "pads": [2, 2, 2, 2]}),
        "one_channel": ((2, 1, 3, 4), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    }
    xs, ws, attrs = extra.get(case) or CONV_CASES[case]
    _check("Conv", [_rand(1, *xs), _rand(2, *ws), _rand(3, ws[0])], attrs)
    expected = {"_grad_input_positions", "_grad_weight_positions"}
    assert set(calls) == (expected if positions_max else set())


def test_max_pool_grad_ties_go_to_the_first_maximum():
    """With ties, dY goes where onnxruntime's Indices point (edgetrain's MaxPool Indices, tested against it)."""
    x = np.random.default_rng(11).integers(0, 3, (2, 3, 6, 5)).astype(np.float32)
    attrs = {"kernel_shape": [3, 2], "pads": [1, 1, 1, 0], "strides": [1, 2]}
    y, idx = pool_kernels.max_pool(x, **attrs, noutputs=2)
    dy = _rand(12, *y.shape).astype(np.float32)
    expected = np.bincount(idx.ravel(), weights=dy.ravel(), minlength=x.size).reshape(x.shape)
    for yy in (y, None):  # the forward's Y, or recomputed
        got = nn_grad.max_pool_grad(dy, x, yy, **attrs)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_float16_kernels_keep_dtype():
    x, dy = _rand(1, 2, 3, 6, 6).astype(np.float16), _rand(2, 2, 4, 4, 4).astype(np.float16)
    dw, db = nn_grad.conv_grad_weight(dy, x, kernel_shape=[3, 3], noutputs=2)
    ref = nn_grad.conv_grad_weight(dy.astype(np.float64), x.astype(np.float64), kernel_shape=[3, 3])
    assert dw.dtype == db.dtype == np.float16
    np.testing.assert_allclose(dw, ref, rtol=2e-2, atol=5e-2)
    pw = nn_grad.conv_grad_weight(dy[:, :, :3, :3], x[:, :, :3, :3], kernel_shape=[1, 1], noutputs=2)
    assert pw[0].dtype == pw[1].dtype == np.float16
    w = _rand(3, 4, 3, 3, 3)
    dx = nn_grad.conv_grad_input(dy, w.astype(np.float16), output_shape=[6, 6])
    assert dx.dtype == np.float16
    np.testing.assert_allclose(
        dx, nn_grad.conv_grad_input(dy.astype(np.float64), w, output_shape=[6, 6]), atol=5e-2
    )
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    dy2 = dy[:, :3, :3, :3]
    assert nn_grad.max_pool_grad(dy2, x, **pool).dtype == np.float16
    assert nn_grad.average_pool_grad(dy2, output_shape=[6, 6], **pool).dtype == np.float16


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_unsupported_auto_pad_names_the_node(op):
    values = {n: TensorInfo(np.dtype(np.float32), (1, 2, 5, 5)) for n in ("x", "y")}
    values["w"] = TensorInfo(np.dtype(np.float32), (2, 2, 3, 3))
    g = Graph(nodes=[], inputs=["x", "w"], outputs=[], initializers={}, values=values, opset=18)
    ctx = GradContext(ShapedBuilder(g))
    node = Node(op, ("x", "w"), ("y",), {"auto_pad": "SAME_MIDDLE"}, name="bad_conv")
    with pytest.raises(UnsupportedError, match="bad_conv.*auto_pad"):
        RULES[op](ctx, node, ["y"], [True, True])
