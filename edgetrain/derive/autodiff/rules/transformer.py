"""Gradient rules of the fused transformer ops edgetrain.graph.fuse writes into a training step (GeluTraining,
SoftmaxAttention), LayerNormalization's fused backward (LayerNormGrad), and the standard-op bodies of all five, so the
emitted training step stays standard ONNX."""

from __future__ import annotations

import math

from edgetrain.core.ir import Node
from edgetrain.core.kernels.cast import NUMPY_TO_ONNX
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad

Grads = list[str | None]


def _c(g: GradContext, value: float, like: str) -> str:
    return g.scalar_like(value, like, hint="c")


def _swap_last(g: GradContext, x: str) -> str:
    r = len(g.shape(x))
    return g.op("Transpose", x, perm=list(range(r - 2)) + [r - 1, r - 2])


# ---------------------------------------------------------------------------------------------------- GELU
# (y, cdf) = (x * Phi(x), Phi(x)), Phi(x) = (1 + erf(x / sqrt 2)) / 2: dx = dy * (Phi(x) + x * phi(x)),
# phi(x) = exp(-x^2 / 2) / sqrt(2 pi): the fused GeluGrad reads Phi from the forward instead of computing erf again,
# and x = y / Phi(x) (0 where Phi underflows to 0): x need not be kept for the backward.
# CDF exists for the backward alone (edgetrain.graph.fuse): nothing else reads it, so it has no gradient of its own.
@grad("GeluTraining")
def gelu_training_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    assert dys[1] is None, f"{node.label}: its CDF output is read by the backward alone"
    return [g.private("GeluGrad", dys[0], node.outputs[0], node.outputs[1])]


@body("GeluTraining")
def _gelu_training_body(g: GradContext, node: Node) -> list[str]:
    x = node.inputs[0]
    e = g.op("Erf", g.op("Mul", x, _c(g, 1 / math.sqrt(2), x)))
    cdf = g.op("Mul", g.op("Add", e, _c(g, 1.0, x)), _c(g, 0.5, x))
    return [g.op("Mul", cdf, x), cdf]


@body("GeluGrad")
def _gelu_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, y, cdf = node.inputs
    zero = g.op("Cast", g.op("Equal", cdf, _c(g, 0.0, cdf)), to=NUMPY_TO_ONNX[g.dtype(cdf)])
    x = g.op("Div", y, g.op("Add", cdf, zero))
    pdf = g.op("Exp", g.op("Mul", g.op("Mul", x, x), _c(g, -0.5, x)))
    slope = g.op("Add", cdf, g.op("Mul", g.op("Mul", x, pdf), _c(g, 1 / math.sqrt(2 * math.pi), x)))
    return [g.op("Mul", dy, slope)]


# ----------------------------------------------------------------------------------------------- LayerNorm
def layer_norm_grad_fused(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads | None:
    """LayerNormalization's backward as one LayerNormGrad node, when the forward keeps its float32 Mean and
    InvStdDev for it (edgetrain.graph.fuse adds them) and nothing else reads them; None otherwise (the plain
    rule then builds it in standard ops). The math is the plain rule's (rules/math.py)."""
    outs = list(node.outputs) + ["", ""]
    x, dy = node.inputs[0], dys[0]
    mean, istd = outs[1], outs[2]
    if not (mean and istd) or dy is None or any(d is not None for d in dys[1:]):
        return None
    if str(g.dtype(x)) != "float32" or g.dtype(mean) != g.dtype(x) or g.shape(dy) != g.shape(x):
        return None
    want = 3 if len(needs) > 2 and needs[2] else 2 if needs[1] else 1
    axis = int(g.attr(node, "axis")) % len(g.shape(x))
    res = g.private("LayerNormGrad", dy, x, node.inputs[1], mean, istd, n=want, axis=axis)
    res = res if want > 1 else [res]
    return [r if need else None for r, need in zip(res, needs)] + [None] * (len(node.inputs) - want)


@body("LayerNormGrad")
def _layer_norm_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, x, scale, mean, istd = node.inputs
    r = len(g.shape(x))
    axis = int(g.attr(node, "axis")) % r
    inner, rows = g.ints(list(range(axis, r))), g.ints(list(range(axis)))
    xhat = g.op("Mul", g.op("Sub", x, mean), istd)
    gs = g.op("Mul", dy, scale)
    a = g.op("ReduceMean", gs, inner, keepdims=1)
    b = g.op("ReduceMean", g.op("Mul", gs, xhat), inner, keepdims=1)
    dx = g.op("Mul", g.op("Sub", g.op("Sub", gs, a), g.op("Mul", xhat, b)), istd)
    out = [dx]
    if len(node.outputs) > 1:
        out.append(
            g.op("ReduceSum", g.op("Mul", dy, xhat), rows, keepdims=0) if axis else g.op("Mul", dy, xhat)
        )
    if len(node.outputs) > 2:
        out.append(g.op("ReduceSum", dy, rows, keepdims=0) if axis else g.op("Identity", dy))
    return out


# ----------------------------------------------------------------------------------------------- attention
# (y, p) = (P V, P), P = softmax(Z) over the last axis, Z = Q K^T * scale + mask:
#   dP = dY V^T, dZ = P * (dP - sum(dP * P)), dmask = dZ, dQ = dZ * scale K, dK^T = Q^T dZ * scale, dV = P^T dY.
# P exists for the backward alone (edgetrain.graph.fuse): nothing else reads it, so it has no gradient of its own.
@grad("SoftmaxAttention")
def attention_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    assert len(dys) < 2 or dys[1] is None, f"{node.label}: its P output is read by the backward alone"
    q, kt, v = node.inputs[:3]
    n = 4 if len(needs) > 3 and needs[3] else 3
    outs = g.private(
        "SoftmaxAttentionGrad", dys[0], q, kt, v, node.outputs[1], n=n, scale=g.attr(node, "scale")
    )
    return [o if need else None for o, need in zip(outs, needs)]


@body("SoftmaxAttention")
def _attention_body(g: GradContext, node: Node) -> list[str]:
    q, kt, v = node.inputs[:3]
    z = g.op("MatMul", q, kt)
    scale = float(g.attr(node, "scale"))
    if scale != 1.0:
        z = g.op("Mul", z, _c(g, scale, z))
    if len(node.inputs) > 3 and node.inputs[3]:
        z = g.op("Add", z, node.inputs[3])
    p = g.op("Softmax", z, axis=-1)
    return [g.op("MatMul", p, v), p]


@body("SoftmaxAttentionGrad")
def _attention_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, q, kt, v, p = node.inputs
    dp = g.op("MatMul", dy, _swap_last(g, v))
    dz = g.op("Mul", p, g.op("Sub", dp, g.op("ReduceSum", g.op("Mul", dp, p), g.ints([-1]), keepdims=1)))
    scale = float(g.attr(node, "scale"))
    ds = g.op("Mul", dz, _c(g, scale, dz)) if scale != 1.0 else dz
    out = [g.op("MatMul", ds, _swap_last(g, kt)), g.op("MatMul", _swap_last(g, q), ds)]
    out.append(g.op("MatMul", _swap_last(g, p), dy))
    return out + [dz][: len(node.outputs) - 3]
