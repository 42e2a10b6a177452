"""Gradient rules of quantization-aware training: FakeQuantize (QuantizeLinear -> DequantizeLinear as one op) has
the straight-through estimator with clipping, as PyTorch's fake_quantize_per_tensor_affine / per_channel_affine:
the gradient passes where the value lies on the integer grid's range and is 0 where the quantization saturates.
Scales and zero points are fixed: no gradient reaches them (a dynamic scale, computed from the data, is treated as a
constant, as onnxruntime's dynamic quantization has it)."""

from __future__ import annotations

import numpy as np

from edgetrain.core.ir import Node
from edgetrain.core.kernels.cast import NUMPY_TO_ONNX
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad

Grads = list[str | None]


def _axis(g: GradContext, node: Node) -> int:
    return int(node.attrs.get("axis", 1))


def _range(node: Node) -> dict:
    """The qmin/qmax attributes of a FakeQuantize that has them (a narrower integer range than its type's)."""
    return {k: int(node.attrs[k]) for k in ("qmin", "qmax") if node.attrs.get(k) is not None}


@grad("FakeQuantize")
def fake_quantize_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, scale, zero_point = node.inputs[:3]
    dx = g.private("FakeQuantizeGrad", dys[0], x, scale, zero_point, axis=_axis(g, node), **_range(node))
    return [dx, None, None]


@body("FakeQuantize")
def _fake_quantize_body(g: GradContext, node: Node) -> list[str]:
    x, scale, zero_point = node.inputs[:3]
    axis = _axis(g, node)
    q = g.op("QuantizeLinear", x, scale, zero_point, axis=axis)
    y = g.op("DequantizeLinear", q, scale, zero_point, axis=axis)
    narrow = _range(node)
    if not narrow:
        return [y]
    # a narrower range: the grid's ends as values ((q - zero point) * scale), and the result clipped to them
    rank = len(g.shape(x))
    s = _along(g, scale, rank, axis)
    z = g.op("Cast", _along(g, zero_point, rank, axis), to=NUMPY_TO_ONNX[np.dtype(np.float32)])
    if "qmin" in narrow:
        y = g.op(
            "Max", y, g.op("Mul", g.op("Sub", g.scalar_like(float(narrow["qmin"]), y, hint="qmin"), z), s)
        )
    if "qmax" in narrow:
        y = g.op(
            "Min", y, g.op("Mul", g.op("Sub", g.scalar_like(float(narrow["qmax"]), y, hint="qmax"), z), s)
        )
    return [y]


def _along(g: GradContext, p: str, rank: int, axis: int) -> str:
    """A per-channel scale or zero point reshaped to broadcast along axis of a rank-`rank` tensor."""
    if len(g.shape(p)) == 0 or int(np.prod(g.shape(p))) == 1:
        return p
    ax = axis % rank
    return g.reshape(p, [1] * ax + [int(np.prod(g.shape(p)))] + [1] * (rank - ax - 1))


@body("FakeQuantizeGrad")
def _fake_quantize_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, x, scale, zero_point = node.inputs[:4]
    rank, axis = len(g.shape(x)), _axis(g, node)
    f32 = NUMPY_TO_ONNX[np.dtype(np.float32)]
    s = _along(g, scale, rank, axis)
    z = g.op("Cast", _along(g, zero_point, rank, axis), to=f32)
    v = g.op("Add", g.op("Round", g.op("Div", x, s)), z)
    info, narrow = np.iinfo(g.dtype(zero_point)), _range(node)
    qmin, qmax = narrow.get("qmin", info.min), narrow.get("qmax", info.max)
    lo, hi = g.scalar_like(float(qmin), v, hint="qmin"), g.scalar_like(float(qmax), v, hint="qmax")
    keep = g.op("And", g.op("GreaterOrEqual", v, lo), g.op("LessOrEqual", v, hi))
    return [g.op("Mul", dy, g.op("Cast", keep, to=f32))]
