"""Gradient rules of the math family: MatMul, Gemm, softmaxes, reductions, normalisations, CumSum, Einsum."""

from __future__ import annotations

import string

import numpy as np

from edgetrain.core import fastpaths
from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node
from edgetrain.core.kernels.cast import NUMPY_TO_ONNX, onnx_type
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad
from edgetrain.derive.autodiff.rules.transformer import layer_norm_grad_fused

Grads = list[str | None]


def _prod(dims) -> int:
    return int(np.prod(list(dims), dtype=np.int64))


# -------------------------------------------------------------------------------- MatMul, Gemm


def _gemm(g: GradContext, a: str, b: str, ta: bool, tb: bool, alpha: float = 1.0) -> str:
    """alpha * a'@b' for matrices (a' = a^T when ta): Gemm's flags make the transposes free (numpy views)."""
    attrs = {k: v for k, v in (("transA", int(ta)), ("transB", int(tb))) if v}
    if alpha != 1:
        attrs["alpha"] = alpha
    return g.op("Gemm", a, b, **attrs)


def _mm(g: GradContext, a: str, b: str, *, ta: bool = False, tb: bool = False) -> str:
    """a'@b' with a' = a transposed in its last two axes when ta (b' likewise), batches broadcasting."""
    if len(g.shape(a)) == 2 and len(g.shape(b)) == 2:
        return _gemm(g, a, b, ta, tb)

    def t(x: str) -> str:
        r = len(g.shape(x))
        return g.op("Transpose", x, perm=list(range(r - 2)) + [r - 1, r - 2]) if r > 1 else x

    return g.op("MatMul", t(a) if ta else a, t(b) if tb else b)


def _rows(g: GradContext, x: str) -> str:
    """x as a matrix: its leading axes flattened into rows."""
    s = g.shape(x)
    return g.reshape(x, (_prod(s[:-1]), s[-1]))


# y = a @ b, batches broadcasting (the driver sums da, db over broadcast batches): da = dy @ b^T, db = a^T @ dy.
# A 1-D a is the row (1, K) and a 1-D b the column (K, 1), their unit axis dropped from y and from the gradient;
# 1-D by 1-D is the dot product: da = dy * b, db = dy * a. With a matrix (or 1-D) b and a batched a, the batch
# folds into the rows of one Gemm (no per-batch db to sum afterwards).
@grad("MatMul")
def matmul_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    a, b = node.inputs
    dy = dys[0]
    sa, sb, sy = g.shape(a), g.shape(b), g.shape(dy)
    if len(sa) == 1 and len(sb) == 1:
        return [g.op("Mul", dy, b) if needs[0] else None, g.op("Mul", dy, a) if needs[1] else None]
    pa = g.reshape(a, (1,) + sa) if len(sa) == 1 else a
    pb = g.reshape(b, sb + (1,)) if len(sb) == 1 else b
    py = sy[:-1] + (1,) + sy[-1:] if len(sa) == 1 else sy + (1,) if len(sb) == 1 else sy
    pdy = g.reshape(dy, py)
    folds = len(g.shape(pb)) == 2 and len(py) > 2  # matrix (or 1-D) b, batched a: batch folded into rows
    da = db = None
    if needs[0]:
        if folds:
            da = g.reshape(_gemm(g, _rows(g, pdy), pb, False, True), py[:-1] + (sb[0],))
        else:
            da = _mm(g, pdy, pb, tb=True)
        if len(sa) == 1:
            da = g.reshape(da, g.shape(da)[:-2] + sa)
    if needs[1]:
        db = _gemm(g, _rows(g, pa), _rows(g, pdy), True, False) if folds else _mm(g, pa, pdy, ta=True)
        if len(sb) == 1:
            db = g.reshape(db, g.shape(db)[:-1])
    return [da, db]


# y = alpha * A' @ B' + beta * C, A' = A^T when transA (B' likewise):
#   dA' = alpha * dy @ B'^T, dB' = alpha * A'^T @ dy (transposed back for a transposed input: dA = alpha * B' @ dy^T,
#   dB = alpha * dy^T @ A'), dC = beta * dy summed to C's shape (beta = 0: C is unused, no gradient)
@grad("Gemm")
def gemm_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    a, b = node.inputs[:2]
    dy = dys[0]
    alpha, beta = float(g.attr(node, "alpha")), float(g.attr(node, "beta"))
    ta, tb = bool(g.attr(node, "transA")), bool(g.attr(node, "transB"))
    out: Grads = [None, None, None]
    if needs[0]:
        out[0] = _gemm(g, b, dy, tb, True, alpha) if ta else _gemm(g, dy, b, False, not tb, alpha)
    if needs[1]:
        out[1] = _gemm(g, dy, a, True, ta, alpha) if tb else _gemm(g, a, dy, not ta, False, alpha)
    if len(needs) > 2 and needs[2] and beta != 0:
        dc = g.sum_to(dy, g.shape(node.inputs[2]))  # sum first: the scaling then touches C's size only
        out[2] = dc if beta == 1 else g.op("Mul", dc, g.scalar_like(beta, dc))
    return out[: len(node.inputs)]


# -------------------------------------------------------------------------------- Softmax family


# y = softmax(x) along axis: dx = y * (dy - sum(dy * y, axis))
@grad("Softmax")
def softmax_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y, dy = node.outputs[0], dys[0]
    s = g.op("ReduceSum", g.op("Mul", dy, y), g.ints([g.attr(node, "axis")]), keepdims=1)
    return [g.op("Mul", y, g.op("Sub", dy, s))]


# y = x - log(sum(exp(x), axis)): dx = dy - exp(y) * sum(dy, axis)   (exp(y) is softmax(x), never overflows)
@grad("LogSoftmax")
def log_softmax_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    y, dy = node.outputs[0], dys[0]
    s = g.op("ReduceSum", dy, g.ints([g.attr(node, "axis")]), keepdims=1)
    return [g.op("Sub", dy, g.op("Mul", g.op("Exp", y), s))]


# the fused softmax cross-entropy (losses.CrossEntropyLoss on [n, c] logits): d x = dloss * (softmax(x) - w) / N
# with w the (smoothed) one-hot target and N the rows counted; in one fused op
@grad("SoftmaxCrossEntropy")
def softmax_cross_entropy_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, target = node.inputs
    return [g.private("SoftmaxCrossEntropyGrad", x, target, dys[0], **node.attrs), None]


@body("SoftmaxCrossEntropy")
def _softmax_cross_entropy_body(g: GradContext, node: Node) -> list[str]:
    x, target = node.inputs
    a = node.attrs
    logp = g.op("LogSoftmax", x, axis=1)
    return [
        cross_entropy_graph(
            g, logp, target, a.get("reduction", "mean"), a.get("label_smoothing", 0.0), a.get("ignore_index")
        )
    ]


@body("SoftmaxCrossEntropyGrad")
def _softmax_cross_entropy_grad_body(g: GradContext, node: Node) -> list[str]:
    x, target, dloss = node.inputs
    a = node.attrs
    n, c = g.shape(x)
    dtype = g.dtype(x)
    w = g.op("OneHot", target, g.const(np.asarray(c, np.int64)), g.const(np.asarray([0, 1], dtype)), axis=1)
    eps = a.get("label_smoothing", 0.0)
    if eps:
        w = g.op("Add", g.op("Mul", w, g.scalar_like(1.0 - eps, x)), g.scalar_like(eps / c, x))
    d = g.op("Sub", g.op("Softmax", x, axis=1), w)
    count = g.scalar_like(float(n), x)
    if a.get("ignore_index") is not None:
        keep = g.op(
            "Cast",
            g.op("Not", g.op("Equal", target, g.const(np.asarray(a["ignore_index"], np.int64)))),
            to=int(NUMPY_TO_ONNX[np.dtype(dtype)]),
        )
        d = g.op("Mul", d, g.op("Unsqueeze", keep, g.ints([1])))
        count = g.op("ReduceSum", keep, keepdims=0)
    scale = dloss if a.get("reduction", "mean") == "sum" else g.op("Div", dloss, count)
    return [g.op("Mul", d, scale)]


# -------------------------------------------------------------------------------- reductions


def _reduction(g: GradContext, node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the axes a Reduce* node reduces, non-negative and sorted: () when it is a no-op, the shape of its output
    with keepdims=1)."""
    shape = g.shape(node.inputs[0])
    name = node.inputs[1] if len(node.inputs) > 1 else ""
    axes = None
    if name:
        axes = g.const_value(name)
        if axes is None:
            raise UnsupportedError(
                f"{node.label}: its axes input '{name}' is computed at run time; its gradient needs "
                "constant axes (an initializer)"
            )
    if axes is None or np.size(axes) == 0:
        ax = () if g.attr(node, "noop_with_empty_axes") else tuple(range(len(shape)))
    else:
        ax = tuple(sorted(int(a) % len(shape) for a in np.asarray(axes).reshape(-1)))
    return ax, tuple(1 if k in ax else d for k, d in enumerate(shape))


def _kept(g: GradContext, node: Node, v: str) -> str:
    """An output-shaped value of a Reduce* node (dy, or y itself) in the keepdims=1 shape, to broadcast."""
    return g.reshape(v, _reduction(g, node)[1])


# y = sum(x, axes): dx = dy broadcast back over the reduced axes; y = mean(x, axes): the same divided by n, the
# number of elements reduced into each y. A no-op node (empty axes, noop_with_empty_axes=1) passes dy through.
@grad("ReduceSum", "ReduceMean")
def reduce_sum_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, dy = node.inputs[0], dys[0]
    ax, keep = _reduction(g, node)
    if not ax:
        return [dy]
    d = g.reshape(dy, keep)
    if node.op_type == "ReduceMean":  # scaled at the reduced size, before the broadcast
        d = g.op("Div", d, g.scalar_like(max(_prod(g.shape(x)[a] for a in ax), 1), d))
    return [g.op("Expand", d, g.ints(g.shape(x), hint="shape"))]


# y = sum(x^2, axes): dx = x * (2 * dy)   (2 * dy at the reduced size; no-op form: y = x^2, the same formula)
@grad("ReduceSumSquare")
def reduce_sum_square_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, dy = node.inputs[0], dys[0]
    return [g.op("Mul", x, _kept(g, node, g.op("Mul", dy, g.scalar_like(2.0, dy))))]


# y = sqrt(sum(x^2, axes)): dx = x * (dy / y). y = 0 only where the whole slice of x is 0, where the gradient is
# taken as 0 (pytorch's choice): y is floored at the smallest normal number, so 0 * finite instead of 0 / 0.
# The no-op form y = |x| is covered too (dx = sign(x) * dy).
@grad("ReduceL2")
def reduce_l2_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, y, dy = node.inputs[0], node.outputs[0], dys[0]
    tiny = g.scalar_like(float(np.finfo(g.dtype(y)).tiny), y, hint="tiny")
    return [g.op("Mul", x, _kept(g, node, g.op("Div", dy, g.op("Max", y, tiny))))]


# y = log(sum(exp(x), axes)): dx = dy * exp(x - y), the softmax of x over the axes (x - y <= 0: no overflow)
@grad("ReduceLogSumExp")
def reduce_log_sum_exp_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, y, dy = node.inputs[0], node.outputs[0], dys[0]
    if not _reduction(g, node)[0]:
        return [dy]
    p = g.op("Exp", g.op("Sub", x, _kept(g, node, y)))
    return [g.op("Mul", p, _kept(g, node, dy))]


# y = sum(|x|, axes): dx = sign(x) * dy (0 at x = 0, as Abs's rule; the no-op form y = |x| is the same formula)
@grad("ReduceL1")
def reduce_l1_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, dy = node.inputs[0], dys[0]
    return [g.op("Mul", g.op("Sign", x), _kept(g, node, dy))]


# y = log(sum(x, axes)): dx = dy / sum(x, axes), broadcast back (no-op form: y = log(x), dx = dy / x)
@grad("ReduceLogSum")
def reduce_log_sum_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, dy = node.inputs[0], dys[0]
    ax, _ = _reduction(g, node)
    if not ax:
        return [g.op("Div", dy, x)]
    total = g.op("ReduceSum", x, g.ints(ax), keepdims=1)
    return [g.op("Expand", g.op("Div", _kept(g, node, dy), total), g.ints(g.shape(x), hint="shape"))]


# y = prod(x, axes): dx_i = dy * (the product of the other elements of its slice), exact where x has zeros:
#   no zero in the slice: prod(x) / x_i;  one zero: that element gets the product of the rest, the others 0;
#   two or more zeros: 0 everywhere.  (Zeros are replaced by 1 in the product, and counted.)
@grad("ReduceProd")
def reduce_prod_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, dy = node.inputs[0], dys[0]
    ax, _ = _reduction(g, node)
    if not ax:
        return [dy]
    zero_x, one = g.scalar_like(0.0, x), g.scalar_like(1.0, x)
    is_zero = g.op("Equal", x, zero_x)
    nonzero = g.op("Where", is_zero, one, x)
    p = g.op("ReduceProd", nonzero, g.ints(ax), keepdims=1)  # the product of the nonzero elements
    zeros = g.op("ReduceSum", g.op("Cast", is_zero, to=NUMPY_TO_ONNX[g.dtype(x)]), g.ints(ax), keepdims=1)
    at_zero = g.op("Where", g.op("Equal", zeros, one), p, zero_x)
    elsewhere = g.op("Where", g.op("Equal", zeros, zero_x), g.op("Div", p, nonzero), zero_x)
    others = g.op("Where", is_zero, at_zero, elsewhere)
    return [g.op("Mul", others, _kept(g, node, dy))]


# y = max(x, axes) (or min): dy goes to the elements equal to y; ties share it equally, as pytorch's amax/amin:
#   dx = [x == y] * dy / count(x == y)
@grad("ReduceMax", "ReduceMin")
def reduce_max_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, y, dy = node.inputs[0], node.outputs[0], dys[0]
    ax, _ = _reduction(g, node)
    if not ax:
        return [dy]
    hit = g.op("Cast", g.op("Equal", x, _kept(g, node, y)), to=NUMPY_TO_ONNX[g.dtype(x)])
    count = g.op("ReduceSum", hit, g.ints(ax), keepdims=1)
    return [g.op("Mul", hit, g.op("Div", _kept(g, node, dy), count))]


# -------------------------------------------------------------------------------- normalisations


def _as(g: GradContext, v: str, like: str) -> str:
    """v in like's dtype (parameters and statistics may have another float type than the data)."""
    return v if g.dtype(v) == g.dtype(like) else g.op("Cast", v, to=NUMPY_TO_ONNX[g.dtype(like)])


def _per_channel(g: GradContext, p: str, rank: int) -> str:
    """A (C,) parameter as (C, 1, ...), to broadcast against an (N, C, ...) tensor."""
    return g.reshape(p, g.shape(p) + (1,) * (rank - 2))


def _channel_sum(g: GradContext, t: str, like: str) -> str:
    """t summed over every axis but 1, as a (C,) tensor of like's dtype: the gradient of a per-channel parameter."""
    r = len(g.shape(t))
    return _as(g, g.op("ReduceSum", t, g.ints([0] + list(range(2, r))), keepdims=0), like)


def _mean(g: GradContext, t: str, axes: tuple[int, ...]) -> str:
    """mean(t, axes) kept as size-1 axes; no axes: t itself (rank-2 InstanceNormalization has no spatial axes)."""
    if not axes:
        return t
    return g.op("ReduceMean", t, g.ints(axes), keepdims=1)


def _centred(g: GradContext, x: str, axes: tuple[int, ...], eps: float) -> tuple[str, str]:
    """d = x - mean(x) and istd = 1 / sqrt(mean(d^2) + eps) over axes, as the forward computes them."""
    d = g.op("Sub", x, _mean(g, x, axes))
    var = _mean(g, g.op("Mul", d, d), axes)
    return d, g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.scalar_like(eps, x))))


def _normalised_dx(
    g: GradContext, d: str, istd: str, axes: tuple[int, ...], dxhat: str | None, c1=None, c2=None
) -> str:
    """dx for xhat = d * istd (d = x - mean(x), istd = 1 / sqrt(mean(d^2) + eps) over axes), given dxhat:
        dx = istd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
           = istd * dxhat - d * (istd^3 * mean(dxhat * d)) - istd * mean(dxhat)
    c1, c2 (at the statistics' size): terms from gradients into the statistics themselves, dx -= c1 + d * c2."""
    k1, k2, dx = c1, c2, None
    if dxhat is not None:
        i3 = g.op("Mul", istd, g.op("Mul", istd, istd))
        m1 = g.op("Mul", istd, _mean(g, dxhat, axes))
        m2 = g.op("Mul", i3, _mean(g, g.op("Mul", dxhat, d), axes))
        k1 = m1 if c1 is None else g.op("Add", m1, c1)
        k2 = m2 if c2 is None else g.op("Add", m2, c2)
        dx = g.op("Mul", dxhat, istd)
    t = None if k2 is None else g.op("Mul", d, k2)
    t = k1 if t is None else t if k1 is None else g.op("Add", t, k1)
    if dx is not None:
        return g.op("Sub", dx, t)
    t = g.op("Neg", t)  # no dxhat: the statistics' gradients alone, spread over the elements if only c1
    return t if g.shape(t) == g.shape(d) else g.op("Expand", t, g.ints(g.shape(d), hint="shape"))


# BatchNormalization, inference (training_mode=0): y = (x - mean) * a + B, a = scale * istd, istd = 1/sqrt(var + eps)
# with the running mean and var (constants, usually; their gradients too if asked). Sums over every axis but 1:
#   dx = dy * a; dB = sum(dy); dscale = istd * sum(dy * (x - mean));
#   dmean = -a * sum(dy); dvar = -scale/2 * istd^3 * sum(dy * (x - mean))
# training_mode=1: see _batch_norm_training_grad.
@grad("BatchNormalization")
def batch_norm_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    if g.attr(node, "training_mode"):
        return _batch_norm_training_grad(g, node, dys, needs)
    x, scale, _, mean, var = node.inputs
    dy, r = dys[0], len(g.shape(x))
    istd = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.scalar_like(g.attr(node, "epsilon"), var))))
    istd = _as(g, istd, scale)
    a = g.op("Mul", scale, istd)
    out: Grads = [None] * 5
    if needs[0]:
        out[0] = g.op("Mul", dy, _as(g, _per_channel(g, a, r), x))
    if needs[2] or needs[3]:
        sdy = _channel_sum(g, dy, scale)
        out[2] = sdy if needs[2] else None
        out[3] = _as(g, g.op("Neg", g.op("Mul", sdy, a)), mean) if needs[3] else None
    if needs[1] or needs[4]:
        sdd = _channel_sum(g, g.op("Mul", dy, g.op("Sub", x, _as(g, _per_channel(g, mean, r), x))), scale)
        out[1] = g.op("Mul", sdd, istd) if needs[1] else None
        if needs[4]:
            k = g.op("Mul", g.op("Mul", a, g.op("Mul", istd, istd)), g.scalar_like(-0.5, a))
            out[4] = _as(g, g.op("Mul", sdd, k), var)
    return out[: len(node.inputs)]


# BatchNormalization, training (training_mode=1): y = xhat * scale + B, xhat = (x - mean) * istd with the batch's
# mean and (biased) var over every axis but 1, n elements per channel:
#   dx as _normalised_dx with dxhat = dy * scale; dscale = sum(dy * xhat); dB = sum(dy).
#   running_mean = m * input_mean + (1 - m) * mean: dinput_mean = m * drm, dx += (1 - m) * drm / n;
#   running_var = m * input_var + (1 - m) * var: dinput_var = m * drv, dx += (1 - m) * drv * 2 (x - mean) / n
def _batch_norm_training_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, scale = node.inputs[:2]
    shape, m = g.shape(x), float(g.attr(node, "momentum"))
    r, axes = len(shape), (0,) + tuple(range(2, len(shape)))
    n = max(_prod(shape[a] for a in axes), 1)
    dy, drm, drv = (list(dys) + [None, None])[:3]
    d, istd = _centred(g, x, axes, g.attr(node, "epsilon"))

    def stat_term(ds: str | None, k: float) -> str | None:
        return None if ds is None else _as(g, _per_channel(g, g.op("Mul", ds, g.scalar_like(k, ds)), r), x)

    out: Grads = [None] * 5
    if needs[0]:
        dxhat = None if dy is None else g.op("Mul", dy, _as(g, _per_channel(g, scale, r), x))
        c1, c2 = stat_term(drm, -(1 - m) / n), stat_term(drv, -2 * (1 - m) / n)
        out[0] = _normalised_dx(g, d, istd, axes, dxhat, c1, c2)
    if dy is not None:
        out[1] = _channel_sum(g, g.op("Mul", dy, g.op("Mul", d, istd)), scale) if needs[1] else None
        out[2] = _channel_sum(g, dy, scale) if needs[2] else None
    for k, ds in ((3, drm), (4, drv)):
        if needs[k] and ds is not None:
            out[k] = _as(g, g.op("Mul", ds, g.scalar_like(m, ds)), node.inputs[k])
    return out[: len(node.inputs)]


# y = xhat * scale + B, xhat = (x - mean) * istd over the axes from axis on (n elements per row; Scale and B
# broadcast over those axes): dB = dy, dscale = dy * xhat (the driver sums both over the rows),
# dx as _normalised_dx with dxhat = dy * scale. The optional Mean and InvStdDev outputs (float32) are reused
# when x is float32, and their own gradients add dx += dMean / n - dInvStdDev * istd^3 * (x - mean) / n.
@grad("LayerNormalization")
def layer_norm_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    if fastpaths.enabled("layernorm"):  # one fused LayerNormGrad where the forward kept its statistics
        fused = layer_norm_grad_fused(g, node, dys, needs)
        if fused is not None:
            return fused
    x, scale = node.inputs[:2]
    shape = g.shape(x)
    axis = int(g.attr(node, "axis")) % len(shape)
    axes, n = tuple(range(axis, len(shape))), max(_prod(shape[axis:]), 1)
    _, mean, istd = (list(node.outputs) + ["", ""])[:3]
    if mean and istd and g.dtype(mean) == g.dtype(x):
        d = g.op("Sub", x, mean)
    else:
        d, istd = _centred(g, x, axes, g.attr(node, "epsilon"))
    dy, dmean, distd = (list(dys) + [None, None])[:3]
    out: Grads = [None] * 3
    if needs[0]:
        c1 = None if dmean is None else g.op("Div", _as(g, dmean, x), g.scalar_like(-n, x))
        c2 = None
        if distd is not None:
            i3 = g.op("Mul", istd, g.op("Mul", istd, istd))
            c2 = g.op("Mul", g.op("Div", _as(g, distd, x), g.scalar_like(n, x)), i3)
        dxhat = None if dy is None else g.op("Mul", dy, _as(g, scale, x))
        out[0] = _normalised_dx(g, d, istd, axes, dxhat, c1, c2)
    if dy is not None:
        out[1] = _as(g, g.op("Mul", dy, g.op("Mul", d, istd)), scale) if needs[1] else None
        out[2] = _as(g, dy, node.inputs[2]) if len(needs) > 2 and needs[2] else None
    return out[: len(node.inputs)]


# y = scale_c * xhat + B_c, xhat = (x - mean) * istd over the spatial axes of each (n, c):
#   dx as _normalised_dx with dxhat = dy * scale; dscale = sum(dy * xhat), dB = sum(dy) over every axis but 1
@grad("InstanceNormalization")
def instance_norm_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, scale = node.inputs[:2]
    dy, r = dys[0], len(g.shape(x))
    axes = tuple(range(2, r))
    d, istd = _centred(g, x, axes, g.attr(node, "epsilon"))
    out: Grads = [None] * 3
    if needs[0]:
        dxhat = g.op("Mul", dy, _as(g, _per_channel(g, scale, r), x))
        out[0] = _normalised_dx(g, d, istd, axes, dxhat)
    if needs[1]:
        out[1] = _channel_sum(g, g.op("Mul", dy, g.op("Mul", d, istd)), scale)
    if needs[2]:
        out[2] = _channel_sum(g, dy, node.inputs[2])
    return out[: len(node.inputs)]


# y = scale_c * xhat + bias_c, xhat = (x - mean) * istd over each group of channels (with the spatial axes) of
# each sample: on the (N, G, C/G * spatial) view, dx as _normalised_dx over its last axis with dxhat = dy * scale;
# dscale = sum(dy * xhat), dbias = sum(dy) over every axis but 1
@grad("GroupNormalization")
def group_norm_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, scale = node.inputs[:2]
    dy, shape = dys[0], g.shape(x)
    groups = int(g.attr(node, "num_groups"))
    view = (shape[0], groups, _prod(shape[1:]) // groups)
    d, istd = _centred(g, g.reshape(x, view), (2,), g.attr(node, "epsilon"))
    out: Grads = [None] * 3
    if needs[0]:
        dxhat = g.reshape(g.op("Mul", dy, _as(g, _per_channel(g, scale, len(shape)), x)), view)
        out[0] = g.reshape(_normalised_dx(g, d, istd, (2,), dxhat), shape)
    if needs[1]:
        out[1] = _channel_sum(g, g.op("Mul", dy, g.reshape(g.op("Mul", d, istd), shape)), scale)
    if needs[2]:
        out[2] = _channel_sum(g, dy, node.inputs[2])
    return out[: len(node.inputs)]


# -------------------------------------------------------------------------------- CumSum, Einsum


# y = cumsum(x, axis) (exclusive: y_i sums x_j for j < i; reverse: from the end): each x_j reaches the y_i on
# the other side of it, so dx = cumsum(dy, axis) in the opposite direction, exclusive alike
@grad("CumSum")
def cumsum_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    attrs = {"reverse": 0 if g.attr(node, "reverse") else 1}
    if g.attr(node, "exclusive"):
        attrs["exclusive"] = 1
    return [g.op("CumSum", dys[0], node.inputs[1], **attrs)]


def _einsum_terms(node: Node, ranks: list[int]) -> tuple[list[str], str]:
    """The subscripts of each input and of the output of an Einsum node, with '...' spelled out as letters
    and an implicit output (no '->': the letters used once, sorted, after the ellipsis) made explicit."""
    eq = str(node.attrs["equation"]).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    free = [c for c in string.ascii_lowercase + string.ascii_uppercase if c not in eq]
    width = [r - len(t.replace("...", "")) for t, r in zip(ins, ranks)]
    n_ell = max([w for t, w in zip(ins, width) if "..." in t], default=0)
    ell = "".join(free[:n_ell])
    terms = [t.replace("...", ell[n_ell - w :]) for t, w in zip(ins, width)]
    if arrow:
        return terms, rhs.replace("...", ell)
    letters = lhs.replace("...", "").replace(",", "")
    return terms, ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))


# y = einsum(x_1, ..., x_n): dx_k = einsum(dy, x_j for j != k -> x_k's subscripts). Letters of x_k found
# nowhere else were summed away in x_k alone: dx_k is constant along them (a broadcast back). A letter repeated
# within x_k (a diagonal, 'ii') reads only the diagonal: each repeat becomes a new letter tied to the first by an
# identity matrix operand ('ik' with eye 'ik'), so dx_k is zero off the diagonal.
@grad("Einsum")
def einsum_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    xs, dy = list(node.inputs), dys[0]
    terms, out_term = _einsum_terms(node, [len(g.shape(x)) for x in xs])
    free = [c for c in string.ascii_lowercase + string.ascii_uppercase if c not in "".join(terms) + out_term]
    dxs: Grads = [None] * len(xs)
    for k, (x, term) in enumerate(zip(xs, terms)):
        if not needs[k]:
            continue
        others = [out_term] + [t for j, t in enumerate(terms) if j != k]
        operands = [dy] + [v for j, v in enumerate(xs) if j != k]
        distinct, fresh = "", iter(free)
        for c, n in zip(term, g.shape(x)):
            if c in distinct:
                distinct += next(fresh)
                others.append(c + distinct[-1])
                operands.append(g.const(np.eye(n, dtype=g.dtype(x)), hint="eye"))
            else:
                distinct += c
        present = set("".join(others))
        kept = "".join(c for c in distinct if c in present)
        dx = g.op("Einsum", *operands, equation=f"{','.join(others)}->{kept}")
        if kept != distinct:
            sizes = dict(zip(kept, g.shape(dx)))
            dx = g.reshape(dx, tuple(sizes.get(c, 1) for c in distinct))
            dx = g.op("Expand", dx, g.ints(g.shape(x), hint="shape"))
        dxs[k] = dx
    return dxs


def cross_entropy_graph(
    g: GradContext, logp: str, target: str, reduction: str, label_smoothing: float, ignore_index: int | None
) -> str:
    """Cross-entropy in standard ops, from log-probabilities [n, c, ...] and class labels [n, ...]: the fused
    SoftmaxCrossEntropy's ONNX function body, and the loss itself for per-position classes."""
    n_classes, dtype = g.shape(logp)[1], g.dtype(logp)
    onehot = g.op(
        "OneHot",
        target,
        g.const(np.asarray(n_classes, np.int64), hint="n_classes"),
        g.const(np.asarray([0, 1], dtype), hint="onehot_values"),
        axis=1,
    )
    if label_smoothing:
        onehot = g.op(
            "Add",
            g.op("Mul", onehot, g.scalar_like(1.0 - label_smoothing, logp)),
            g.scalar_like(label_smoothing / n_classes, logp),
        )
    nll = g.op("Neg", g.op("ReduceSum", g.op("Mul", onehot, logp), g.ints([1]), keepdims=0))
    if ignore_index is None:
        return g.op("ReduceMean" if reduction == "mean" else "ReduceSum", nll, keepdims=0, name="loss")
    keep = g.op(
        "Cast",
        g.op("Not", g.op("Equal", target, g.const(np.asarray(ignore_index, np.int64)))),
        to=onnx_type(dtype),
    )
    total = g.op("ReduceSum", g.op("Mul", nll, keep), keepdims=0)
    if reduction == "sum":
        return g.op("Identity", total, name="loss")
    return g.op("Div", total, g.op("ReduceSum", keep, keepdims=0), name="loss")
