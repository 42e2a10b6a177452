"""Math kernels vs onnxruntime (or onnx's ReferenceEvaluator where it lacks a dtype) and onnx's node cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from kernel_harness import assert_close, node_cases, ort_run, ref_run

from edgetrain.core.errors import ModelError, ShapeError, UnsupportedError
from edgetrain.core.kernels import KERNELS

F16, F32, F64 = np.float16, np.float32, np.float64
I8, U8, I32, I64 = np.int8, np.uint8, np.int32, np.int64
TOL = {F16: (1e-2, 1e-2), F32: (1e-5, 1e-5), F64: (1e-10, 1e-12)}


def call(op: str, inputs, attrs=None, *, n_outputs: int = 1, out=None) -> list[np.ndarray]:
    """The kernel through the table, as the interpreter calls it; always a list of outputs."""
    # Float attributes as the importer delivers them: stored in the model as float32.
    kw = {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in (attrs or {}).items()}
    if KERNELS[op].wants_noutputs:
        kw["noutputs"] = n_outputs
    if out is not None:
        kw["out"] = out
    res = KERNELS[op].fn(*inputs, **kw)
    return list(res) if isinstance(res, tuple) else [res]


def check(
    op: str, inputs, attrs=None, *, n_outputs: int = 1, ref=ort_run, ref_outputs: int | None = None, tol=None
) -> list[np.ndarray]:
    """Kernel vs reference, output by output; returns the reference outputs. ref_outputs: how many outputs the
    reference node needs (onnx requires all three of BatchNormalization in training mode)."""
    expected = ref(op, inputs, attrs, n_outputs=ref_outputs or n_outputs)[:n_outputs]
    got = call(op, inputs, attrs, n_outputs=n_outputs)
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        rtol, atol = tol or TOL.get(e.dtype.type, (0, 0))
        assert_close(g, e, rtol=rtol, atol=atol, what=f"{op} {attrs} output {k}")
    return expected


def rand(rng, shape, dt, lo=-3, hi=3):
    if np.dtype(dt).kind == "b":
        return rng.random(shape) > 0.5
    if np.dtype(dt).kind in "iu":
        return rng.integers(max(lo, np.iinfo(dt).min), hi, shape).astype(dt)
    return rng.uniform(lo, hi, shape).astype(dt)


# -------------------------------------------------------------------------------- MatMul, Gemm

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 3)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (4,)),
    ((2, 3, 4), (4,)),
    ((1, 7), (7, 1)),
    ((3, 0), (0, 2)),
]


@pytest.mark.parametrize("dt", [F32, F64, F16, I32, I64])
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(sa, sb, dt):
    rng = np.random.default_rng(1)
    check("MatMul", [rand(rng, sa, dt), rand(rng, sb, dt)])


GEMM_C = [None, (), (1,), (5,), (1, 5), (3, 1), (3, 5)]


@pytest.mark.parametrize("c_shape", GEMM_C)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.0), (1.0, 0.25)])
def test_gemm(ta, tb, alpha, beta, c_shape):
    rng = np.random.default_rng(2)
    a = rand(rng, (4, 3) if ta else (3, 4), F32)
    b = rand(rng, (5, 4) if tb else (4, 5), F32)
    c = None if c_shape is None else rand(rng, c_shape, F32)
    check("Gemm", [a, b, c], dict(alpha=alpha, beta=beta, transA=ta, transB=tb))


@pytest.mark.parametrize("dt", [F64, F16])
def test_gemm_dtypes(dt):
    rng = np.random.default_rng(3)
    check(
        "Gemm",
        [rand(rng, (6, 3), dt), rand(rng, (5, 6), dt), rand(rng, (5,), dt)],
        dict(alpha=0.5, beta=0.5, transA=1, transB=1),
    )


# -------------------------------------------------------------------------------- Softmax family


@pytest.mark.parametrize("dt", [F32, F64, F16])
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((3, 4, 5), -1),
        ((3, 4, 5), 0),
        ((3, 4, 5), 1),
        ((3, 4, 5), -2),
        ((7,), 0),
        ((2, 1, 6), 1),
        ((2, 0, 3), 2),
    ],
)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family(op, shape, axis, dt):
    rng = np.random.default_rng(4)
    # Hardmax on integers to get ties (the first maximum wins); Softmax on large values (needs the max shift).
    x = rng.integers(-2, 3, shape).astype(dt) if op == "Hardmax" else rand(rng, shape, dt, -3, 3)
    if op != "Hardmax" and dt != F16:
        x = x * dt(100)
    check(op, [x], dict(axis=axis), ref=ref_run if (op, dt) == ("Hardmax", F64) else ort_run)


# -------------------------------------------------------------------------------- reductions

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
REDUCE_DTYPES = {op: [F32, F64, F16, I32, I64] for op in REDUCE_OPS}
# Integer LogSumExp: onnxruntime truncates inside its (order-dependent) sum; ours is exact, then truncated.
REDUCE_DTYPES["ReduceLogSumExp"] = [F32, F64, F16]
REDUCE_DTYPES["ReduceMax"] = REDUCE_DTYPES["ReduceMin"] = [F32, F64, F16, I32, I64, I8, U8, np.bool_]
REDUCE_AXES = [None, [], [1], [-1], [0, 2], [2, 0, 1]]


def reduce_data(rng, op, shape, dt):
    if op == "ReduceLogSum":
        return rand(rng, shape, dt, 1, 3)  # log of a positive sum
    if op == "ReduceProd":
        return rand(rng, shape, dt, -2, 3) if np.dtype(dt).kind in "iu" else rand(rng, shape, dt, 0.6, 1.4)
    return rand(rng, shape, dt, -3, 4)


def reduce_tol(op, dt):
    # float16: onnxruntime and numpy sum in different orders, log/exp of float16 values
    return (2e-2, 5e-2) if dt == F16 else None


@pytest.mark.parametrize("op,dt", [(op, dt) for op in REDUCE_OPS for dt in REDUCE_DTYPES[op]])
def test_reduce(op, dt):
    rng = np.random.default_rng(5)
    x = reduce_data(rng, op, (3, 4, 5), dt)
    for axes, keepdims in itertools.product(REDUCE_AXES, [1, 0]):
        ax = None if axes is None else np.array(axes, np.int64)
        check(op, [x, ax], dict(keepdims=keepdims), tol=reduce_tol(op, dt))
    for axes in (None, []):  # no-op: each element reduced on its own
        ax = None if axes is None else np.array(axes, np.int64)
        check(op, [x, ax], dict(noop_with_empty_axes=1), tol=reduce_tol(op, dt))


@pytest.mark.parametrize("dt", [F32, F16, I32, I64])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_empty(op, dt):
    for shape, axes in [((2, 0, 4), [1]), ((2, 0, 4), [2]), ((0, 3), None), ((0, 3), [0])]:
        x = np.zeros(shape, dt)
        ax = None if axes is None else np.array(axes, np.int64)
        for keepdims in (1, 0):
            check(op, [x, ax], dict(keepdims=keepdims))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_scalar_and_infinities(op):
    check(op, [np.array(-2.5, F32)], dict(keepdims=0))
    check(op, [np.array(2.5, F64)], dict(keepdims=1))
    x = np.array([[-np.inf, -np.inf, -np.inf], [1, np.inf, 2], [0.5, 1.5, -1]], F32)
    for axes in ([1], [0]):
        check(op, [x, np.array(axes, np.int64)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_infinities(op):
    check(op, [np.array([[-np.inf, 0, 1], [-np.inf, -np.inf, -np.inf], [3, -np.inf, 3]], F32)])


def test_reduce_noop_returns_input_and_mean_float16():
    x = np.arange(6, dtype=F16).reshape(2, 3)
    assert KERNELS["ReduceSum"].fn(x, np.zeros(0, np.int64), noop_with_empty_axes=1) is x
    # float16 accumulated in float32 (onnxruntime does too), result float16: no overflow at 60000 + 60000.
    y = KERNELS["ReduceMean"].fn(np.array([[60000, 60000, 1000]], F16), np.array([1], np.int64))
    assert y.dtype == F16 and np.isfinite(y).all()
    check("ReduceMean", [np.array([[60000, 60000, 1000]], F16), np.array([1], np.int64)])


@pytest.mark.parametrize("dt", [F32, F64, F16, I32, I64, I8, U8])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg(op, dt):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 3, (3, 4, 5)).astype(dt)  # many ties: first vs last index matters
    for axis, keepdims, last in itertools.product([0, 1, -1], [1, 0], [0, 1]):
        check(op, [x], dict(axis=axis, keepdims=keepdims, select_last_index=last))


# -------------------------------------------------------------------------------- normalisation

BN_SHAPES = [(4, 3), (2, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)]


def bn_inputs(rng, shape, dt, pdt=None):
    pdt = pdt or dt
    c = shape[1]
    return [
        rand(rng, shape, dt),
        rand(rng, (c,), pdt),
        rand(rng, (c,), pdt),
        rand(rng, (c,), pdt),
        rand(rng, (c,), pdt, 0.5, 2),
    ]


@pytest.mark.parametrize("dt,pdt", [(F32, F32), (F64, F64), (F16, F16), (F16, F32)])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_inference(shape, dt, pdt):
    rng = np.random.default_rng(7)
    for eps in (1e-5, 1e-2):
        check("BatchNormalization", bn_inputs(rng, shape, dt, pdt), dict(epsilon=eps))


@pytest.mark.parametrize("dt", [F32, F64, F16])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_training(shape, dt):
    rng = np.random.default_rng(8)
    for momentum, n in [(0.9, 3), (0.5, 3), (0.9, 1)]:
        check(
            "BatchNormalization",
            bn_inputs(rng, shape, dt),
            dict(training_mode=1, momentum=momentum),
            n_outputs=n,
            ref_outputs=3,
            tol={F16: (1e-2, 2e-2), F32: (1e-4, 1e-5)}.get(dt),
        )


@pytest.mark.parametrize("dt", [F32, F64, F16])
@pytest.mark.parametrize("axis", [-1, -2, 1, 0, 3])
def test_layernorm(axis, dt):
    rng = np.random.default_rng(9)
    x = rand(rng, (2, 3, 4, 5), dt)
    inner = x.shape[axis % 4 :]
    for with_b, n in [(True, 3), (False, 1), (True, 2), (False, 3)]:
        b = rand(rng, inner, dt) if with_b else None
        check(
            "LayerNormalization",
            [x, rand(rng, inner, dt), b],
            dict(axis=axis, epsilon=1e-3),
            n_outputs=n,
            tol=(1e-2, 2e-2) if dt == F16 else (1e-4, 1e-5) if dt == F32 else None,
        )


@pytest.mark.parametrize("dt", [F32, F16, F64])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_instancenorm(shape, dt):
    rng = np.random.default_rng(10)
    c = shape[1]
    check(
        "InstanceNormalization",
        [rand(rng, shape, dt), rand(rng, (c,), dt), rand(rng, (c,), dt)],
        dict(epsilon=1e-3),
        ref=ref_run if dt == F64 else ort_run,
        tol=(1e-2, 2e-2) if dt == F16 else (1e-4, 1e-5) if dt == F32 else None,
    )


@pytest.mark.parametrize("dt", [F32, F64, F16])
@pytest.mark.parametrize(
    "shape,groups", [((2, 4, 5), 1), ((2, 4, 5), 2), ((2, 4, 5), 4), ((2, 6, 3, 3), 3), ((1, 4, 2, 2, 3), 2)]
)
def test_groupnorm(shape, groups, dt):
    rng = np.random.default_rng(11)
    c = shape[1]
    # float64: onnxruntime's function body computes in the stash type, float32; the kernel keeps float64.
    check(
        "GroupNormalization",
        [rand(rng, shape, dt), rand(rng, (c,), dt), rand(rng, (c,), dt)],
        dict(num_groups=groups, epsilon=1e-3),
        tol={F16: (1e-2, 2e-2), F32: (1e-4, 1e-5)}.get(dt, (1e-5, 1e-6)),
    )


# -------------------------------------------------------------------------------- Dropout


def test_dropout_inference_is_identity():
    x = np.random.default_rng(12).standard_normal((4, 5)).astype(F32)
    for ratio, training in [(None, None), (np.array(0.3, F32), None), (np.array(0.3, F32), np.array(False))]:
        y, mask = call("Dropout", [x, ratio, training], n_outputs=2)
        assert y is x
        assert mask.dtype == np.bool_ and mask.shape == x.shape and mask.all()
        assert call("Dropout", [x, ratio, training])[0] is x
    check("Dropout", [x, np.array(0.3, F32)], n_outputs=2)


@pytest.mark.parametrize("dt", [F32, F16, F64])
def test_dropout_training(dt):
    x = np.random.default_rng(13).uniform(1, 2, (200, 500)).astype(dt)
    ratio, on = np.array(0.3, F32), np.array(True)
    y, mask = call("Dropout", [x, ratio, on], dict(seed=7), n_outputs=2)
    assert y.dtype == dt and mask.dtype == np.bool_ and y.shape == mask.shape == x.shape
    assert abs(mask.mean() - 0.7) < 0.01  # 100k draws: 0.01 is > 9 sigma
    assert_close(y[mask], (x[mask] / (1 - float(ratio))).astype(dt), rtol=TOL[dt][0], atol=0)
    assert (y[~mask] == 0).all()
    again = call("Dropout", [x, ratio, on], dict(seed=7), n_outputs=2)
    assert np.array_equal(again[1], mask)  # the seed fixes the mask
    other = call("Dropout", [x, ratio, on], dict(seed=8), n_outputs=2)
    assert not np.array_equal(other[1], mask)
    y0, m0 = call("Dropout", [x, np.array(0.0, F32), on], n_outputs=2)  # ratio 0: identity
    assert y0 is x and m0.all()


# -------------------------------------------------------------------------------- Einsum, CumSum

EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("...ii->...i", [(2, 4, 4)]),
    ("ii->i", [(4, 4)]),
    ("bhid,bhjd->bhij", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ijk->", [(2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij", [(3, 4)]),
    (" ij , jk -> ik ", [(3, 4), (4, 2)]),
]


@pytest.mark.parametrize("dt", [F32, F64, I32, I64])
@pytest.mark.parametrize("equation,shapes", EINSUM)
def test_einsum(equation, shapes, dt):
    rng = np.random.default_rng(14)
    inputs = [rand(rng, s, dt) for s in shapes]
    check("Einsum", inputs, dict(equation=equation), tol=(1e-5, 1e-4) if dt == F32 else None)
    y = call("Einsum", inputs, dict(equation=equation))[0]
    assert not any(np.may_share_memory(y, x) for x in inputs)


@pytest.mark.parametrize("dt,adt", [(F32, I64), (F64, I32), (I32, I64), (I64, I32), (F16, I64)])
def test_cumsum(dt, adt):
    rng = np.random.default_rng(15)
    for shape, axis in [((5,), 0), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 0, 3), 1)]:
        x = rand(rng, shape, dt)
        for exclusive, reverse in itertools.product([0, 1], [0, 1]):
            check("CumSum", [x, np.array(axis, adt)], dict(exclusive=exclusive, reverse=reverse))


# -------------------------------------------------------------------------------- out= buffers


def _out_cases():
    rng = np.random.default_rng(16)
    r = lambda *s, dt=F32: rand(rng, s, dt)  # noqa: E731
    bn = bn_inputs(rng, (2, 3, 4, 5), F32)
    return [
        ("MatMul", [r(2, 3, 4), r(4, 5)], {}),
        ("MatMul", [r(4), r(4)], {}),
        ("MatMul", [r(3, 4, dt=F16), r(4, 2, dt=F16)], {}),
        ("Gemm", [r(3, 4), r(4, 5), r(5)], {}),
        ("Gemm", [r(4, 3), r(4, 5), r(3, 5)], dict(alpha=2.0, transA=1)),
        ("Softmax", [r(3, 4)], {}),
        ("Softmax", [r(3, 4, dt=F16)], dict(axis=0)),
        ("LogSoftmax", [r(3, 4)], {}),
        ("Hardmax", [r(3, 4)], dict(axis=0)),
        ("BatchNormalization", bn, {}),
        ("BatchNormalization", bn, dict(training_mode=1)),
        ("BatchNormalization", bn_inputs(rng, (2, 3, 4), F16), {}),
        ("LayerNormalization", [r(2, 3, 4), r(4), r(4)], {}),
        ("LayerNormalization", [r(2, 3, 4, dt=F16), r(4, dt=F16), None], {}),
        ("InstanceNormalization", [r(2, 3, 4, 5), r(3), r(3)], {}),
        ("GroupNormalization", [r(2, 4, 5), r(4), r(4)], dict(num_groups=2)),
        ("CumSum", [r(3, 4), np.array(1)], dict(exclusive=1, reverse=1)),
    ]


@pytest.mark.parametrize("op,inputs,attrs", _out_cases())
def test_out_buffer(op, inputs, attrs):
    assert KERNELS[op].writes_out
    n = 3 if attrs.get("training_mode") else 1
    expected = ort_run(op, inputs, attrs, n_outputs=n)[0]
    out = np.full(expected.shape, np.nan if expected.dtype.kind == "f" else 7, expected.dtype)
    got = call(op, inputs, attrs, n_outputs=n, out=out)[0]
    assert got is out
    rtol, atol = (1e-2, 1e-2) if expected.dtype == F16 else (1e-5, 1e-5)
    assert_close(out, expected, rtol=rtol, atol=atol, what=op)


def test_out_cases_cover_every_out_kernel():
    assert {op for op, _, _ in _out_cases()} == {op for op in NODE_OPS if KERNELS[op].writes_out}


# -------------------------------------------------------------------------------- onnx node test cases

NODE_OPS = [
    "MatMul",
    "Gemm",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    *REDUCE_OPS,
    "ArgMax",
    "ArgMin",
    "BatchNormalization",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "Dropout",
    "Einsum",
    "CumSum",
]
# The opset that introduced the form our kernels take (axes as input, ratio as input, per-axis softmax).
NEWEST_FORM = {
    "Dropout": 12,
    "ReduceSum": 13,
    "Softmax": 13,
    "LogSoftmax": 13,
    "Hardmax": 13,
    **{op: 18 for op in REDUCE_OPS if op != "ReduceSum"},
}
_RANDOM_MASK = "mask from np.random.seed's legacy stream; the kernel draws from a Generator (stats tested)"
EXCLUDED = {
    "test_training_dropout": _RANDOM_MASK,
    "test_training_dropout_mask": _RANDOM_MASK,
    "test_training_dropout_default": _RANDOM_MASK,
    "test_training_dropout_default_mask": _RANDOM_MASK,
}
NODE_CASES = [pytest.param(op, *case, id=case[0]) for op in NODE_OPS for case in node_cases(op)]


@pytest.mark.parametrize("op,name,opset,inputs,attrs,expected,rtol,atol", NODE_CASES)
def test_node_case(op, name, opset, inputs, attrs, expected, rtol, atol):
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    if opset < NEWEST_FORM.get(op, 1):
        pytest.skip("old form: importer rewrites it")
    got = call(op, inputs, attrs, n_outputs=len(expected))
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        if e.dtype == F32:
            rtol, atol = max(rtol, 1e-5), max(atol, 1e-6)
        assert_close(g, e, rtol=rtol, atol=atol, what=f"{name} output {k}")


# -------------------------------------------------------------------------------- user-caused failures


def _raises(exc, words, op, inputs, attrs=None, n_outputs=1):
    with pytest.raises(exc) as info:
        call(op, inputs, attrs, n_outputs=n_outputs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


X3 = np.zeros((2, 3, 4), F32)


def test_error_axis_out_of_range():
    _raises(ShapeError, ["Softmax", "axis=3", "rank 3"], "Softmax", [X3], dict(axis=3))
    _raises(ShapeError, ["ArgMax", "axis=-4"], "ArgMax", [X3], dict(axis=-4))
    _raises(
        ShapeError, ["LayerNormalization", "axis=5"], "LayerNormalization", [X3, X3[0, 0], None], dict(axis=5)
    )
    _raises(ShapeError, ["CumSum", "axis=3"], "CumSum", [X3, np.array(3)])


def test_error_reduce_axes():
    _raises(ShapeError, ["ReduceSum", "axes=7"], "ReduceSum", [X3, np.array([7])])
    _raises(ShapeError, ["ReduceMax", "twice"], "ReduceMax", [X3, np.array([1, -2])])


def test_error_argmax_empty_axis():
    _raises(ShapeError, ["ArgMin", "length 0"], "ArgMin", [np.zeros((2, 0), F32)], dict(axis=1))


def test_error_matmul_gemm_shapes():
    _raises(ShapeError, ["MatMul", "(2, 3, 4)", "(3, 4)"], "MatMul", [X3, np.zeros((3, 4), F32)])
    _raises(ShapeError, ["Gemm", "(3, 4)"], "Gemm", [np.zeros((3, 4), F32), np.zeros((3, 4), F32)])
    _raises(
        ShapeError,
        ["Gemm", "C (4,)"],
        "Gemm",
        [np.zeros((3, 4), F32), np.zeros((4, 5), F32), np.zeros(4, F32)],
    )


def test_error_norm_params():
    p = np.ones(4, F32)
    _raises(ShapeError, ["BatchNormalization", "scale", "(3,)"], "BatchNormalization", [X3, p, p, p, p])
    _raises(ShapeError, ["LayerNormalization", "Scale", "(3,)"], "LayerNormalization", [X3, np.ones(3, F32)])
    _raises(
        ShapeError,
        ["GroupNormalization", "num_groups=2", "3 channels"],
        "GroupNormalization",
        [X3, np.ones(3, F32), np.ones(3, F32)],
        dict(num_groups=2),
    )


def test_error_batchnorm_inference_outputs():
    p = np.ones(3, F32)
    _raises(ModelError, ["training_mode=0", "3"], "BatchNormalization", [X3, p, p, p, p], n_outputs=3)


def test_error_stash_type():
    _raises(
        UnsupportedError,
        ["stash_type=0", "supported: 1"],
        "LayerNormalization",
        [X3, np.ones(4, F32)],
        dict(stash_type=0),
    )
    _raises(
        UnsupportedError,
        ["stash_type=11"],
        "GroupNormalization",
        [X3, np.ones(3, F32), np.ones(3, F32)],
        dict(num_groups=1, stash_type=11),
    )


def test_error_dropout_ratio():
    _raises(
        UnsupportedError, ["ratio=1.0", "0 <= ratio < 1"], "Dropout", [X3, np.array(1.0, F32), np.array(True)]
    )


def test_error_einsum():
    _raises(
        UnsupportedError,
        ["equation='ij,jk,kl'", "2 inputs"],
        "Einsum",
        [X3[0], X3[0]],
        dict(equation="ij,jk,kl"),
    )
    _raises(UnsupportedError, ["equation='i$j'"], "Einsum", [X3[0]], dict(equation="i$j"))
    _raises(
        ShapeError, ["equation='ij,jk->ik'", "(3, 4)"], "Einsum", [X3[0], X3[0]], dict(equation="ij,jk->ik")
    )
