"""Gradient rules of convolution and pooling, and the standard-op bodies of their fused backward ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError
from edgetrain.core.ir import Node
from edgetrain.core.kernels.pool import avg_divisor
from edgetrain.core.kernels.window import (
    conv_output_shape,
    conv_transpose_output_shape,
    per_axis,
    pool_output_shape,
)
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad

POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


# ---------------------------------------------------------------- geometry


def _geometry(node: Node, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A geometry helper's result; its user errors name the node."""
    try:
        return fn(*args, **kw)
    except EdgeTrainError as e:
        raise type(e)(f"{node.label}: {e}") from e


def _window_attrs(**attrs: Any) -> dict[str, Any]:
    """Attributes as lists of ints, leaving out those equal to the spec's default (all 0 pads, all 1 strides
    and dilations, group 1, all 0 output_padding)."""
    default = {"pads": 0, "output_padding": 0, "strides": 1, "dilations": 1}
    out: dict[str, Any] = {}
    for key, v in attrs.items():
        if key == "group":
            if v != 1:
                out[key] = int(v)
        elif key not in default or any(int(e) != default[key] for e in v):
            out[key] = [int(e) for e in v]
    return out


def _conv_params(g: GradContext, node: Node, sp: Sequence[int], k: Sequence[int]):
    """A Conv's (output spatial shape, explicit pads, strides, dilations)."""
    oshape, p = _geometry(
        node,
        conv_output_shape,
        sp,
        k,
        auto_pad=g.attr(node, "auto_pad"),
        dilations=g.attr(node, "dilations"),
        pads=g.attr(node, "pads"),
        strides=g.attr(node, "strides"),
    )
    return (oshape, p) + _steps(node.attrs, len(sp))


def _adjoint(sp, oshape, p, s, d, k) -> tuple[list[int], list[int]]:
    """The pads and output_padding of the ConvTranspose that is the adjoint of a window op (Conv, AveragePool)
    with input spatial shape sp, output oshape, explicit pads p, strides s, dilations d, kernel k: its full
    result (o - 1) * s + dilated kernel + output_padding, cropped by the pads, has exactly sp elements."""
    nd = len(sp)
    begin, end, adj = list(p[:nd]), [], []
    for i in range(nd):
        full = (oshape[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1
        a = max(0, sp[i] + p[i] - full)  # input elements past the last window (< stride)
        adj.append(a)
        end.append(full + a - p[i] - sp[i])
    back, _ = conv_transpose_output_shape(
        oshape, k, dilations=d, output_padding=adj, pads=begin + end, strides=s
    )
    assert tuple(back) == tuple(sp), (back, sp)
    return begin + end, adj


def _steps(attrs: dict[str, Any], nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(strides, dilations) of a window op's attributes, defaults filled in."""
    return per_axis(attrs.get("strides"), nd, 1, "strides"), per_axis(
        attrs.get("dilations"), nd, 1, "dilations"
    )


def _cut(g: GradContext, v: str, ends: Sequence[int]) -> str:
    """v [N, C, spatial...] sliced to at most ends[i] elements along spatial axis i."""
    sp = g.shape(v)[2:]
    axes = [i for i in range(len(sp)) if ends[i] < sp[i]]
    if not axes:
        return v
    starts = g.ints([0] * len(axes), hint="starts")
    return g.op(
        "Slice", v, starts, g.ints([ends[i] for i in axes], hint="ends"), g.ints([2 + i for i in axes])
    )


def _bias_grad(g: GradContext, dy: str) -> str:
    axes = [0] + list(range(2, len(g.shape(dy))))
    return g.op("ReduceSum", dy, g.ints(axes), keepdims=0)


# ---------------------------------------------------------------- Conv, ConvTranspose


# y = conv(x, w) + b, y[n, m, o] = sum_{c, k} xpad[n, c, o*s + k*d] * w[m, c, k] (per group):
#   dx[n, c, i] = sum_{m, o, k: o*s + k*d = i + pad} dy[n, m, o] * w[m, c, k]: conv_transpose(dy, w), the
#      adjoint (same w, strides, dilations, group; the pads become a crop) (fused ConvGradInput),
#   dw[m, c, k] = sum_{n, o} dy[n, m, o] * xpad[n, c, o*s + k*d] (fused ConvGradWeight), db[m] = sum_{n, o} dy
@grad("Conv")
def conv_grad(g: GradContext, node: Node, dys: list[str | None], needs: list[bool]) -> list[str | None]:
    dy = dys[0]
    if dy is None:
        return []
    x, w = node.inputs[:2]
    sp, k = g.shape(x)[2:], g.shape(w)[2:]
    oshape, p, s, d = _conv_params(g, node, sp, k)
    group = g.attr(node, "group")
    dx = dw = db = None
    attrs = _window_attrs(group=group, strides=s, dilations=d, pads=p)
    if needs[0]:
        dx = g.private("ConvGradInput", dy, w, output_shape=list(sp), **attrs)
    want_b = len(needs) > 2 and needs[2]
    if needs[1]:
        res = g.private("ConvGradWeight", dy, x, n=1 + want_b, kernel_shape=list(k), **attrs)
        dw, db = res if want_b else (res, None)
    elif want_b:
        db = _bias_grad(g, dy)
    return [dx, dw, db][: len(node.inputs)]


# y = conv_transpose(x, w) + b: full[n, m, i*s + k*d] += x[n, c, i] * w[c, m, k] (per group), y = full cropped
# by the pads (zero-extended to a larger output_shape). Its adjoint is a Conv of dfull (dy with the crop as
# padding): dx = conv(dfull, w), dw[c, m, k] = sum_{n, i} x[n, c, i] * dfull[n, m, i*s + k*d] (ConvGradWeight
# with x in dY's place and dfull in X's), db = sum_{n, o} dy. Output elements past the last kernel tap (from
# output_padding or zero extension) get no x: they are sliced off dy.
@grad("ConvTranspose")
def conv_transpose_grad(
    g: GradContext, node: Node, dys: list[str | None], needs: list[bool]
) -> list[str | None]:
    dy = dys[0]
    if dy is None:
        return []
    x, w = node.inputs[:2]
    sp, k = g.shape(x)[2:], g.shape(w)[2:]
    nd = len(sp)
    out, p = _geometry(
        node,
        conv_transpose_output_shape,
        sp,
        k,
        **{a: g.attr(node, a) for a in ("auto_pad", "dilations", "output_padding", "output_shape", "pads")},
        strides=g.attr(node, "strides"),
    )
    s, d = _steps(node.attrs, nd)
    reach = [(sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - p[i] for i in range(nd)]  # last tapped y index + 1
    dy_t = _cut(g, dy, reach)
    pads = list(p[:nd]) + [reach[i] - out[i] if reach[i] > out[i] else 0 for i in range(nd)]
    attrs = _window_attrs(group=g.attr(node, "group"), strides=s, dilations=d, pads=pads)
    dx = g.op("Conv", dy_t, w, **attrs) if needs[0] else None
    dw = g.private("ConvGradWeight", x, dy_t, kernel_shape=list(k), **attrs) if needs[1] else None
    db = _bias_grad(g, dy) if len(needs) > 2 and needs[2] else None
    return [dx, dw, db][: len(node.inputs)]


# ConvGradInput(dY, W) in standard ops: a ConvTranspose whose full result, cropped by the Conv's pads, has X's shape
@body("ConvGradInput")
def _conv_grad_input_body(g: GradContext, node: Node) -> list[str]:
    dy, w = node.inputs[:2]
    sp, oshape, k = tuple(node.attrs["output_shape"]), g.shape(dy)[2:], g.shape(w)[2:]
    s, d = _steps(node.attrs, len(sp))
    p = per_axis(node.attrs.get("pads"), 2 * len(sp), 0, "pads")
    pads, adj = _adjoint(sp, oshape, p, s, d, k)
    attrs = _window_attrs(
        group=node.attrs.get("group", 1), strides=s, dilations=d, pads=pads, output_padding=adj
    )
    return [g.op("ConvTranspose", dy, w, **attrs)]


# ConvGradWeight(dY, X) -> dW (, dB) in standard ops: dW is a Conv of X with batch and channels swapped by dY
# with batch and channels swapped, strides and dilations exchanged: out[c, m, k] = sum_{n, o}
# xT[c, n, k*d + o*s] * dyT[m, n, o]. With groups, X [N, G*Cg, ..] becomes [Cg, G*N, ..] and dY [N, G*Mg, ..]
# becomes [G*Mg, N, ..], so that a Conv with group=G pairs group g of X with group g of dY; then dW = out^T.
@body("ConvGradWeight")
def _conv_grad_weight_body(g: GradContext, node: Node) -> list[str]:
    dy, x = node.inputs[:2]
    (n, c), sp = g.shape(x)[:2], g.shape(x)[2:]
    m, oshape, nd = g.shape(dy)[1], g.shape(dy)[2:], len(sp)
    k, group = node.attrs["kernel_shape"], node.attrs.get("group", 1)
    s, d = _steps(node.attrs, nd)
    p = per_axis(node.attrs.get("pads"), 2 * nd, 0, "pads")
    # end pads that make the Conv's output exactly k; input past the last window is sliced off
    reach = [(oshape[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - p[i] for i in range(nd)]
    x = _cut(g, x, reach)
    pads = list(p[:nd]) + [max(0, reach[i] - sp[i]) for i in range(nd)]
    sx, cg, mg = g.shape(x)[2:], c // group, m // group
    if group == 1:
        xt = g.op("Transpose", x, perm=[1, 0] + list(range(2, 2 + nd)))
        dyt = g.op("Transpose", dy, perm=[1, 0] + list(range(2, 2 + nd)))
    else:
        rest = list(range(3, 3 + nd))
        xt = g.op("Transpose", g.reshape(x, [n, group, cg, *sx]), perm=[2, 1, 0] + rest)
        dyt = g.op("Transpose", g.reshape(dy, [n, group, mg, *oshape]), perm=[1, 2, 0] + rest)
        xt, dyt = g.reshape(xt, [cg, group * n, *sx]), g.reshape(dyt, [m, n, *oshape])
    attrs = _window_attrs(group=group, strides=d, dilations=s, pads=pads)
    dw = g.op("Transpose", g.op("Conv", xt, dyt, **attrs), perm=[1, 0] + list(range(2, 2 + nd)))
    return [dw, _bias_grad(g, dy)] if len(node.outputs) > 1 else [dw]


# ---------------------------------------------------------------- MaxPool, AveragePool


# y[o] = max over the window of o: dx = dy placed at each window's first maximum (fused MaxPoolGrad, which reads
# the forward's y rather than recomputing it; ties go to the first maximum in window order as onnxruntime's
# Indices). storage_order only changes the Indices output, which has no gradient.
@grad("MaxPool")
def max_pool_grad(g: GradContext, node: Node, dys: list[str | None], needs: list[bool]) -> list[str | None]:
    if dys[0] is None:
        return []
    attrs = {a: node.attrs[a] for a in POOL_ATTRS if a in node.attrs}
    return [g.private("MaxPoolGrad", dys[0], node.inputs[0], node.outputs[0], **attrs)]


# MaxPoolGrad(dY, X, Y) in standard ops: the pool recomputed with its Indices (flat positions in X), then dY
# scatter-added at them into zeros.
@body("MaxPoolGrad")
def _max_pool_grad_body(g: GradContext, node: Node) -> list[str]:
    dy, x = node.inputs[:2]
    _, idx = g.ops("MaxPool", x, n=2, **node.attrs)
    zeros = g.op(
        "ConstantOfShape", g.ints([int(np.prod(g.shape(x)))], hint="shape"), value=np.zeros(1, g.dtype(x))
    )
    flat = g.op("ScatterElements", zeros, g.reshape(idx, [-1]), g.reshape(dy, [-1]), axis=0, reduction="add")
    return [g.reshape(flat, g.shape(x))]


# y[o] = sum over the window of o of x / count[o]: dx[i] = sum over the windows o holding i of dy[o] / count[o]
# (fused AveragePoolGrad)
@grad("AveragePool")
def average_pool_grad(
    g: GradContext, node: Node, dys: list[str | None], needs: list[bool]
) -> list[str | None]:
    if dys[0] is None:
        return []
    attrs = {a: node.attrs[a] for a in POOL_ATTRS + ("count_include_pad",) if a in node.attrs}
    sp = list(g.shape(node.inputs[0])[2:])
    return [g.private("AveragePoolGrad", dys[0], output_shape=sp, **attrs)]


# AveragePoolGrad(dY) in standard ops: dY / count (a constant map), then a depthwise ConvTranspose with a ones
# kernel (the adjoint of the window sum).
@body("AveragePoolGrad")
def _average_pool_grad_body(g: GradContext, node: Node) -> list[str]:
    dy = node.inputs[0]
    c, oshape, sp = g.shape(dy)[1], g.shape(dy)[2:], tuple(node.attrs["output_shape"])
    k, nd = tuple(node.attrs["kernel_shape"]), len(sp)
    geo = {a: v for a, v in node.attrs.items() if a in POOL_ATTRS and a != "kernel_shape"}
    oshape2, p = pool_output_shape(sp, k, **geo)
    assert tuple(oshape2) == tuple(oshape), (oshape2, oshape)
    s, d = _steps(node.attrs, nd)
    cnt = avg_divisor(sp, oshape, p, k, s, d, node.attrs.get("count_include_pad", 0), g.dtype(dy))
    q = g.op("Div", dy, g.const(np.asarray(cnt, g.dtype(dy)), hint="count"))
    pads, adj = _adjoint(sp, oshape, p, s, d, k)
    ones = g.const(np.ones((c, 1) + k, g.dtype(dy)), hint="ones")
    attrs = _window_attrs(group=c, strides=s, dilations=d, pads=pads, output_padding=adj)
    return [g.op("ConvTranspose", q, ones, **attrs)]


# ---------------------------------------------------------------- global pools, LRN


# y = mean of x over the spatial axes (S elements): dx = dy / S broadcast over them
@grad("GlobalAveragePool")
def global_average_pool_grad(
    g: GradContext, node: Node, dys: list[str | None], needs: list[bool]
) -> list[str | None]:
    if dys[0] is None:
        return []
    x = node.inputs[0]
    scale = g.scalar_like(1.0 / int(np.prod(g.shape(x)[2:])), x)
    return [g.op("Expand", g.op("Mul", dys[0], scale), g.ints(g.shape(x), hint="shape"))]


# y = max of x over the spatial axes: dx = dy at the first maximum (ArgMax, as MaxPool's ties), zero elsewhere
@grad("GlobalMaxPool")
def global_max_pool_grad(
    g: GradContext, node: Node, dys: list[str | None], needs: list[bool]
) -> list[str | None]:
    if dys[0] is None:
        return []
    x = node.inputs[0]
    (n, c), size = g.shape(x)[:2], int(np.prod(g.shape(x)[2:]))
    flat = g.reshape(x, [n, c, size])
    at = g.op("ArgMax", flat, axis=2, keepdims=1)
    zeros = g.op("ConstantOfShape", g.ints([n, c, size], hint="shape"), value=np.zeros(1, g.dtype(x)))
    dx = g.op("ScatterElements", zeros, at, g.reshape(dys[0], [n, c, 1]), axis=2)
    return [g.reshape(dx, g.shape(x))]


# y[c] = x[c] * den[c]^-beta, den[c] = bias + alpha/size * sum_{c' in [c - lo, c + hi]} x[c']^2
# (lo = (size-1)//2, hi = size-1-lo): dx[c] = dy[c] * den[c]^-beta
#   - 2*alpha*beta/size * x[c] * sum_{c' in [c - hi, c + lo]} dy[c'] * y[c'] / den[c']
# Channel-window sums are AveragePools (count_include_pad=1: a constant divisor `size`) over an [N, 1, C, R] view.
@grad("LRN")
def lrn_grad(g: GradContext, node: Node, dys: list[str | None], needs: list[bool]) -> list[str | None]:
    if dys[0] is None:
        return []
    x, y = node.inputs[0], node.outputs[0]
    shape = g.shape(x)
    view = [shape[0], 1, shape[1], int(np.prod(shape[2:]))]
    size = int(g.attr(node, "size"))
    alpha, beta, bias = (float(g.attr(node, a)) for a in ("alpha", "beta", "bias"))
    lo = (size - 1) // 2
    hi = size - 1 - lo
    xr, yr, dyr = (g.reshape(v, view) for v in (x, y, dys[0]))

    def window_mean(v: str, before: int, after: int) -> str:
        pads = [before, 0, after, 0]
        return g.op("AveragePool", v, kernel_shape=[size, 1], pads=pads, count_include_pad=1)

    mean_sq = window_mean(g.op("Mul", xr, xr), lo, hi)
    den = g.op("Add", g.op("Mul", mean_sq, g.scalar_like(alpha, x)), g.scalar_like(bias, x))
    direct = g.op("Mul", dyr, g.op("Pow", den, g.scalar_like(-beta, x)))
    back = window_mean(g.op("Div", g.op("Mul", dyr, yr), den), hi, lo)
    cross = g.op("Mul", xr, g.op("Mul", back, g.scalar_like(2 * alpha * beta, x)))
    return [g.reshape(g.op("Sub", direct, cross), shape)]
