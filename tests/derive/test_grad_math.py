"""Gradient rules of the math family against float64 finite differences and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import build, check_against_onnxruntime, check_grad, record, rnd

from edgetrain.core.errors import UnsupportedError

run = check_grad


def r(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape)


def ax(*axes):
    return np.asarray(axes, dtype=np.int64)


# -------------------------------------------------------------------------------- MatMul, Gemm


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (3, 4, 2)),
        ((4,), (4, 3)),
        ((4,), (2, 4, 3)),
        ((2, 3, 4), (4,)),
        ((3, 4), (4,)),
        ((4,), (4,)),
    ],
)
def test_matmul(sa, sb):
    run("MatMul", [r(*sa), r(*sb, seed=1)])


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("cshape", [None, (3, 5), (5,), (1, 5), (3, 1), ()])
def test_gemm(ta, tb, cshape):
    a = r(*((4, 3) if ta else (3, 4)))
    b = r(*((5, 4) if tb else (4, 5)), seed=1)
    c = None if cshape is None else r(*cshape, seed=2)
    run("Gemm", [a, b, c], dict(transA=ta, transB=tb, alpha=0.7, beta=-1.3))


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_gemm_defaults_and_unused_c(beta):
    run("Gemm", [r(3, 4), r(4, 5, seed=1), r(5, seed=2)], dict(beta=beta), wrt=[0, 1])


# -------------------------------------------------------------------------------- Softmax family


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_softmax(op, axis):
    run(op, [r(2, 3, 4)], dict(axis=axis))


def test_softmax_default_axis_large_logits():
    run("Softmax", [r(3, 5) * 4 + 50])
    run("LogSoftmax", [r(3, 5) * 4 + 50])


# -------------------------------------------------------------------------------- reductions

REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMin",
    "ReduceL1",
    "ReduceLogSum",
    "ReduceProd",
]
AXES = [None, ax(1), ax(-1), ax(0, 2), ax(-3, -1), ax(0, 1, 2)]


def distinct(*shape):
    """Values with no ties, at least 0.05 apart (finite differences of max/min stay on one side)."""
    v = np.random.default_rng(3).permutation(np.prod(shape)).reshape(shape)
    return v * 0.05 - 0.4


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes", AXES, ids=lambda a: "none" if a is None else str(a.tolist()))
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op, axes, keepdims):
    run(op, [reduce_input(op, 2, 3, 4), axes], dict(keepdims=keepdims), wrt=[0])


def reduce_input(op, *shape):
    if op in ("ReduceMax", "ReduceMin"):
        return distinct(*shape)
    if op == "ReduceLogSum":  # a positive sum
        return np.abs(r(*shape)) + 0.1
    if op == "ReduceL1":  # away from the kink at 0
        return rnd(*shape, away=(0.0,))
    return r(*shape)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes", [None, ax()], ids=["absent", "empty"])
def test_reduce_noop(op, axes):
    run(op, [reduce_input(op, 2, 3), axes], dict(noop_with_empty_axes=1, keepdims=0), wrt=[0])


@pytest.mark.parametrize("zeros", [1, 2])
def test_reduce_prod_with_zeros(zeros):
    """A product is smooth through zeros: the rule must not divide by them (one zero: only that element has a
    gradient, the product of the rest; two: none has)."""
    x = r(3, 4)
    x[0, 1] = 0.0
    if zeros == 2:
        x[0, 3] = 0.0
    x[2, 2] = 0.0
    run("ReduceProd", [x, ax(1)], dict(keepdims=0), wrt=[0])
    graph, _, feeds = build("ReduceProd", [x, ax(1)], dict(keepdims=0), [0], 1, 0, np.float64)
    from edgetrain.core.interpreter import Interpreter

    dx = Interpreter(graph, preallocate=False).run(feeds)[1]
    assert np.isfinite(dx).all()
    assert (dx[0] != 0).sum() == (1 if zeros == 1 else 0)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_extremum_ties_split_equally(op):
    x = np.array([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, -1.0]])
    if op == "ReduceMin":
        x = -x
    graph, _, feeds = build(op, [x, ax(1)], dict(keepdims=0), [0], 1, 0, np.float64)
    from edgetrain.core.interpreter import Interpreter

    loss_r = np.random.default_rng(1000).standard_normal(2)  # the harness's R for this output
    dx = Interpreter(graph, preallocate=False).run(feeds)[1]
    want = np.array([[0, 0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3, 0]]) * loss_r[:, None]
    np.testing.assert_allclose(dx, want, rtol=1e-12)


def test_reduce_l2_of_zeros_is_finite():
    x = np.zeros((2, 3))
    x[1] = [0.3, -0.4, 1.2]
    graph, _, feeds = build("ReduceL2", [x, ax(1)], dict(keepdims=0), [0], 1, 0, np.float64)
    from edgetrain.core.interpreter import Interpreter

    dx = Interpreter(graph, preallocate=False).run(feeds)[1]
    assert np.isfinite(dx).all() and not dx[0].any()


def test_reduce_runtime_axes_unsupported():
    # axes as a graph input (not a constant): the rule cannot know which axes to broadcast back over
    with pytest.raises(UnsupportedError, match="under_test.*ReduceSum.*axes"):
        build("ReduceSum", [r(2, 3), ax(1)], {}, [0, 1], 1, 0, np.float64)


# -------------------------------------------------------------------------------- normalisations


@pytest.mark.parametrize("shape", [(3, 2), (2, 3, 4), (2, 2, 3, 2)])
def test_batchnorm_inference(shape):
    c = shape[1]
    var = np.abs(r(c, seed=4)) + 0.5
    run("BatchNormalization", [r(*shape), r(c, seed=1), r(c, seed=2), r(c, seed=3), var], dict(epsilon=1e-3))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4), (2, 2, 3, 2)])
@pytest.mark.parametrize("n_outputs", [1, 3])
def test_batchnorm_training(shape, n_outputs):
    c = shape[1]
    var = np.abs(r(c, seed=4)) + 0.5
    inputs = [r(*shape), r(c, seed=1), r(c, seed=2), r(c, seed=3), var]
    # onnx requires all three outputs in training mode: onnxruntime checks the three-output form only
    # (Y alone does not depend on input_mean and input_var in training mode.)
    wrt = [0, 1, 2, 3, 4] if n_outputs == 3 else [0, 1, 2]
    attrs = dict(training_mode=1, momentum=0.8)
    run("BatchNormalization", inputs, attrs, n_outputs=n_outputs, wrt=wrt, ort=n_outputs == 3)


@pytest.mark.parametrize(
    "shape,axis,pshape",
    [
        ((3, 5), -1, (5,)),
        ((2, 3, 4), -1, (4,)),
        ((2, 3, 4), 1, (3, 4)),
        ((2, 3, 4), -2, (1, 4)),
        ((2, 3, 4), 0, (4,)),
    ],
)
def test_layernorm(shape, axis, pshape):
    run(
        "LayerNormalization",
        [r(*shape), r(*pshape, seed=1), r(*pshape, seed=2)],
        dict(axis=axis, epsilon=1e-3),
    )


def test_layernorm_without_bias():
    run("LayerNormalization", [r(2, 3, 4), r(4, seed=1)])


def _layernorm_ref(x, scale, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    istd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mean) * istd * scale + b, mean, istd


def test_layernorm_statistics_outputs():
    """A loss that reads Mean and InvStdDev too. Those outputs are float32 whatever the data's type, which the
    float64 harness cannot mix, so: the float32 graph (where the rule reuses them) against finite differences of
    a float64 numpy LayerNormalization, and that graph in onnxruntime."""
    x, s, b = r(3, 4) * 0.5 + 1, r(4, seed=1), r(4, seed=2)
    graph, _, feeds = build("LayerNormalization", [x, s, b], dict(epsilon=1e-3), [0, 1, 2], 3, 0, np.float32)
    from edgetrain.core.interpreter import Interpreter

    got = Interpreter(graph, preallocate=False).run(feeds)[1:]
    weights = {}  # the harness's loss: sum(y_k * R_k), the first Mul reading each y_k
    for n in graph.nodes:
        if n.op_type == "Mul" and n.inputs[0] in ("y0", "y1", "y2") and n.inputs[1] in graph.initializers:
            weights.setdefault(n.inputs[0], graph.initializers[n.inputs[1]].astype(np.float64))
    weights = [weights[f"y{k}"] for k in range(3)]

    def loss(args):
        return sum(float(np.sum(o * w)) for o, w in zip(_layernorm_ref(*args, 1e-3), weights))

    worst = 0.0
    for k, got_k in enumerate(got):
        fd = np.empty(got_k.shape)
        for c in np.ndindex(fd.shape):
            plus, minus = [x, s, b], [x, s, b]
            plus[k], minus[k] = plus[k].copy(), minus[k].copy()
            plus[k][c] += 1e-6
            minus[k][c] -= 1e-6
            fd[c] = (loss(plus) - loss(minus)) / 2e-6
        np.testing.assert_allclose(got_k, fd, rtol=1e-4, atol=1e-4)
        worst = max(worst, float(np.max(np.abs(got_k - fd) / np.maximum(np.abs(fd), 1e-3))))
    record("LayerNormalization (Mean/InvStdDev read, float32)", worst)
    check_against_onnxruntime("LayerNormalization", [x, s, b], dict(epsilon=1e-3), wrt=[0, 1, 2], n_outputs=3)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 2, 3, 2), (1, 3, 5), (2, 3)])
def test_instancenorm(shape):
    c = shape[1]
    # onnxruntime refuses (N, C) input (no spatial axes; y = B); the kernel and the rule take it
    run(
        "InstanceNormalization",
        [r(*shape), r(c, seed=1), r(c, seed=2)],
        dict(epsilon=1e-3),
        ort=len(shape) > 2,
    )


@pytest.mark.parametrize("shape,groups", [((2, 4, 3), 2), ((2, 4, 3), 1), ((1, 6, 2, 2), 3), ((2, 4, 3), 4)])
def test_groupnorm(shape, groups):
    c = shape[1]
    # Per-channel scale and bias are GroupNormalization's opset-21 form (the kernel's): emit opset 21.
    run(
        "GroupNormalization",
        [r(*shape), r(c, seed=1), r(c, seed=2)],
        dict(num_groups=groups, epsilon=1e-3),
        opset=21,
    )


# -------------------------------------------------------------------------------- CumSum, Einsum


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(axis, exclusive, reverse):
    run("CumSum", [r(3, 4), np.asarray(axis, np.int64)], dict(exclusive=exclusive, reverse=reverse), wrt=[0])


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("ij,jk->ik", [(2, 3), (3, 4)]),
        ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
        ("ij,jk", [(2, 3), (3, 4)]),
        ("ij->ji", [(2, 3)]),
        ("ij->i", [(2, 3)]),
        ("ij->", [(2, 3)]),
        ("i,j->ij", [(2,), (3,)]),
        ("ij,ij->i", [(2, 3), (2, 3)]),
        ("ijk,k->ij", [(2, 3, 4), (4,)]),
        ("ij,ij->i", [(2, 3), (1, 3)]),
        ("...j,...j->...", [(2, 3), (1, 3)]),
        ("...ij,...jk->...ik", [(2, 2, 3), (2, 3, 4)]),
        ("...j,jk->...k", [(2, 2, 3), (3, 4)]),
        ("ii,ij->j", [(3, 3), (3, 2)]),
        ("ii->i", [(3, 3)]),
        ("ii", [(3, 3)]),
        ("iji->j", [(2, 3, 2)]),
        ("...ii->...i", [(2, 3, 3)]),
        ("bi, bj , bk -> ijk", [(2, 2), (2, 3), (2, 2)]),
    ],
)
def test_einsum(equation, shapes):
    run("Einsum", [r(*s, seed=k) for k, s in enumerate(shapes)], dict(equation=equation))
