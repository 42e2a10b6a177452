"""The quantized kernels (edgetrain/core/kernels/quantized.py, qproducts.py, qcontrib.py) against onnxruntime, one
node at a time: integer outputs to the bit, float outputs to 1 ulp; random inputs and the edges (saturation,
rounding ties, zero points at the ends of the range, per-channel axes, int8 and uint8). Bad scales and zero points
are refused at import."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import edgetrain as et
from edgetrain.core.errors import ModelError, UnsupportedError
from edgetrain.core.kernels import KERNELS

MS = "com.microsoft"
INT8 = (np.int8, np.uint8)


def _model(op, inputs, attrs=None, *, domain="", opset=21, n_outputs=1, const=()):
    """A one-node model; inputs at positions in const are initializers, the others graph inputs."""
    names, vis, inits = [], [], []
    for k, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{k}"
        names.append(name)
        x = np.asarray(x)
        if k in const:
            inits.append(numpy_helper.from_array(x, name))
        else:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    while names and not names[-1]:
        names.pop()
    outs = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "q", vis, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def _run_both(model, inputs, const=()):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    feeds = {f"in{k}": np.asarray(x) for k, x in enumerate(inputs) if x is not None and k not in const}
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = et.InferenceSession(model).run(None, feeds)
    return got, ref


MAX_DIFF: dict[str, float] = {}


def _compare(op, got, ref):
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (op, g.shape, r.shape, g.dtype, r.dtype)
        if r.dtype.kind == "f":
            np.testing.assert_array_max_ulp(g, r, maxulp=1)
            d = float(np.max(np.abs(g.astype(np.float64) - r), initial=0))
        else:
            np.testing.assert_array_equal(g, r, err_msg=op)
            d = float(np.max(np.abs(g.astype(np.int64) - r.astype(np.int64)), initial=0))
        MAX_DIFF[op] = max(MAX_DIFF.get(op, 0.0), d)


def check(op, inputs, attrs=None, *, domain="", opset=21, n_outputs=1, const=()):
    model = _model(op, inputs, attrs, domain=domain, opset=opset, n_outputs=n_outputs, const=const)
    got, ref = _run_both(model, inputs, const)
    _compare(op, got, ref)


def _q(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _w(rng, shape, dtype, other):
    """A product's second operand. onnxruntime on x86 without VNNI multiplies uint8 by int8 with vpmaddubsw,
    which saturates each pair of products to int16 (a result the spec does not define, and edgetrain does not
    copy: it computes the exact sum): when the signedness differs, the values stay in [-64, 63], where no pair
    saturates. test_mixed_sign_products_are_exact checks the full range against exact integer math."""
    if np.dtype(dtype) == np.dtype(other):
        return _q(rng, shape, dtype)
    return rng.integers(0 if dtype == np.uint8 else -64, 64, size=shape).astype(dtype)


def _zp(dtype, where):
    info = np.iinfo(dtype)
    return np.asarray(
        {"low": info.min, "high": info.max, "mid": (info.min + info.max + 1) // 2}[where], dtype
    )


# -------------------------------------------------------------------------------- QDQ


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("where", ["low", "mid", "high"])
def test_quantize_linear_per_tensor(dtype, where):
    rng = np.random.default_rng(0)
    scale = np.float32(0.05)
    # saturation both ways, and exact ties k + 0.5 (x = (k + 0.5) * scale is not exact in float32: use scale 0.5)
    x = np.concatenate([rng.standard_normal(200).astype(np.float32) * 20, np.float32([1e9, -1e9, 0.0, -0.0])])
    check("QuantizeLinear", [x, scale, _zp(dtype, where)], const=(1, 2))
    ties = (np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)) * np.float32(0.5)
    check("QuantizeLinear", [ties, np.float32(0.5), _zp(dtype, where)], const=(1, 2))


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_dequantize_per_channel(dtype, axis):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32) * 4
    n = x.shape[axis]
    scale = (rng.random(n) * 0.1 + 0.01).astype(np.float32)
    zp = _q(rng, (n,), dtype)
    check("QuantizeLinear", [x, scale, zp], {"axis": axis}, const=(1, 2))
    q = _q(rng, x.shape, dtype)
    check("DequantizeLinear", [q, scale, zp], {"axis": axis}, const=(1, 2))
    check("DequantizeLinear", [q, scale, zp], {"axis": axis})  # scales fed at run time


def test_quantize_linear_blocked_and_omitted_zero_point():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32) * 3
    scale = (rng.random((4, 3)) * 0.1 + 0.01).astype(np.float32)
    zp = _q(rng, (4, 3), np.int8)
    check("QuantizeLinear", [x, scale, zp], {"axis": 1, "block_size": 2}, const=(1, 2))
    check(
        "DequantizeLinear", [_q(rng, (4, 6), np.int8), scale, zp], {"axis": 1, "block_size": 2}, const=(1, 2)
    )
    check("QuantizeLinear", [x, np.float32(0.02)], const=(1,))  # no zero point: uint8, zero point 0
    check("QuantizeLinear", [x, np.float32(0.02)], {"output_dtype": onnx.TensorProto.INT8}, const=(1,))


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
def test_qdq_older_opsets(opset):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    check("QuantizeLinear", [x, np.float32(0.01), np.int8(3)], opset=opset, const=(1, 2))
    check(
        "DequantizeLinear",
        [_q(rng, (2, 3), np.uint8), np.float32(0.01), np.uint8(128)],
        opset=opset,
        const=(1, 2),
    )


def test_dequantize_int32_and_float16_scale():
    rng = np.random.default_rng(4)
    check(
        "DequantizeLinear",
        [rng.integers(-(2**20), 2**20, 50).astype(np.int32), np.float32(0.001)],
        const=(1,),
    )
    check("DequantizeLinear", [_q(rng, (3, 4), np.int8), np.float16(0.01), np.int8(-2)], const=(1, 2))


# -------------------------------------------------------------------------------- dynamic


@pytest.mark.parametrize(
    "x",
    [
        np.random.default_rng(5).standard_normal((4, 7)).astype(np.float32),
        np.abs(np.random.default_rng(6).standard_normal((4, 7))).astype(np.float32),  # all >= 0: zero point 0
        -np.abs(np.random.default_rng(7).standard_normal((4, 7))).astype(
            np.float32
        ),  # all <= 0: zero point 255
        np.zeros((3, 3), np.float32),  # an empty range: scale 1
        np.float32([[-1.0, 0.5, 2.5, 254.0 / 2, 255.0 / 2]]),
    ],
    ids=["mixed", "positive", "negative", "zeros", "ties"],
)
def test_dynamic_quantize_linear(x):
    check("DynamicQuantizeLinear", [x], opset=21, n_outputs=3)


@pytest.mark.parametrize("ta", INT8)
@pytest.mark.parametrize("tb", INT8)
def test_matmul_integer(ta, tb):
    rng = np.random.default_rng(8)
    a, b = _q(rng, (2, 5, 33), ta), _w(rng, (33, 7), tb, ta)
    check("MatMulInteger", [a, b, _zp(ta, "high"), _zp(tb, "low")], const=(3,))
    check("MatMulInteger", [a, b])
    check("MatMulInteger", [a, b, _zp(ta, "mid"), _q(rng, (7,), tb)], const=(2, 3))  # per-column zero points


@pytest.mark.parametrize("tw", INT8)
def test_conv_integer(tw):
    rng = np.random.default_rng(9)
    x, w = _q(rng, (2, 4, 7, 6), np.uint8), _w(rng, (6, 2, 3, 3), tw, np.uint8)  # onnxruntime: x uint8 only
    attrs = {"pads": [1, 0, 1, 2], "strides": [2, 1], "group": 2}
    check("ConvInteger", [x, w, np.uint8(255), np.asarray(7, tw)], attrs, const=(2, 3))
    check("ConvInteger", [x, w], {"dilations": [2, 1], "group": 2})


# -------------------------------------------------------------------------------- QOperator


@pytest.mark.parametrize("tx", INT8)
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(tx, per_channel):
    rng = np.random.default_rng(10)
    x, w = _q(rng, (2, 4, 8, 8), tx), _w(rng, (6, 4, 3, 3), np.int8, tx)
    ws = (rng.random(6) * 0.01 + 0.001).astype(np.float32) if per_channel else np.float32(0.004)
    b = rng.integers(-5000, 5000, 6).astype(np.int32)
    ins = [
        x,
        np.float32(0.02),
        _zp(tx, "mid"),
        w,
        ws,
        np.zeros(np.shape(ws), np.int8),
        np.float32(0.3),
        _zp(tx, "low"),
        b,
    ]
    check("QLinearConv", ins, {"pads": [1, 1, 1, 1]}, const=tuple(range(1, 9)))
    ins[6] = np.float32(0.01)  # a small output scale: most values saturate
    check("QLinearConv", ins, {"strides": [2, 2]}, const=tuple(range(1, 9)))


@pytest.mark.parametrize("tx", INT8)
def test_qlinear_matmul(tx):
    rng = np.random.default_rng(11)
    a, b = _q(rng, (3, 4, 20), tx), _q(rng, (20, 5), tx)
    check(
        "QLinearMatMul",
        [
            a,
            np.float32(0.05),
            _zp(tx, "mid"),
            b,
            np.float32(0.02),
            _zp(tx, "low"),
            np.float32(0.7),
            _zp(tx, "high"),
        ],
        const=(1, 2, 4, 5, 6, 7),
    )
    bs = (rng.random(5) * 0.05 + 0.01).astype(np.float32)
    check(
        "QLinearMatMul",
        [
            a,
            np.float32(0.05),
            _zp(tx, "mid"),
            b,
            bs,
            np.full(5, _zp(tx, "mid"), tx),
            np.float32(0.9),
            _zp(tx, "mid"),
        ],
        const=(1, 2, 4, 5, 6, 7),
    )


# -------------------------------------------------------------------------------- com.microsoft


@pytest.mark.parametrize("tx", INT8)
@pytest.mark.parametrize("float_out", [False, True])
@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
def test_qgemm(tx, float_out, trans):
    rng = np.random.default_rng(12)
    a = _q(rng, (5, 9) if not trans[0] else (9, 5), tx)
    b = _w(rng, (9, 4) if not trans[1] else (4, 9), np.int8, tx)
    c = rng.integers(-3000, 3000, 4).astype(np.int32)
    ins = [
        a,
        np.float32(0.03),
        _zp(tx, "mid"),
        b,
        (rng.random(4) * 0.02 + 0.005).astype(np.float32),
        np.zeros(4, np.int8),
        c,
    ]
    if not float_out:
        ins += [np.float32(0.2), _zp(tx, "high")]
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.75}
    check("QGemm", ins, attrs, domain=MS, const=tuple(range(1, len(ins))))


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("tx", INT8)
def test_qlinear_binary(op, tx):
    rng = np.random.default_rng(13)
    a, b = _q(rng, (2, 3, 8), tx), _q(rng, (3, 8), tx)
    for cs in (np.float32(0.05), np.float32(0.005)):
        ins = [a, np.float32(0.03), _zp(tx, "mid"), b, np.float32(0.02), _zp(tx, "low"), cs, _zp(tx, "high")]
        check(op, ins, domain=MS, const=(1, 2, 4, 5, 6, 7))
        check(
            op,
            [
                a,
                np.float32(0.03),
                _zp(tx, "mid"),
                b[0, 0],
                np.float32(0.02),
                _zp(tx, "low"),
                cs,
                _zp(tx, "mid"),
            ],
            domain=MS,
            const=(1, 2, 4, 5, 6, 7),
        )


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
@pytest.mark.parametrize("tx", INT8)
def test_qlinear_lookup_ops(op, attrs, tx):
    x = np.arange(np.iinfo(tx).min, np.iinfo(tx).max + 1).astype(tx).reshape(4, 64)  # every code
    check(
        op,
        [x, np.float32(0.05), _zp(tx, "mid"), np.float32(1 / 256), _zp(tx, "low")],
        attrs,
        domain=MS,
        const=(1, 2, 3, 4),
    )


@pytest.mark.parametrize("tx", INT8)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(tx, channels_last):
    rng = np.random.default_rng(14)
    x = _q(rng, (2, 5, 6, 7), tx)
    check(
        "QLinearGlobalAveragePool",
        [x, np.float32(0.04), _zp(tx, "mid"), np.float32(0.03), _zp(tx, "low")],
        {"channels_last": channels_last},
        domain=MS,
        const=(1, 2, 3, 4),
    )


@pytest.mark.parametrize("tx", INT8)
@pytest.mark.parametrize("axis", [-1, 1])
def test_qlinear_softmax(tx, axis):
    rng = np.random.default_rng(15)
    x = _q(rng, (2, 6, 10), tx)
    zy = np.asarray(-128 if tx == np.int8 else 0, tx)
    check(
        "QLinearSoftmax",
        [x, np.float32(0.08), _zp(tx, "mid"), np.float32(1 / 256), zy],
        {"axis": axis, "opset": 13},
        domain=MS,
        const=(1, 2, 3, 4),
    )


@pytest.mark.parametrize("tx", INT8)
def test_qlinear_concat(tx):
    rng = np.random.default_rng(16)
    a, b = _q(rng, (2, 3, 4), tx), _q(rng, (2, 5, 4), tx)
    ys, yz = np.float32(0.05), _zp(tx, "mid")
    check(
        "QLinearConcat",
        [ys, yz, a, np.float32(0.03), _zp(tx, "low"), b, ys, yz],
        {"axis": 1},
        domain=MS,
        const=(0, 1, 3, 4, 6, 7),
    )


@pytest.mark.parametrize("tb", INT8)
def test_matmul_integer_to_float_and_dynamic_quantize_matmul(tb):
    rng = np.random.default_rng(17)
    a, b = _q(rng, (3, 16), np.uint8), _w(rng, (16, 6), tb, np.uint8)
    bs = (rng.random(6) * 0.02 + 0.001).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    check(
        "MatMulIntegerToFloat",
        [a, b, np.float32(0.01), bs, np.uint8(120), np.zeros(6, tb), bias],
        domain=MS,
        const=(2, 3, 4, 5, 6),
    )
    x = rng.standard_normal((3, 16)).astype(np.float32)
    check("DynamicQuantizeMatMul", [x, b, bs, np.zeros(6, tb), bias], domain=MS, const=(1, 2, 3, 4))


def test_mixed_sign_products_are_exact():
    """uint8 x int8 over the full ranges, where onnxruntime's AVX2 path saturates pairs: the exact sums."""
    from edgetrain.core.kernels.qproducts import conv_integer, matmul_integer, qlinear_matmul

    rng = np.random.default_rng(18)
    a, b = np.full((3, 64), 255, np.uint8), np.full((64, 5), 127, np.int8)
    a[1], b[:, 1] = _q(rng, 64, np.uint8), _q(rng, 64, np.int8)
    exact = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 128)
    np.testing.assert_array_equal(matmul_integer(a, b, np.uint8(3), np.int8(-128)), exact)
    x, w = _q(rng, (1, 3, 5, 5), np.uint8), _q(rng, (2, 3, 3, 3), np.int8)
    win = np.lib.stride_tricks.sliding_window_view(
        x[0].astype(np.int64), (3, 3), axis=(1, 2)
    )  # [c, i, j, 3, 3]
    ref = np.einsum("cijkl,mckl->mij", win, w.astype(np.int64))[None]
    np.testing.assert_array_equal(conv_integer(x, w), ref)
    y = qlinear_matmul(
        a, np.float32(1), np.uint8(3), b, np.float32(1), np.int8(-128), np.float32(2**14), np.uint8(0)
    )
    np.testing.assert_array_equal(
        y, np.clip(np.rint(exact.astype(np.float32) / 2**14), 0, 255).astype(np.uint8)
    )


# -------------------------------------------------------------------------------- refusals


def _dq_model(scale, zp, x_dtype=np.int8, shape=(4, 3), axis=1):
    w = numpy_helper.from_array(np.ones(shape, x_dtype), "w")
    inits = [w, numpy_helper.from_array(np.asarray(scale), "s"), numpy_helper.from_array(np.asarray(zp), "z")]
    node = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], name="dq_w", axis=axis)
    graph = helper.make_graph(
        [node], "g", [], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    "scale,zp,words",
    [
        (np.float32(0.0), np.int8(0), "positive finite"),
        (np.float32(-0.1), np.int8(0), "positive finite"),
        (np.float32(np.nan), np.int8(0), "positive finite"),
        (np.float32(0.1), np.uint8(3), "type"),
        (np.float32(0.1), np.int32(3), "type"),
        (np.float32([0.1, 0.2]), np.int8([0, 0]), "one value per channel"),
        (np.float32([0.1, 0.2, 0.3]), np.int8([0, 0]), "per-channel zero point"),
    ],
)
def test_bad_quantization_parameters_are_refused_at_import(scale, zp, words):
    with pytest.raises(ModelError) as e:
        et.InferenceSession(_dq_model(scale, zp))
    assert "dq_w" in str(e.value) and "DequantizeLinear" in str(e.value) and words in str(e.value)


def test_unsupported_contrib_op_is_refused_naming_what_runs():
    node = helper.make_node("QAttention", ["x"], ["y"], name="att", domain=MS)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    with pytest.raises(UnsupportedError) as e:
        et.InferenceSession(model)
    assert "att" in str(e.value) and "QAttention" in str(e.value) and "QLinearConv" not in str(e.value)
    assert "quantized ops" in str(e.value) and "QDQ" in str(e.value)


def test_every_quantized_op_has_a_kernel_and_says_why_it_has_no_rule():
    from edgetrain.core.ops import OPS, QUANTIZED_OPS

    quantized = [op for op, rec in OPS.items() if rec.quantized or "Integer" in op or "Quantize" in op]
    assert len(quantized) >= 16
    # the model's quantized ops are lowered before gradients; FakeQuantize is what they become
    for op in quantized:
        no_rule = op in QUANTIZED_OPS or op == "FakeQuantizeGrad"
        assert op in KERNELS and bool(OPS[op].no_rule) == no_rule, op


def test_report_max_diffs(report):
    for op in sorted(MAX_DIFF):
        report("quantized kernels: max |edgetrain - onnxruntime| per op", f"{op:26s} {MAX_DIFF[op]:.3g}")
