"""Gradient rules of elementwise ops against float64 finite differences and onnxruntime (grad_harness)."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import build, check_against_onnxruntime, check_grad, grads_of, rnd

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.derive.autodiff import RULES, GradContext, ShapedBuilder, differentiate
from edgetrain.graph.passes import infer_shapes

check = check_grad


# ------------------------------------------------------------------------------------------------ arithmetic

BINARY_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 2)), ((1, 3), (2, 1))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
def test_binary(op, shapes):
    a = rnd(*shapes[0], seed=1)
    b = rnd(*shapes[1], seed=2, lo=0.5, hi=2.0) if op == "Div" else rnd(*shapes[1], seed=2)
    check(op, [a, b])


@pytest.mark.parametrize("op", ["Add", "Mul", "Div"])
def test_binary_one_side(op):
    # only one input trainable: the rule builds only what is needed
    check(op, [rnd(2, 3), rnd(3, lo=0.5, hi=2)], wrt=[0])
    check(op, [rnd(2, 3), rnd(3, lo=0.5, hi=2)], wrt=[1])


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (4,)], [(2, 1, 4), (3, 1), (1, 4)], [(2,)] * 4])
def test_variadic(op, shapes):
    check(op, [rnd(*s, seed=k) for k, s in enumerate(shapes)])


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_ties_split_like_pytorch(op):
    # Two inputs tied: each gets dy / 2, which is also what a central difference measures.
    a = rnd(3, 4)
    b = a.copy()
    b[0] += 1.0
    b[2] -= 1.0
    check(op, [a, b])
    check(op, [a, np.zeros((1,)) + a[1, 1]], wrt=[0])  # ties against a broadcast constant
    # Three inputs tied at an element: a third each.
    x = [np.array([1.0, 2.0]), np.array([1.0, 0.5]), np.array([1.0, 3.0])]
    if op == "Min":
        x = [-v for v in x]
    feeds = {f"x{k}": v for k, v in enumerate(x)}
    nodes = [Node(op, tuple(feeds), ("y",)), Node("ReduceSum", ("y",), ("loss",), {"keepdims": 0})]
    _, got = grads_of(nodes, feeds, "loss", list(feeds))
    np.testing.assert_allclose(got, [[1 / 3, 0], [1 / 3, 0], [1 / 3, 1]])


# ------------------------------------------------------------------------------------------------ unary

UNARY = {
    "Neg": dict(),
    "Abs": dict(away=(0,)),
    "Exp": dict(),
    "Log": dict(lo=0.2, hi=3.0),
    "Sqrt": dict(lo=0.2, hi=3.0),
    "Reciprocal": dict(lo=0.3, hi=2.0),
    "Sin": dict(),
    "Cos": dict(),
    "Tan": dict(lo=-1.2, hi=1.2),
    "Relu": dict(away=(0,)),
    "Sigmoid": dict(),
    "Tanh": dict(),
    "Softplus": dict(),
    "Softsign": dict(away=(0,)),
    "Erf": dict(),
    "Mish": dict(),
    "HardSwish": dict(away=(-3, 3), lo=-5, hi=5),
    "Identity": dict(),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("shape", [(3, 5), ()])
def test_unary(op, shape):
    check(op, [rnd(*shape, **UNARY[op])])


ACTIVATIONS = [
    ("LeakyRelu", {}, dict(away=(0,))),
    ("LeakyRelu", {"alpha": 0.3}, dict(away=(0,))),
    ("LeakyRelu", {"alpha": -1.5}, dict(away=(0,))),
    ("ThresholdedRelu", {}, dict(away=(1,), lo=-1, hi=3)),
    ("ThresholdedRelu", {"alpha": -0.5}, dict(away=(-0.5,))),
    ("Shrink", {}, dict(away=(-0.5, 0.5), lo=-2, hi=2)),
    ("Shrink", {"bias": 0.3, "lambd": 1.2}, dict(away=(-1.2, 1.2), lo=-3, hi=3)),
    ("Elu", {}, dict(away=(0,))),
    ("Elu", {"alpha": 0.4}, dict(away=(0,))),
    ("Selu", {}, dict(away=(0,))),
    ("Selu", {"alpha": 1.2, "gamma": 0.7}, dict(away=(0,))),
    ("Celu", {}, dict(away=(0,))),
    ("Celu", {"alpha": 2.5}, dict(away=(0,))),
    ("Celu", {"alpha": -0.5}, dict(away=(0,))),
    ("HardSigmoid", {}, dict(away=(-2.5, 2.5), lo=-4, hi=4)),
    ("HardSigmoid", {"alpha": 0.5, "beta": 0.2}, dict(away=(-0.4, 1.6), lo=-2, hi=3)),
]


@pytest.mark.parametrize("op,attrs,data", ACTIVATIONS, ids=lambda v: str(v))
def test_activation(op, attrs, data):
    check(op, [rnd(4, 5, **data)], attrs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    # Gelu is an opset-20 op: grad_harness's onnxruntime check runs at opset 18, so it runs here at 20.
    x = rnd(4, 6, lo=-4, hi=4)
    check("Gelu", [x], {"approximate": approximate}, ort=False)
    check_against_onnxruntime("Gelu", [x], {"approximate": approximate}, wrt=[0], opset=20)


@pytest.mark.parametrize("slope_shape", [(4, 5), (5,), (1,), (4, 1)])
def test_prelu(slope_shape):
    check("PRelu", [rnd(3, 4, 5, away=(0,)), rnd(*slope_shape, seed=3)])
    check("PRelu", [rnd(3, 4, 5, away=(0,)), rnd(*slope_shape, seed=3)], wrt=[1])


def test_pow():
    x = rnd(3, 4, lo=0.3, hi=2.0)
    for p in (3.0, 2.0, 1.0, -1.5, 0.5):
        check("Pow", [x, np.array(p)], wrt=[0])
    check("Pow", [rnd(3, 4, away=(0,)), np.array(3, np.int64)])  # integer exponent, negative base
    check("Pow", [rnd(3, 4, away=(0,)), np.array([2.0])], wrt=[0])  # p of shape (1,)
    check("Pow", [x, rnd(4, seed=5)])  # trainable exponent, broadcast
    check("Pow", [x, rnd(2, 1, 1, seed=5)], wrt=[0])  # a constant p that broadcasts the output up
    check("Pow", [rnd(2, 3, 4, lo=0.5, hi=2), rnd(3, 1, seed=6)], wrt=[1])
    # d/dp x^p at x = 0 is taken as 0 (the limit for p > 0), not 0 * log(0) = nan
    check("Pow", [np.array([0.0, 0.5, 2.0]), np.array([1.5, 2.0, 0.7])], wrt=[1])


# ------------------------------------------------------------------------------------------------ selection


@pytest.mark.parametrize(
    "bounds",
    [(np.array(-0.5), np.array(0.7)), (np.array(-0.3), None), (None, np.array(0.2)), (None, None)],
    ids=["both", "min", "max", "none"],
)
def test_clip(bounds):
    lo, hi = bounds
    kinks = tuple(float(b) for b in bounds if b is not None)
    inputs = [rnd(4, 5, away=kinks, lo=-1.5, hi=1.5), lo, hi]
    while inputs[-1] is None and len(inputs) > 1:
        inputs.pop()
    check("Clip", inputs, wrt=[0])


def test_clip_gradient_at_the_bounds_and_min_above_max():
    # Bounds included, as pytorch: x = min or x = max passes the gradient.
    feeds = {"x": np.array([-1.0, -0.5, 0.0, 0.5, 1.0])}
    for lo, hi, expect in ((-0.5, 0.5, [0, 1, 1, 1, 0]), (0.7, 0.2, None)):
        nodes = [
            Node("Clip", ("x", "lo", "hi"), ("y",)),
            Node("ReduceSum", ("y",), ("loss",), {"keepdims": 0}),
        ]
        values = {"x": TensorInfo(np.dtype(np.float64), (5,))}
        consts = {"lo": np.array(lo), "hi": np.array(hi)}
        g = infer_shapes(Graph(nodes, ["x"], ["loss"], consts, values, opset=18))
        b = ShapedBuilder(g)
        grads = differentiate(GradContext(b), "loss", ["x"])
        if expect is None:  # min > max: y = max everywhere, no gradient (the rule returns None)
            assert grads["x"] is None
            continue
        got = Interpreter(b.finish(outputs=[grads["x"]]), preallocate=False).run(feeds)[0]
        np.testing.assert_array_equal(got, expect)


def test_clip_trainable_bound_is_unsupported():
    with pytest.raises(UnsupportedError, match="under_test"):
        build("Clip", [rnd(3), np.array(-0.5), np.array(0.5)], None, [0, 1], 1, 0, np.float64)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), (3, 4)), ((4,), (2, 1, 4), ())])
def test_where(shapes):
    rng = np.random.default_rng(4)
    cond = rng.random(shapes[0]) > 0.5
    check("Where", [cond, rnd(*shapes[1], seed=1), rnd(*shapes[2], seed=2)])
    check("Where", [cond, rnd(*shapes[1], seed=1), rnd(*shapes[2], seed=2)], wrt=[2])


# ------------------------------------------------------------------------------------------------ Cast, Dropout


def test_cast_float_to_float():
    # float64 in both runs here; in the onnxruntime run the input is float32, cast to double and back.
    check("Cast", [rnd(3, 4)], {"to": 11})
    check("CastLike", [rnd(3, 4), np.zeros(1)], wrt=[0])


def test_cast_through_integers_blocks_the_gradient():
    # y = x * float(int(x)): the integer path carries no gradient, so dy/dx = trunc(x)
    x = rnd(6) * 3
    nodes = [
        Node("Cast", ("x",), ("xi",), {"to": 6}),
        Node("Cast", ("xi",), ("xf",), {"to": 11}),
        Node("Mul", ("x", "xf"), ("y",)),
        Node("ReduceSum", ("y",), ("loss",), {"keepdims": 0}),
    ]
    _, (got,) = grads_of(nodes, {"x": x}, "loss", ["x"])
    np.testing.assert_array_equal(got, np.trunc(x))


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign"])
def test_piecewise_constant_ops_block(op):
    # zero gradient almost everywhere: the rule returns None, so y = x * op(x) has dy/dx = op(x)
    assert RULES[op](None, Node(op, ("x",), ("y",)), ["dy"], [True]) == [None]
    x = rnd(6, away=(0,)) * 3
    nodes = [Node(op, ("x",), ("f",)), Node("Mul", ("x", "f"), ("y",))]
    nodes.append(Node("ReduceSum", ("y",), ("loss",), {"keepdims": 0}))
    _, (got,) = grads_of(nodes, {"x": x}, "loss", ["x"])
    np.testing.assert_array_equal(
        got, {"Floor": np.floor, "Ceil": np.ceil, "Round": np.rint, "Sign": np.sign}[op](x)
    )


def test_dropout_inference_is_identity():
    check("Dropout", [rnd(3, 4)])
    check("Dropout", [rnd(3, 4), np.array(0.3), np.array(False)], wrt=[0])
    check("Dropout", [rnd(3, 4), np.array(0.0), np.array(True)], wrt=[0], n_outputs=2)


def test_dropout_training_uses_the_mask():
    # seeded, so the finite differences see the same mask; onnxruntime draws its own mask, so no comparison there
    x = rnd(4, 6)
    check("Dropout", [x, np.array(0.25), np.array(True)], {"seed": 3}, wrt=[0], n_outputs=2, ort=False)
    graph, _, feeds = build(
        "Dropout", [x, np.array(0.25), np.array(True)], {"seed": 3}, [0], 2, 0, np.float64
    )
    loss, dx = Interpreter(graph, preallocate=False).run(feeds)
    assert np.count_nonzero(dx == 0) > 0  # dropped elements get no gradient


def test_dropout_training_without_mask_output_is_unsupported():
    with pytest.raises(UnsupportedError, match=r"under_test.*mask output"):
        build("Dropout", [rnd(3, 4), np.array(0.25), np.array(True)], {"seed": 3}, [0], 1, 0, np.float64)
