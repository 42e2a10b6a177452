"""edgetrain's fused backward kernels for convolution and pooling (domain com.edgetrain), numpy only."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgetrain.core.errors import ShapeError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from . import depthwise
from .conv import (
    BATCHED_POSITIONS,
    CACHE_BUDGET,
    CONV1X1,
    CONV1X1_BATCHED,
    DEPTHWISE,
    GI_AS_CONV,
    IM2COL_BUDGET,
    PhaseColumns,
    batch_columns,
    batch_first,
    batch_last,
    flat_columns,
    flat_extent,
    im2col_conv,
    row_chunk,
    use_flat,
    use_phases,
)
from .depthwise import on
from .pool import avg_divisor, max_pool
from .registry import kernel
from .window import (
    compute_dtype,
    conv_output_shape,
    deliver,
    pad_input,
    per_axis,
    pool_output_shape,
    pool_setup,
    sliding_windows,
    spatial_rank,
)


def _check_dy(op: str, dy: np.ndarray, expected: Sequence[int]) -> None:
    if tuple(dy.shape) != tuple(expected):
        raise ShapeError(
            f"{op}: dY has shape {list(dy.shape)}, expected {list(expected)} (the forward output)"
        )


def _crop(dxp: np.ndarray, p: Sequence[int], sp: Sequence[int]) -> np.ndarray:
    """The unpadded part of a gradient accumulated over the padded input (a fresh array when cropped)."""
    if dxp.shape[2:] == tuple(sp):
        return dxp
    return dxp[(slice(None),) * 2 + tuple(slice(p[i], p[i] + n) for i, n in enumerate(sp))].copy()


def _extent(sp, p, oshape, k, s, d) -> tuple[int, ...]:
    """The padded spatial extent every window fits in (as window.pad_input's)."""
    return tuple(max(p[i] + n, (oshape[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i, n in enumerate(sp))


def _overlapping(k: Sequence[int], s: Sequence[int], d: Sequence[int]) -> bool:
    """Whether two windows can share an input element (then gradients add; else they are just placed)."""
    return any(si < (ki - 1) * di + 1 for ki, si, di in zip(k, s, d))


# ---------------------------------------------------------------- ConvGradInput, ConvGradWeight
# Both work batch-last: [C, spatial..., N] arrays, so that each im2col copy or col2im add runs over the last
# spatial axis and the batch together, in far longer inner loops than spatial rows alone (measured 1.5-2.5x
# faster than the batch-first slabs for N=32, 14x14 inputs, 5x5 kernels).


def _conv_setup(op: str, sp, k, group: int, nc: tuple[int, int], m: int, dy, dilations, pads, strides):
    """(out spatial shape, pads, strides, dilations, padded extent) of a Conv with input [N, C, sp...]
    (nc = (N, C)) and M output channels, with dY and the channels checked."""
    nd, c = len(sp), nc[1]
    oshape, p = conv_output_shape(sp, k, dilations=dilations, pads=pads, strides=strides)
    if group < 1 or c % group or m % group:
        raise ShapeError(f"{op}: group={group} must divide the {c} input and {m} output channels")
    _check_dy(op, dy, (nc[0], m) + oshape)
    s, d = per_axis(strides, nd, 1, "strides"), per_axis(dilations, nd, 1, "dilations")
    return oshape, p, s, d, _extent(sp, p, oshape, k, s, d)


def _chunk(n: int, rows: int, itemsize: int) -> int:
    """How many batch rows of im2col columns ([rows] elements each) fit in the memory budget."""
    return max(1, min(n, IM2COL_BUDGET // max(1, rows * itemsize)))


def _conv_grad_input_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy, w = infos[0], infos[1]
    c = w.shape[1] * int(node.attrs.get("group", 1))
    return [TensorInfo(dy.dtype, (dy.shape[0], c, *(int(d) for d in node.attrs["output_shape"])))]


@kernel("ConvGradInput", domain=PRIVATE_DOMAIN, shape=_conv_grad_input_shape)
def conv_grad_input(
    dy: np.ndarray,
    w: np.ndarray,
    *,
    dilations: Sequence[int] | None = None,
    group: int = 1,
    output_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    """Conv's dX [N, C, output_shape...] from dY [N, M, out...] and W [M, C/group, k...] (explicit pads):
    columns W^T @ dY per group, then col2im adds each kernel offset's slab into the padded dX."""
    ct = compute_dtype(dy, "ConvGradInput")
    spatial_rank(dy, "ConvGradInput", w.shape[2:])
    sp, k = tuple(int(v) for v in output_shape), w.shape[2:]
    fast = on
    n, m, c = dy.shape[0], w.shape[0], w.shape[1] * group
    oshape, p, s, d, ext = _conv_setup("ConvGradInput", sp, k, group, (n, c), m, dy, dilations, pads, strides)
    cg, mg, kk = c // group, m // group, math.prod(k)
    wt = w.astype(ct, copy=False).reshape(group, mg, cg * kk).transpose(0, 2, 1)
    if kk == 1 and not any(p) and fast(CONV1X1):  # pointwise: dX = W^T @ dY, no columns
        dx = _pointwise_grad_input(dy.astype(ct, copy=False), w.astype(ct, copy=False), group, wt)
        if oshape != sp:  # strided (ResNet's downsampling shortcuts): the products land on every s-th input
            dxs, dx = dx, np.zeros((n, c) + sp, ct)
            dx[(slice(None),) * 2 + tuple(slice(None, None, si) for si in s)] = dxs.reshape((n, c) + oshape)
        return deliver(dx.reshape((n, c) + sp), None, dy.dtype)
    if cg == 1 and fast(
        DEPTHWISE
    ):  # depthwise: multiply-adds over the kernel offsets (4-8x faster than columns)
        dx = depthwise.grad_input(
            dy.astype(ct, copy=False), w.astype(ct, copy=False), c, sp, p, s, d, IM2COL_BUDGET
        )
        return deliver(dx, None, dy.dtype)
    nd = len(sp)
    npos = math.prod(oshape)
    if (
        max(s) == 1
        and math.prod(sp) <= GI_AS_CONV_MAX_RATIO * npos
        and n * npos >= 2 * m
        and fast(GI_AS_CONV)
    ):
        # stride 1 with (near) "same" pads: dX is the convolution of dY with the flipped, transposed kernel, as
        # many multiply-adds as the columns but an im2col copy instead of col2im's adds (ResNet's 16x16 3x3 layers:
        # 1.4x, 32x32: 1.9x); not when the batch has few positions per output channel, where transposing the
        # weights costs more than col2im (ResNet's 2x2 layers: 0.6x)
        wf = w.astype(ct, copy=False).reshape((group, mg, cg) + k).swapaxes(1, 2)
        wf = np.ascontiguousarray(wf[(slice(None),) * 3 + (slice(None, None, -1),) * nd]).reshape((c, mg) + k)
        pf = tuple((k[i] - 1) * d[i] - p[i] for i in range(nd)) + tuple(
            (k[i] - 1) * d[i] - p[nd + i] for i in range(nd)
        )
        dx = np.empty((n, c) + sp, ct)
        im2col_conv(dy.astype(ct, copy=False), wf, group, k, (1,) * nd, pf, d, sp, dx)
        return deliver(dx, None, dy.dtype)
    dx = np.empty((n, c) + sp, ct)
    chunk = _chunk(n, c * kk * math.prod(oshape), ct.itemsize)
    inner = (slice(None),) + tuple(slice(p[i], p[i] + sp[i]) for i in range(len(sp)))
    for lo in range(0, n, chunk):  # one iteration unless the columns would exceed the memory budget
        hi = min(n, lo + chunk)
        dyl = batch_last(dy[lo:hi].astype(ct, copy=False)).reshape(group, mg, -1)
        cols = np.matmul(wt, dyl).reshape((c,) + k + oshape + (hi - lo,))
        dxl = _col2im(cols, k, s, d, ext)
        np.copyto(dx[lo:hi], batch_first(dxl[inner]))
    return deliver(dx, None, dy.dtype)


def _pointwise_grad_input(dy: np.ndarray, w: np.ndarray, group: int, wt: np.ndarray) -> np.ndarray:
    """dX [N, C, P] of a 1x1 convolution without pads: W^T @ dY per image and group (wt: W^T per group); with few
    positions, one GEMM over the batch as the forward's (conv.pointwise)."""
    n, m, c = dy.shape[0], w.shape[0], w.shape[1] * group
    dy3 = dy.reshape(n, m, -1)
    npos = dy3.shape[2]
    if group > 1 or npos > BATCHED_POSITIONS or not on(CONV1X1_BATCHED):
        return np.matmul(wt, dy3.reshape(n, group, m // group, npos)).reshape(n, c, npos)
    w2 = w.reshape(m, c)
    if npos == 1:  # [N, M] @ [M, C]: the images are the rows already
        return (dy3.reshape(n, m) @ w2).reshape(n, c, 1)
    dxt = w2.T @ batch_columns(dy3)
    return np.ascontiguousarray(dxt.reshape(c, n, npos).transpose(1, 0, 2))


conv_grad_input.lean = depthwise.lean_builder(conv_grad_input)


# ConvGradInput runs as a convolution when the input has at most this many times the output's positions
GI_AS_CONV_MAX_RATIO = 1.25


def _col2im(cols: np.ndarray, k, s, d, ext) -> np.ndarray:
    """Batch-last columns [C, k..., out..., N] added into their windows: [C, ext..., N]. One spatial axis at a time,
    the first first (its slabs are the longest contiguous runs), so sum(k) adds rather than prod(k): 25 -> 10 for
    5x5 kernels, each over a larger slab."""
    nd = len(k)
    a = cols
    for i in range(nd):
        # a: [C, k_i..., ext_0..ext_(i-1), out_i..., N]; fold kernel axis i (axis 1) into output axis i (axis 1 + nd)
        o = a.shape[1 + nd]
        shape = a.shape[:1] + a.shape[2 : 1 + nd] + (ext[i],) + a.shape[2 + nd :]
        lead = (slice(None),) * nd
        first = 0
        if s[i] == 1:  # the first offset's slab placed, the rest zeroed: no zero fill under it
            out = np.empty(shape, a.dtype)
            out[lead + (slice(o, None),)] = 0
            np.copyto(out[lead + (slice(0, o),)], a[:, 0])
            first = 1
        else:
            out = np.zeros(shape, a.dtype)
        for j in range(first, k[i]):
            dst = out[lead + (slice(j * d[i], j * d[i] + (o - 1) * s[i] + 1, s[i]),)]
            np.add(dst, a[:, j], out=dst)
        a = out
    return a


def _conv_grad_weight_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy, x = infos[0], infos[1]
    group = int(node.attrs.get("group", 1))
    kernel_shape = (int(d) for d in node.attrs["kernel_shape"])
    dw = TensorInfo(dy.dtype, (dy.shape[1], x.shape[1] // group, *kernel_shape))
    return [dw, TensorInfo(dy.dtype, (dy.shape[1],))][: len(node.outputs)]  # (dW, dB when asked for)


@kernel("ConvGradWeight", domain=PRIVATE_DOMAIN, shape=_conv_grad_weight_shape)
def conv_grad_weight(
    dy: np.ndarray,
    x: np.ndarray,
    *,
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    noutputs: int = 1,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Conv's dW [M, C/group, k...] (and dB [M] as a second output) from dY [N, M, out...] and X [N, C, in...]
    (explicit pads): dW[m, c, k] = sum_{n, o} dY[n, m, o] * Xpad[n, c, o*s + k*d], one matmul per group over
    the im2col columns."""
    ct = compute_dtype(x, "ConvGradWeight")
    spatial_rank(x, "ConvGradWeight", kernel_shape)
    k = tuple(int(v) for v in kernel_shape)
    n, c, m = x.shape[0], x.shape[1], dy.shape[1]
    oshape, p, s, d, ext = _conv_setup(
        "ConvGradWeight", x.shape[2:], k, group, (n, c), m, dy, dilations, pads, strides
    )
    dtype, x, dy = x.dtype, x.astype(ct, copy=False), dy.astype(ct, copy=False)
    npos = math.prod(oshape)
    pointwise = max(k) == 1 and oshape == x.shape[2:] and not any(p) and on(CONV1X1)
    if pointwise and group == 1 and npos <= GW_BATCHED_POSITIONS:  # one GEMM over the batch's positions
        dw, db = _weight_grad_columns(dy, x, group, k, oshape, p, s, d, ext, noutputs > 1)
    elif pointwise and (m // group) * (c // group) <= 8 * (m + c) * npos:
        # pointwise: the columns are X itself; per image dY @ X^T summed over the batch, no transposes (unless the
        # per-image products [M, C] outweigh the images: then one GEMM over batch-last copies, 6x for MobileNetV2's
        # 1280x320 on 2x2)
        dyg = dy.reshape(n, group, m // group, -1)
        dw = np.matmul(dyg, x.reshape(n, group, c // group, -1).transpose(0, 1, 3, 2)).sum(axis=0)
        db = (dy.reshape(n, m, -1) @ np.ones(dyg.shape[-1], ct)).sum(axis=0) if noutputs > 1 else None
    elif max(s) == 1 and use_flat(x.shape[2:], p, oshape, k, d) and (group == 1 or c > group):
        dw, db = _weight_grad_flat(
            dy, x, group, k, oshape, p, d, flat_extent(x.shape[2:], p, oshape, k, d), noutputs > 1
        )
    elif (group == 1 or c > group) and use_phases(x.shape[2:], p, oshape, k, s, d, c):
        cols = PhaseColumns(x, k, s, p, d, oshape)
        dw, db = _weight_grad_rows(dy, x, group, math.prod(k), cols.row, cols.fill, noutputs > 1)
    elif c == group and on(DEPTHWISE):  # depthwise (or one input channel): multiply-adds per offset
        dw, db = depthwise.grad_weight(dy, x, k, p, s, d, noutputs > 1, IM2COL_BUDGET)
    else:
        dw, db = _weight_grad_columns(dy, x, group, k, oshape, p, s, d, ext, noutputs > 1)
    dw = deliver(dw.reshape((m, c // group) + k), None, dtype)
    return dw if db is None else (dw, deliver(db, None, dtype))


# 1x1 weight gradients with at most this many positions per image: one GEMM over the batch's positions (its long
# reduction suits BLAS) rather than per-image products summed: 1.2-2.5x faster up to 8x8, even at 16x16 (measured)
GW_BATCHED_POSITIONS = 64


conv_grad_weight.lean = depthwise.lean_builder(conv_grad_weight)


def _pointwise_grad_weight_batched(dy: np.ndarray, x: np.ndarray, want_b: bool):
    """(dW [M, C], dB [M] or None) of a 1x1 convolution (stride 1, no pads, one group) as one GEMM over the batch's
    positions: dY [M, N*P] @ X^T [N*P, C]; with one position, dY and X are those operands already."""
    n, m, c = dy.shape[0], dy.shape[1], x.shape[1]
    if dy[0, 0].size == 1:
        dy2, x2 = dy.reshape(n, m), x.reshape(n, c)
        ones = np.ones(n, dy.dtype)
        return dy2.T @ x2, (ones @ dy2 if want_b else None)
    dyt = batch_columns(dy.reshape(n, m, -1))
    dw = dyt @ batch_columns(x.reshape(n, c, -1)).T
    # a matmul with ones: several times faster than .sum(axis=1)
    return dw, (dyt @ np.ones(dyt.shape[1], dy.dtype) if want_b else None)


def _weight_grad_columns(dy, x, group, k, oshape, p, s, d, ext, want_b):
    """(dW [G, Mg, Cg*K], dB [M] or None) through batch-last im2col columns [C*K, out..., N] (one strided copy per
    chunk of output rows, sized as the forward's: conv.row_chunk)."""
    (n, c), m, ct, nd = x.shape[:2], dy.shape[1], x.dtype, len(k)
    if group == 1 and max(k + s) == 1 and not any(p) and on(CONV1X1) and on(CONV1X1_BATCHED):
        dw, db = _pointwise_grad_weight_batched(dy, x, want_b)  # a 1x1 conv's columns are X itself
        return dw.reshape(1, m, c), db
    cg, mg, kk = c // group, m // group, math.prod(k)
    xl = batch_last(x, p, ext)
    st = xl.strides
    view = as_strided(
        xl,
        (c,) + k + oshape + (n,),
        st[:1]
        + tuple(st[1 + i] * d[i] for i in range(nd))
        + tuple(st[1 + i] * s[i] for i in range(nd))
        + st[-1:],
        writeable=False,
    )
    dyb = batch_last(dy)
    per_row = math.prod(oshape[1:]) * n
    rows = row_chunk(oshape[0], c * kk * ct.itemsize, per_row)
    buf = np.empty(c * kk * per_row * rows, ct)
    dyr = dyb.reshape(group, mg, oshape[0], per_row)
    # dW^T [Cg*K, Mg] = columns [Cg*K, Q] @ dY^T is 1.5x faster in BLAS than dY @ columns^T for a long reduction
    # (LeNet), but its transpose back costs more than the GEMM once the weights are large (ResNet's last layers)
    transposed = per_row * oshape[0] >= cg * kk
    dw = None
    sel = (slice(None),) * (1 + nd)
    for a in range(0, oshape[0], rows):
        b = min(oshape[0], a + rows)
        cols = buf[: c * kk * per_row * (b - a)]
        np.copyto(cols.reshape(view[sel + (slice(a, b),)].shape), view[sel + (slice(a, b),)])
        dyl = dyr[:, :, a:b].reshape(group, mg, -1)
        cols = cols.reshape(group, cg * kk, -1)
        if transposed:
            part = np.matmul(cols, dyl.transpose(0, 2, 1))
        else:
            part = np.matmul(dyl, cols.transpose(0, 2, 1))
        if dw is None:
            dw = part
        else:
            dw += part
    # a matmul with ones: several times faster than .sum(axis=1)
    db = dyb.reshape(m, -1) @ np.ones(per_row * oshape[0], ct) if want_b else None
    return (dw.transpose(0, 2, 1) if transposed else dw), db


def _weight_grad_flat(dy, x, group, k, oshape, p, d, flat, want_b):
    """(dW [G, Mg, Cg*K], dB [M] or None) of a stride-1 conv through the flattened-rows columns (conv._flat_conv's
    layout)."""
    ext, npos, length = flat
    view = flat_columns(x, k, p, d, ext, npos, length)

    def fill(cols: np.ndarray, lo: int, hi: int) -> None:
        np.copyto(cols.reshape(view[lo:hi].shape), view[lo:hi])

    return _weight_grad_rows(dy, x, group, math.prod(k), ext[1:], fill, want_b)


def _weight_grad_rows(dy, x, group, kk, row, fill, want_b):
    """(dW [G, Mg, Cg*K], dB [M] or None) through flattened-rows columns [C*K, out_0 * prod(row)] (the stride-1
    flattened rows or the stride phases: fill(cols, lo, hi) writes those of images lo to hi), dY zero-padded over
    the garbage positions, a cache-sized batch chunk at a time."""
    (n, c), m, ct = x.shape[:2], dy.shape[1], x.dtype
    cg, mg = c // group, m // group
    oshape = dy.shape[2:]
    npos = oshape[0] * math.prod(row)
    dyf = np.zeros((n, m, oshape[0]) + tuple(row), ct)
    dyf[(slice(None),) * 3 + tuple(slice(0, o) for o in oshape[1:])] = dy
    dyf = dyf.reshape(n, group, mg, npos)
    chunk = max(1, min(n, CACHE_BUDGET // (c * kk * npos * ct.itemsize)))
    cols = np.empty((chunk, c * kk, npos), ct)
    dwt = np.zeros((group, cg * kk, mg), ct)
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        fill(cols[: j - i], i, j)
        part = np.matmul(cols[: j - i].reshape(j - i, group, cg * kk, npos), dyf[i:j].transpose(0, 1, 3, 2))
        dwt += part.sum(axis=0)
    db = (dy.reshape(n, m, -1) @ np.ones(math.prod(oshape), ct)).sum(axis=0) if want_b else None
    return dwt.transpose(0, 2, 1), db


# ---------------------------------------------------------------- MaxPoolGrad


@kernel(
    "MaxPoolGrad",
    domain=PRIVATE_DOMAIN,
    shape=lambda node, infos: [TensorInfo(infos[0].dtype, tuple(infos[1].shape))],
)
def max_pool_grad(
    dy: np.ndarray,
    x: np.ndarray,
    y: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    """MaxPool's dX from dY, X and (optionally; recomputed when omitted) the forward's Y: each dY goes to the
    first maximum of its window in window order (onnxruntime's Indices); attributes as the forward's."""
    ct = compute_dtype(x, "MaxPoolGrad")
    geo = dict(auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations, pads=pads, strides=strides)
    oshape, p, k, s, d = pool_setup(x, "MaxPoolGrad", kernel_shape, **geo)
    _check_dy("MaxPoolGrad", dy, x.shape[:2] + oshape)
    if y is None:
        y = max_pool(x, kernel_shape=kernel_shape, **geo)
    _check_dy("MaxPoolGrad (Y)", y, x.shape[:2] + oshape)
    dy = dy.astype(ct, copy=False)
    add = _overlapping(k, s, d)
    if add and len(k) > 1 and on(MAXPOOL_GRAD_GRID):
        return deliver(_max_pool_grad_grid(x, y, dy, p, k, s, d, ct), None, x.dtype)
    xp = pad_input(x, p, oshape, k, s, d, -np.inf)
    # windows that tile the padded input (LeNet's 2x2 stride 2) write every element: no zero fill needed
    tiled = not add and all(
        ki == si and di == 1 and o * si == e for ki, si, di, o, e in zip(k, s, d, oshape, xp.shape[2:])
    )
    dxp = np.empty(xp.shape, ct) if tiled else np.zeros(xp.shape, ct)
    windows = list(sliding_windows(k, s, d, oshape))
    taken = np.empty(y.shape, bool)  # outputs whose maximum an earlier kernel offset already claimed
    hit = np.empty(y.shape, bool)
    part = np.empty(y.shape, ct) if add else None
    # ufunc where= on a strided destination is slow (~6x): multiply by the mask instead
    for j, (_, sl) in enumerate(windows):
        if j == 0:
            np.equal(xp[sl], y, out=taken)
            mask = taken
        else:
            np.equal(xp[sl], y, out=hit)
            np.greater(hit, taken, out=hit)  # hit and not taken
            if j + 1 < len(windows):
                np.logical_or(taken, hit, out=taken)
            mask = hit
        dst = dxp[sl]
        if add:
            np.multiply(dy, mask, out=part)
            np.add(dst, part, out=dst)
        else:  # each element lies in one window at most: placed, not added
            np.multiply(dy, mask, out=dst)
    return deliver(_crop(dxp, p, x.shape[2:]), None, x.dtype)


# MaxPoolGrad's overlapping windows (ResNet's 3x3 stride 2) on the depthwise kernels' phase grid: each window's mask
# and add one contiguous run per channel, where the padded input's strided windows run a few elements per row
# (ResNet18's 64x32x32 pool, batch 8: 2.5x); the same operations in the same order, so the same bits
MAXPOOL_GRAD_GRID = "maxpool_grad_grid"
depthwise.PATHS.append(MAXPOOL_GRAD_GRID)


def _max_pool_grad_grid(x, y, dy, p, k, s, d, ct) -> np.ndarray:
    """MaxPoolGrad's dX (overlapping windows) over the phase grid of depthwise._Grid: x placed with -inf padding, y
    and dY on the output grid (zeros past the output's edge, whose windows then add nothing), then max_pool_grad's
    loop over the windows on contiguous blocks."""
    n, c = x.shape[:2]
    g = depthwise.grid(x.shape[2:], p, s, d, k, y.shape[2:], n, c, c)
    xb = g.place_input(x, fill=-np.inf)
    yw, dyw = g.place_output(y), g.place_output(dy)
    dxb = g.input_buffer(ct)
    taken, hit, part = np.empty(g.wide, bool), np.empty(g.wide, bool), np.empty(g.wide, ct)
    with depthwise.row_buffers(g.row):
        for j, (ph, sh) in enumerate(g.taps):
            if j == 0:
                np.equal(g.block(xb, ph, sh), yw, out=taken)
                mask = taken
            else:
                np.equal(g.block(xb, ph, sh), yw, out=hit)
                np.greater(hit, taken, out=hit)  # hit and not taken
                np.logical_or(taken, hit, out=taken)
                mask = hit
            np.multiply(dyw, mask, out=part)
            dst = g.block(dxb, ph, sh)
            np.add(dst, part, out=dst)
    return g.gather_input(dxb, np.empty(x.shape, ct))


max_pool_grad.lean = depthwise.lean_builder(max_pool_grad)


# ---------------------------------------------------------------- AveragePoolGrad


def _average_pool_grad_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy = infos[0]
    return [TensorInfo(dy.dtype, (*dy.shape[:2], *(int(d) for d in node.attrs["output_shape"])))]


@kernel("AveragePoolGrad", domain=PRIVATE_DOMAIN, shape=_average_pool_grad_shape)
def average_pool_grad(
    dy: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    output_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    """AveragePool's dX [N, C, output_shape...] from dY: dY / count added over each window's elements;
    the other attributes are the forward's."""
    ct = compute_dtype(dy, "AveragePoolGrad")
    sp = tuple(int(v) for v in output_shape)
    nd = spatial_rank(dy, "AveragePoolGrad", kernel_shape)
    oshape, p = pool_output_shape(
        sp,
        kernel_shape,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        dilations=dilations,
        pads=pads,
        strides=strides,
    )
    _check_dy("AveragePoolGrad", dy, dy.shape[:2] + oshape)
    k = tuple(int(v) for v in kernel_shape)
    s, d = per_axis(strides, nd, 1, "strides"), per_axis(dilations, nd, 1, "dilations")
    dyd = dy.astype(ct) / avg_divisor(sp, oshape, p, k, s, d, count_include_pad, ct)
    dxp = np.zeros(dy.shape[:2] + _extent(sp, p, oshape, k, s, d), ct)
    add = _overlapping(k, s, d)
    for _, sl in sliding_windows(k, s, d, oshape):
        dst = dxp[sl]
        if add:
            np.add(dst, dyd, out=dst)
        else:
            np.copyto(dst, dyd)
    return deliver(_crop(dxp, p, sp), None, dy.dtype)
