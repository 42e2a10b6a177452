"""Gradient rules of elementwise ops (arithmetic, unary math, activations, Clip, Where, Cast, Dropout)."""

from __future__ import annotations

import math

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node
from edgetrain.core.kernels.cast import NUMPY_TO_ONNX
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad

Grads = list[str | None]  # one gradient name (or None) per output / input

# Masks are built as Cast(comparison) * dy, never Where(comparison, dy, 0): numpy's where runs ~10x slower than
# a multiply on a random mask (branch misprediction), and the two agree for finite dy.


def _f32(v: float) -> float:
    # ONNX FLOAT attributes are 32-bit and the kernels round them so: the derivative uses the same value.
    return float(np.float32(v))


def _c(g: GradContext, value: float, like: str) -> str:
    return g.scalar_like(value, like, hint="c")


def _cast(g: GradContext, x: str, like: str) -> str:
    """x cast to like's dtype (a bool mask becomes 0/1; a value of that dtype already is left alone)."""
    if g.dtype(x) == g.dtype(like):
        return x
    return g.op("Cast", x, to=NUMPY_TO_ONNX[g.dtype(like)])


def _mask(g: GradContext, cmp: str, a: str, b: str, like: str) -> str:
    """1.0 where cmp(a, b) holds, else 0.0, in like's dtype."""
    return _cast(g, g.op(cmp, a, b), like)


# ------------------------------------------------------------------------------------------------ arithmetic


# y = a + b: da = dy, db = dy (the driver sums each down to its input's shape)
@grad("Add")
def add_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [dys[0], dys[0]]


# y = a - b: da = dy, db = -dy
@grad("Sub")
def sub_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [dys[0], g.op("Neg", dys[0]) if needs[1] else None]


# y = a * b: da = dy * b, db = dy * a
@grad("Mul")
def mul_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (a, b) = dys, node.inputs
    return [g.op("Mul", dy, b) if needs[0] else None, g.op("Mul", dy, a) if needs[1] else None]


# y = a / b: da = dy / b, db = -dy * a / b^2 = -da * y
@grad("Div")
def div_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    da = g.op("Div", dys[0], node.inputs[1])
    return [da, g.op("Neg", g.op("Mul", da, node.outputs[0])) if needs[1] else None]


# y = x_1 + ... + x_n: dx_i = dy
@grad("Sum")
def sum_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [dys[0]] * len(node.inputs)


# y = (x_1 + ... + x_n) / n: dx_i = dy / n
@grad("Mean")
def mean_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    n = len(node.inputs)
    d = dys[0] if n == 1 else g.op("Mul", dys[0], _c(g, 1 / n, dys[0]))
    return [d] * n


# y = max(x_1..x_n) (or min): the gradient goes to the input(s) equal to y; ties split it equally, as pytorch's
# maximum/minimum do (dy / 2 each for two inputs). Two inputs: w_a = (1 +- sign(a - b)) / 2, w_b = 1 - w_a.
# More inputs: w_i = [x_i == y] / #{j: x_j == y}.
@grad("Max", "Min")
def max_min_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), xs = dys, node.inputs
    if len(xs) == 1:
        return [dy]
    if len(xs) == 2:
        half = _c(g, 0.5 if node.op_type == "Max" else -0.5, dy)
        s = g.op("Mul", g.op("Sign", g.op("Sub", xs[0], xs[1])), half)
        da = g.op("Mul", dy, g.op("Add", s, _c(g, 0.5, dy)))
        return [da if needs[0] else None, g.op("Sub", dy, da) if needs[1] else None]
    y = node.outputs[0]
    eqs = [_mask(g, "Equal", x, y, dy) for x in xs]
    share = g.op("Div", dy, g.op("Sum", *eqs))
    return [g.op("Mul", share, e) if need else None for e, need in zip(eqs, needs)]


# y = -x: dx = -dy
@grad("Neg")
def neg_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Neg", dys[0])]


# y = x (Identity; Dropout in inference mode): dx = dy
@grad("Identity")
def identity_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [dys[0]]


# Floor, Ceil, Round, Sign: piecewise constant, so the gradient is zero almost everywhere. Returning None makes
# the driver treat them as blocking (no gradient flows back through them) instead of building zeros.
@grad("Floor", "Ceil", "Round", "Sign")
def step_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [None]


# ------------------------------------------------------------------------------------------------ unary math


# y = |x|: dx = dy * sign(x) (0 at x = 0, as pytorch)
@grad("Abs")
def abs_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Mul", dys[0], g.op("Sign", node.inputs[0]))]


# y = exp(x): dx = dy * y
@grad("Exp")
def exp_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Mul", dys[0], node.outputs[0])]


# y = log(x): dx = dy / x
@grad("Log")
def log_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Div", dys[0], node.inputs[0])]


# y = sqrt(x): dx = dy / (2 y)
@grad("Sqrt")
def sqrt_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Mul", g.op("Div", dys[0], node.outputs[0]), _c(g, 0.5, dys[0]))]


# y = 1 / x: dx = -dy / x^2 = -dy * y^2
@grad("Reciprocal")
def reciprocal_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y = node.outputs[0]
    return [g.op("Mul", dys[0], g.op("Mul", y, g.op("Neg", y)))]


# y = sin(x): dx = dy * cos(x);  y = cos(x): dx = -dy * sin(x);  y = tan(x): dx = dy * (1 + y^2)
@grad("Sin", "Cos", "Tan")
def trig_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), x, y = dys, node.inputs[0], node.outputs[0]
    if node.op_type == "Sin":
        return [g.op("Mul", dy, g.op("Cos", x))]
    if node.op_type == "Cos":
        return [g.op("Mul", dy, g.op("Neg", g.op("Sin", x)))]
    return [g.op("Mul", dy, g.op("Add", g.op("Mul", y, y), _c(g, 1.0, y)))]


# y = x^p: dx = dy * p * x^(p-1); dp = dy * y * log(x), taken as 0 where x = 0 (as pytorch: the limit for p > 0)
@grad("Pow")
def pow_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (x, p), y = dys, node.inputs, node.outputs[0]
    dx = dp = None
    if needs[0]:
        slope = _pow_slope(g, x, p)
        dx = dy if slope is None else g.op("Mul", dy, slope)
    if needs[1]:
        safe = g.op("Where", g.op("Equal", x, _c(g, 0.0, x)), _c(g, 1.0, x), x)  # log(1) = 0 where x = 0
        t = g.op("Mul", y, g.op("Log", safe))
        dp = _cast(g, g.op("Mul", dy, t), p)
    return [dx, dp]


def _pow_slope(g: GradContext, x: str, p: str) -> str | None:
    """d(x^p)/dx = p * x^(p-1) (None for 1), folded at build time when p is a constant."""
    pv = g.const_value(p)
    if pv is None:
        pf = _cast(g, p, x)
        return g.op("Mul", g.op("Pow", x, g.op("Sub", pf, _c(g, 1.0, pf))), pf)
    pv = np.asarray(pv, dtype=g.dtype(x))
    if pv.size == 1 and float(pv.reshape(-1)[0]) in (1.0, 2.0):
        # x^1: slope 1; x^2: slope 2x (no Pow). A p of shape (1, 1) may broadcast y: the driver sums dx down.
        return None if pv.reshape(-1)[0] == 1 else g.op("Mul", x, _c(g, 2.0, x))
    return g.op("Mul", g.op("Pow", x, g.const(pv - 1, hint="p_minus_1")), g.const(pv, hint="p"))


# ------------------------------------------------------------------------------------------------ activations


# y = max(x, 0): dx = dy * [y > 0] (0 at x = 0, as pytorch); reads y so x may die after the forward
@grad("Relu")
def relu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.private("ReluGrad", dys[0], node.outputs[0])]


@body("ReluGrad")
def _relu_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, y = node.inputs
    return [g.op("Mul", dy, _mask(g, "Greater", y, _c(g, 0.0, y), y))]


# y = x - bias if x > lambd, x + bias if x < -lambd, else 0: dx = dy * [|x| > lambd]
@grad("Shrink")
def shrink_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    lambd = _c(g, _f32(g.attr(node, "lambd")), x)
    return [g.op("Mul", dys[0], _mask(g, "Greater", g.op("Abs", x), lambd, x))]


# y = x if x > alpha else 0: dx = dy * [x > alpha]
@grad("ThresholdedRelu")
def thresholded_relu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    alpha = _c(g, _f32(g.attr(node, "alpha")), x)
    return [g.op("Mul", dys[0], _mask(g, "Greater", x, alpha, x))]


# y = x if x > 0 else alpha * x: dx = dy * (1 + (alpha - 1) * [x <= 0])
@grad("LeakyRelu")
def leaky_relu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    neg = _mask(g, "LessOrEqual", x, _c(g, 0.0, x), x)
    slope = g.op("Add", g.op("Mul", neg, _c(g, _f32(g.attr(node, "alpha")) - 1, x)), _c(g, 1.0, x))
    return [g.op("Mul", dys[0], slope)]


# y = x if x > 0 else s * x: dx = dy * (1 + (s - 1) * [x <= 0]); ds = dy * min(x, 0) (the driver sums it
# down to s's shape)
@grad("PRelu")
def prelu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (x, s) = dys, node.inputs
    dx = ds = None
    if needs[0]:
        neg = _mask(g, "LessOrEqual", x, _c(g, 0.0, x), x)
        s1 = g.op("Sub", s, _c(g, 1.0, s))
        dx = g.op("Mul", dy, g.op("Add", g.op("Mul", neg, s1), _c(g, 1.0, x)))
    if needs[1]:
        ds = g.op("Mul", dy, g.op("Min", x, _c(g, 0.0, x)))
    return [dx, ds]


# Elu: y = x if x > 0 else alpha * (e^x - 1): dx = dy * (x > 0 ? 1 : y + alpha), i.e.
# dx = dy * (1 + [x <= 0] * (y + alpha - 1)); for alpha = 1 that is dy * exp(min(x, 0)).
# Selu: y = gamma * elu_alpha(x): dx = dy * (x > 0 ? gamma : y + gamma * alpha).
@grad("Elu", "Selu")
def elu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), x, y = dys, node.inputs[0], node.outputs[0]
    alpha = _f32(g.attr(node, "alpha"))
    gamma = _f32(g.attr(node, "gamma")) if node.op_type == "Selu" else 1.0
    if alpha == 1.0 and gamma == 1.0:
        return [g.op("Mul", dy, g.op("Exp", g.op("Min", x, _c(g, 0.0, x))))]
    neg = _mask(g, "LessOrEqual", x, _c(g, 0.0, x), x)
    t = g.op("Mul", neg, g.op("Add", y, _c(g, gamma * alpha - gamma, y)))
    return [g.op("Mul", dy, g.op("Add", t, _c(g, gamma, y)))]


# y = x if x > 0 else alpha * (exp(x / alpha) - 1): dx = dy * exp(min(x, 0) / alpha) (any alpha != 0)
@grad("Celu")
def celu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    alpha = _f32(g.attr(node, "alpha"))
    t = g.op("Min", x, _c(g, 0.0, x))
    if alpha != 1.0:
        t = g.op("Div", t, _c(g, alpha, x))
    return [g.op("Mul", dys[0], g.op("Exp", t))]


# y = 1 / (1 + e^-x): dx = dy * y * (1 - y)
@grad("Sigmoid")
def sigmoid_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y = node.outputs[0]
    return [g.op("Mul", dys[0], g.op("Mul", y, g.op("Sub", _c(g, 1.0, y), y)))]


# y = tanh(x): dx = dy * (1 - y^2)
@grad("Tanh")
def tanh_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y = node.outputs[0]
    return [g.op("Mul", dys[0], g.op("Sub", _c(g, 1.0, y), g.op("Mul", y, y)))]


# y = clip(alpha * x + beta, 0, 1): dx = dy * alpha * [0 < y < 1] (pytorch's open interval)
@grad("HardSigmoid")
def hard_sigmoid_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y = node.outputs[0]
    inside = g.op("And", g.op("Greater", y, _c(g, 0.0, y)), g.op("Less", y, _c(g, 1.0, y)))
    scaled = g.op("Mul", dys[0], _c(g, _f32(g.attr(node, "alpha")), y))
    return [g.op("Mul", scaled, _cast(g, inside, y))]


# y = x * hardsigmoid(x) (alpha = 1/6, beta = 1/2): dx = dy * (hardsigmoid(x) + x / 6 * [|x| < 3])
# (0 below -3, x/3 + 1/2 between, 1 above 3, as pytorch)
@grad("HardSwish")
def hard_swish_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    sixth = _f32(1 / 6)
    hs = g.op("HardSigmoid", x, alpha=sixth, beta=0.5)
    inside = _mask(g, "Less", g.op("Abs", x), _c(g, 3.0, x), x)
    t = g.op("Mul", g.op("Mul", x, _c(g, sixth, x)), inside)
    return [g.op("Mul", dys[0], g.op("Add", hs, t))]


# y = log(1 + e^x): dx = dy * sigmoid(x)
@grad("Softplus")
def softplus_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("Mul", dys[0], g.op("Sigmoid", node.inputs[0]))]


# y = x / (1 + |x|): dx = dy / (1 + |x|)^2 = dy * (1 - |y|)^2
@grad("Softsign")
def softsign_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y = node.outputs[0]
    t = g.op("Sub", _c(g, 1.0, y), g.op("Abs", y))
    return [g.op("Mul", dys[0], g.op("Mul", t, t))]


# y = erf(x): dx = dy * 2 / sqrt(pi) * exp(-x^2)
@grad("Erf")
def erf_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    e = g.op("Exp", g.op("Mul", x, g.op("Neg", x)))
    return [g.op("Mul", dys[0], g.op("Mul", e, _c(g, 2 / math.sqrt(math.pi), x)))]


@grad("Gelu")
def gelu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    approximate = g.attr(node, "approximate")
    if approximate == "none":
        return [g.op("Mul", dys[0], _gelu_erf_slope(g, node.inputs[0]))]
    if approximate == "tanh":
        return [g.op("Mul", dys[0], _gelu_tanh_slope(g, node.inputs[0]))]
    raise UnsupportedError(
        f"{node.label}: Gelu's approximate={approximate!r} has no gradient rule; supported: 'none', 'tanh'"
    )


# y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2: dy/dx = Phi(x) + x * phi(x), phi(x) = exp(-x^2/2)/sqrt(2 pi)
#   = (1 + erf(s) + 2 / sqrt(pi) * s * exp(-s^2)) / 2 with s = x / sqrt 2
def _gelu_erf_slope(g: GradContext, x: str) -> str:
    s = g.op("Mul", x, _c(g, 1 / math.sqrt(2), x))
    e = g.op("Exp", g.op("Mul", s, g.op("Neg", s)))
    t = g.op("Mul", g.op("Mul", s, e), _c(g, 2 / math.sqrt(math.pi), x))
    t = g.op("Add", g.op("Add", g.op("Erf", s), t), _c(g, 1.0, x))
    return g.op("Mul", t, _c(g, 0.5, x))


# y = x * (1 + tanh(u)) / 2, u = c1 * (x + 0.044715 x^3) = x * (c1 + c3 x^2):
# dy/dx = (1 + t + x * (1 - t^2) * (c1 + 3 c3 x^2)) / 2 with t = tanh(u)
def _gelu_tanh_slope(g: GradContext, x: str) -> str:
    c1 = math.sqrt(2 / math.pi)
    c3 = c1 * 0.044715
    x2 = g.op("Mul", x, x)
    t = g.op("Tanh", g.op("Mul", x, g.op("Add", g.op("Mul", x2, _c(g, c3, x)), _c(g, c1, x))))
    du = g.op("Mul", x, g.op("Add", g.op("Mul", x2, _c(g, 3 * c3, x)), _c(g, c1, x)))
    sech2 = g.op("Sub", _c(g, 1.0, x), g.op("Mul", t, t))
    r = g.op("Add", g.op("Add", t, g.op("Mul", du, sech2)), _c(g, 1.0, x))
    return g.op("Mul", r, _c(g, 0.5, x))


# y = x * tanh(softplus(x)): dx = dy * (t + x * (1 - t^2) * sigmoid(x)), t = tanh(softplus(x))
@grad("Mish")
def mish_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    t = g.op("Tanh", g.op("Softplus", x))
    sech2 = g.op("Sub", _c(g, 1.0, x), g.op("Mul", t, t))
    r = g.op("Add", t, g.op("Mul", g.op("Mul", x, g.op("Sigmoid", x)), sech2))
    return [g.op("Mul", dys[0], r)]


# ------------------------------------------------------------------------------------------------ selection


# y = min(max(x, lo), hi): dx = dy * [lo <= x <= hi] (as pytorch, bounds included); [y == x] is exactly that
# mask, whichever bounds are given. lo > hi (y = hi everywhere): no gradient, as pytorch.
@grad("Clip")
def clip_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, bounds = node.inputs[0], list(node.inputs[1:3]) + [""] * (3 - len(node.inputs))
    if any(needs[1:]):
        raise UnsupportedError(
            f"{node.label}: no gradient for Clip's min/max inputs (they depend on a trainable parameter); "
            "make them constants"
        )
    if not any(bounds):
        return [dys[0]]
    lo, hi = (g.const_value(b) if b else None for b in bounds)
    if lo is not None and hi is not None and float(np.reshape(lo, -1)[0]) > float(np.reshape(hi, -1)[0]):
        return [None]
    return [g.op("Mul", dys[0], _mask(g, "Equal", node.outputs[0], x, x))]


# y = c ? a : b: da = dy * [c], db = dy * [not c] = dy - da
@grad("Where")
def where_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), c = dys, node.inputs[0]
    if not needs[1]:
        return [None, None, g.op("Mul", dy, _cast(g, g.op("Not", c), dy))]
    da = g.op("Mul", dy, _cast(g, c, dy))
    return [None, da, g.op("Sub", dy, da) if needs[2] else None]


# y = cast(x): float to float: dx = cast(dy) back to x's dtype; to or from an integer type: no gradient.
@grad("Cast", "CastLike")
def cast_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    if g.dtype(x).kind != "f" or g.dtype(dys[0]).kind != "f":
        return [None]
    return [_cast(g, dys[0], x)]


# Dropout: inference (training_mode absent or false, or ratio 0): y = x, dx = dy. Training: y = x * mask /
# (1 - ratio), dx = dy * mask / (1 - ratio), which needs the node's mask output.
@grad("Dropout")
def dropout_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    if not _const_scalar(g, node, ins[2], "training_mode"):
        return [dys[0]]
    ratio = _const_scalar(g, node, ins[1], "ratio")
    ratio = 0.5 if ratio is None else ratio
    if ratio == 0:
        return [dys[0]]
    if len(node.outputs) < 2 or not node.outputs[1]:
        raise UnsupportedError(
            f"{node.label} runs in training mode but has no mask output, which its gradient needs: "
            "the converter must request the mask output (a second output of the node)"
        )
    dy = dys[0]
    scaled = g.op("Mul", dy, _c(g, 1 / (1 - ratio), dy))
    return [g.op("Mul", scaled, _cast(g, node.outputs[1], dy))]


def _const_scalar(g: GradContext, node: Node, name: str, what: str) -> float | None:
    if not name:
        return None
    v = g.const_value(name)
    if v is None:
        raise UnsupportedError(
            f"{node.label}: input '{what}' ('{name}') is computed at run time; its gradient rule needs a constant"
        )
    return float(np.reshape(v, -1)[0])
