"""Convolution kernels (numpy only): Conv and ConvTranspose. Conv computes through the column layout that suits
the layer (im2col columns batch-last; flattened rows for stride 1; the input's stride phases for strided convs) or
without columns (1x1 convolutions as GEMMs on the input, depthwise ones in depthwise.py), each such fast path named
below; the gradient kernels (nn_grad.py) build on the same columns."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgetrain.core.errors import ShapeError, UnsupportedError

from . import depthwise
from .depthwise import on
from .registry import kernel
from .window import (
    Ints,
    _target,
    compute_dtype,
    conv_output_shape,
    conv_transpose_output_shape,
    deliver,
    per_axis,
    spatial_rank,
)

# im2col columns above this many bytes are built a batch chunk at a time, so memory stays bounded on phones.
IM2COL_BUDGET = 32 << 20
# a chunk of columns this large stays in a core's L2 cache between its copy and its GEMM
CACHE_BUDGET = 1 << 20
# stride-1 convs with this many output positions per image or more use the flattened-rows columns (_flat_conv)
# when those compute at most this many times the needed positions
FLAT_MIN_POSITIONS = 256
# batch-last columns are built a chunk of output rows at a time, each chunk's GEMM at least this many columns wide
GEMM_MIN_COLUMNS = 1024
FLAT_MAX_WASTE = 1.5
# 1x1 convolutions with at most this many output positions per image run as one GEMM over the whole batch
# (batch-last operands) rather than one per image, whose products of a few columns BLAS runs slowly: MobileNetV2's
# and EfficientNet's 2x2 and 4x4 layers 1.1-2.5x faster; even at 8x8, slower from 16x16 on (measured)
BATCHED_POSITIONS = 16

# The fast paths of the convolution kernels (edgetrain.core.fastpaths): each computes what the general im2col /
# col2im path computes, which runs when the path is off.
CONV1X1 = "conv1x1"  # 1x1 convolutions without pads: GEMMs on the input itself, no columns
CONV1X1_BATCHED = "conv1x1_batched"  # ... with few positions per image: one GEMM over the batch
DEPTHWISE = "depthwise"  # depthwise convolutions: multiply-adds per kernel offset (kernels/depthwise.py)
GI_AS_CONV = "conv_gi_as_conv"  # stride-1 input gradients as a convolution with the flipped kernel, no col2im
STRIDED_FLAT = (
    "conv_strided_flat"  # strided convs' columns from the stride phases of the input (PhaseColumns)
)
depthwise.PATHS.extend((CONV1X1, CONV1X1_BATCHED, DEPTHWISE, GI_AS_CONV, STRIDED_FLAT))
# strided convs with this many output positions per image or more take their columns from the input's stride phases
# (PhaseColumns) when those compute at most FLAT_MAX_WASTE times the needed positions
PHASE_MIN_POSITIONS = 64
# ... and at most this many rows (input channels x kernel offsets): with more, the windowed columns' runs are long
# enough (ResNet's 64-channel 3x3 stride-2 layers: no gain), while stems over 3 channels gain 1.3-1.5x (measured)
PHASE_MAX_ROWS = 256


# ---------------------------------------------------------------- Conv


def _check_conv_shapes(
    op: str, x: np.ndarray, w: np.ndarray, b, group: int, kernel_shape, in_ch: int, out_ch: int
) -> None:
    if w.ndim != x.ndim:
        raise ShapeError(f"{op}: X {list(x.shape)} and W {list(w.shape)} must have the same rank")
    if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise UnsupportedError(
            f"{op}: X, W and B must share one dtype, got {x.dtype}, {w.dtype}, "
            f"{None if b is None else b.dtype}"
        )
    if group < 1 or x.shape[1] % group:
        raise ShapeError(
            f"{op}: group={group} does not divide the {x.shape[1]} input channels of X {list(x.shape)}"
        )
    if in_ch != x.shape[1]:
        raise ShapeError(
            f"{op}: X {list(x.shape)} has {x.shape[1]} channels but W {list(w.shape)} with "
            f"group={group} expects {in_ch}"
        )
    if op == "Conv" and out_ch % group:
        raise ShapeError(
            f"{op}: group={group} does not divide the {out_ch} output channels of W {list(w.shape)}"
        )
    if kernel_shape is not None and tuple(kernel_shape) != w.shape[2:]:
        raise ShapeError(f"{op}: kernel_shape={list(kernel_shape)} does not match W {list(w.shape)}")
    if b is not None and b.shape != (out_ch,):
        raise ShapeError(f"{op}: B {list(b.shape)} must have shape [{out_ch}] (the output channels)")


@kernel("Conv")
def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    ct = compute_dtype(x, "Conv")
    nd = spatial_rank(x, "Conv")
    m, k = w.shape[0], w.shape[2:]
    _check_conv_shapes("Conv", x, w, b, group, kernel_shape, w.shape[1] * group, m)
    oshape, p = conv_output_shape(
        x.shape[2:], k, auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides
    )
    s, d = per_axis(strides, nd, 1, "strides"), per_axis(dilations, nd, 1, "dilations")
    dtype, x, w = x.dtype, x.astype(ct, copy=False), w.astype(ct, copy=False)
    y = _target(out, x.shape[:1] + (m,) + oshape, ct)
    if max(k) == 1 and not any(p) and on(CONV1X1):
        xs = x[(slice(None),) * 2 + tuple(slice(None, None, si) for si in s)] if max(s) > 1 else x
        pointwise(w.reshape(m, -1), xs.reshape(x.shape[0], x.shape[1], -1), group, y)
    elif group == x.shape[1] == m and on(DEPTHWISE):
        # depthwise: multiply-adds over the kernel offsets, 1.2-3x faster than im2col's per-channel [1, K]
        # products; with a channel multiplier, im2col's columns serve every output of a channel and win
        depthwise.conv(x, w, p, s, d, oshape, y, IM2COL_BUDGET)
    else:
        im2col_conv(x, w, group, k, s, p, d, oshape, y)
    if b is not None:
        y += b.astype(ct, copy=False).reshape((m,) + (1,) * nd)
    return deliver(y, out, dtype)


conv.lean = depthwise.lean_builder(conv)


def pointwise(w2: np.ndarray, x3: np.ndarray, group: int, y: np.ndarray) -> None:
    """y [N, M, *out] = w2 [M, C/group] @ x3[n] [C, P] per image and group: a 1x1 convolution without columns; with
    few positions, one GEMM over the batch (or, with one position, x3 itself as the rows of the GEMM)."""
    n, c, npos = x3.shape
    m = w2.shape[0]
    if group > 1 or npos > BATCHED_POSITIONS or not on(CONV1X1_BATCHED):
        _grouped_matmul(w2, x3, group, y)
    elif npos == 1:  # [N, C] @ [C, M]: the images are the rows already
        np.matmul(x3.reshape(n, c), w2.T, out=y.reshape(n, m))
    else:
        yt = w2 @ batch_columns(x3)
        np.copyto(y.reshape(n, m, npos), yt.reshape(m, n, npos).transpose(1, 0, 2))


def batch_columns(a3: np.ndarray) -> np.ndarray:
    """a3 [N, C, P] as a contiguous [C, N * P]: the batch's positions side by side, the columns of one GEMM."""
    n, c, npos = a3.shape
    return np.ascontiguousarray(a3.transpose(1, 0, 2)).reshape(c, n * npos)


def _grouped_matmul(w2: np.ndarray, cols: np.ndarray, group: int, y: np.ndarray) -> None:
    """y[n] = w2 @ cols[n] per group: w2 [M, G*R], cols [N, G*R, P], y [N, M, *out] with prod(out) == P."""
    n, rows, npos = cols.shape
    m = w2.shape[0]
    if group == 1:
        np.matmul(w2, cols, out=y.reshape(n, m, npos))
    else:
        np.matmul(
            w2.reshape(group, m // group, rows // group),
            cols.reshape(n, group, rows // group, npos),
            out=y.reshape(n, group, m // group, npos),
        )


def im2col_conv(x, w, group, k, s, p, d, oshape, y) -> None:
    """y = Conv(x, w) (no bias) through im2col columns and one GEMM per group, in whichever column layout
    gives the copies long contiguous runs and BLAS a large enough product."""
    if max(s) == 1 and use_flat(x.shape[2:], p, oshape, k, d):
        _flat_conv(x, w, group, k, p, d, oshape, flat_extent(x.shape[2:], p, oshape, k, d), y)
    elif use_phases(x.shape[2:], p, oshape, k, s, d, x.shape[1]):
        _phase_conv(x, w, group, PhaseColumns(x, k, s, p, d, oshape), y)
    else:
        _batch_last_conv(x, w, group, k, s, p, d, oshape, y)


def use_flat(sp, p, oshape, k, d) -> bool:
    """Whether a stride-1 conv's columns are best taken in the flattened-rows layout (flat_extent)."""
    npos = math.prod(oshape)
    return npos >= FLAT_MIN_POSITIONS and flat_extent(sp, p, oshape, k, d)[1] <= FLAT_MAX_WASTE * npos


@functools.lru_cache(maxsize=512)
def flat_extent(sp, p, oshape, k, d) -> tuple[Ints, int, int]:
    """(padded extent, positions per image, flat length) of the flattened-rows layout of a stride-1 conv:
    each image padded and flattened, output position q reads input q + offset for a kernel offset (so every
    column is one contiguous slice), at the price of computing the ext - out garbage positions of each row
    beyond the first axis; the flat length leaves room for the last offset's overrun."""
    ext = tuple(max(p[i] + n, oshape[i] + (k[i] - 1) * d[i]) for i, n in enumerate(sp))
    row = math.prod(ext[1:])
    tail = sum((k[i] - 1) * d[i] * math.prod(ext[i + 1 :]) for i in range(1, len(ext)))
    return ext, oshape[0] * row, math.prod(ext) + tail


def _flat_conv(x, w, group, k, p, d, oshape, flat, y) -> None:
    """Stride-1 conv over the flattened-rows layout (flat_extent), a cache-sized batch chunk at a time: 1.3-1.5x
    faster than windowed columns for large images (LeNet's first layer), whose copies run over short rows."""
    (n, c), m = x.shape[:2], w.shape[0]
    ext, npos, length = flat
    view = flat_columns(x, k, p, d, ext, npos, length)
    rows = c * math.prod(k)
    chunk = max(1, min(n, CACHE_BUDGET // (rows * npos * x.itemsize)))
    cols = np.empty((chunk, rows, npos), x.dtype)
    yf = np.empty((chunk, m, npos), x.dtype)
    w2 = w.reshape(m, -1)
    crop = (slice(None),) * 3 + tuple(slice(0, o) for o in oshape[1:])
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        np.copyto(cols[: j - i].reshape(view[i:j].shape), view[i:j])
        _grouped_matmul(w2, cols[: j - i], group, yf[: j - i])
        np.copyto(y[i:j], yf[: j - i].reshape((j - i, m, oshape[0]) + ext[1:])[crop])


def use_phases(sp, p, oshape, k, s, d, channels: int) -> bool:
    """Whether a strided conv's columns are best taken from the input's stride phases (PhaseColumns)."""
    if max(s) == 1 or math.prod(oshape) < PHASE_MIN_POSITIONS or channels * math.prod(k) > PHASE_MAX_ROWS:
        return False
    if not on(STRIDED_FLAT):
        return False
    return phase_layout(tuple(sp), tuple(p), tuple(oshape), tuple(k), tuple(s), tuple(d))[2] <= (
        FLAT_MAX_WASTE * math.prod(oshape)
    )


@functools.lru_cache(maxsize=512)
def phase_layout(sp: Ints, p: Ints, oshape: Ints, k: Ints, s: Ints, d: Ints):
    """(grid Q, flat length, positions per image, taps) of a strided conv's phase layout: the padded input split
    into its prod(s) stride phases (xpad[..., r::s] for every r < s), each flattened on one grid Q, so that kernel
    offset o reads phase (o*d % s) from grid position j + o*d // s for output j: on the flattened grid, one
    contiguous run from its tap's shift (as the stride-1 flattened rows, flat_extent: out_0 * prod(Q[1:])
    positions, the last prod(Q[1:]) - prod(out[1:]) of each row garbage). taps: (phase, shift) per kernel offset,
    row-major as W's."""
    nd = len(sp)
    reach = [(k[i] - 1) * d[i] // s[i] for i in range(nd)]
    q = tuple(max(-(-(p[i] + sp[i]) // s[i]), oshape[i] + reach[i]) for i in range(nd))
    row = [math.prod(q[i + 1 :]) for i in range(nd)]
    tail = sum(reach[i] * row[i] for i in range(1, nd))
    sst = [math.prod(s[i + 1 :]) for i in range(nd)]
    taps = tuple(
        (
            sum(off[i] * d[i] % s[i] * sst[i] for i in range(nd)),
            sum(off[i] * d[i] // s[i] * row[i] for i in range(nd)),
        )
        for off in np.ndindex(*k)
    )
    return q, math.prod(q) + tail, oshape[0] * row[0], taps


class PhaseColumns:
    """The columns of a strided conv taken from the stride phases of its padded input (phase_layout): each kernel
    offset's columns one contiguous copy per image and channel, where windowed columns copy runs of a few elements
    (ResNet's 7x7 stride-2 stem over 3 channels: the batch-last columns' runs are the batch, 8 long)."""

    def __init__(self, x: np.ndarray, k: Ints, s: Ints, p: Ints, d: Ints, oshape: Ints):
        (n, c), sp, nd = x.shape[:2], x.shape[2:], len(k)
        self.q, length, self.npos, self.taps = phase_layout(sp, tuple(p[:nd]), oshape, tuple(k), s, d)
        self.row = self.q[1:]  # the grid's extent past the first axis: a flat position's row
        self.c, self.kk = c, len(self.taps)
        self.xf = np.zeros((n, c, math.prod(s), length), x.dtype)
        size = math.prod(self.q)
        for ph, r in enumerate(np.ndindex(*s)):
            gsl, asl = [], []
            for i in range(nd):  # the grid rows of phase r that hold input elements, and those elements
                lo = max(0, -(-(p[i] - r[i]) // s[i]))
                hi = (p[i] - r[i] + sp[i] - 1) // s[i]
                start = lo * s[i] + r[i] - p[i]
                gsl.append(slice(lo, hi + 1))
                asl.append(slice(start, start + max(0, hi - lo) * s[i] + 1, s[i]))
            if all(g.stop > g.start for g in gsl):
                grid = self.xf[:, :, ph, :size].reshape((n, c) + self.q)
                grid[(slice(None),) * 2 + tuple(gsl)] = x[(slice(None),) * 2 + tuple(asl)]

    def fill(self, cols: np.ndarray, lo: int, hi: int) -> None:
        """cols [hi - lo, C * K, positions] = the columns of images lo to hi."""
        c4 = cols.reshape(hi - lo, self.c, self.kk, self.npos)
        for j, (ph, sh) in enumerate(self.taps):
            np.copyto(c4[:, :, j], self.xf[lo:hi, :, ph, sh : sh + self.npos])


def _phase_conv(x, w, group, pc: PhaseColumns, y) -> None:
    """Strided conv over its phase columns (PhaseColumns), a cache-sized batch chunk at a time (as _flat_conv)."""
    (n, c), m = x.shape[:2], w.shape[0]
    rows, npos = c * pc.kk, pc.npos
    chunk = max(1, min(n, CACHE_BUDGET // (rows * npos * x.itemsize)))
    cols = np.empty((chunk, rows, npos), x.dtype)
    yf = np.empty((chunk, m, npos), x.dtype)
    w2 = w.reshape(m, -1)
    crop = (slice(None),) * 3 + tuple(slice(0, o) for o in y.shape[3:])
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        pc.fill(cols[: j - i], i, j)
        _grouped_matmul(w2, cols[: j - i], group, yf[: j - i])
        np.copyto(y[i:j], yf[: j - i].reshape((j - i, m, y.shape[2]) + pc.row)[crop])


def flat_columns(x, k, p, d, ext, npos, length) -> np.ndarray:
    """The read-only view [N, C, k..., positions] of x's flattened-rows columns (see flat_extent)."""
    (n, c), nd = x.shape[:2], len(k)
    xf = np.zeros((n, c, length), x.dtype)
    inner = (slice(None),) * 2 + tuple(slice(p[i], p[i] + x.shape[2 + i]) for i in range(nd))
    xf[:, :, : math.prod(ext)].reshape((n, c) + ext)[inner] = x
    estr = [math.prod(ext[i + 1 :]) * xf.itemsize for i in range(nd)]
    st = xf.strides
    view = as_strided(
        xf,
        (n, c) + tuple(k) + (npos,),
        st[:2] + tuple(estr[i] * d[i] for i in range(nd)) + st[2:],
        writeable=False,
    )
    return view


def _batch_last_conv(x, w, group, k, s, p, d, oshape, y) -> None:
    """Conv through batch-last columns [C*K, out..., N]: the copies run over the last output axis and the batch
    together, and the GEMM's columns span the batch (5x faster than per-image products for deep layers with a
    few output positions); the output is transposed back to [N, M, out...] a chunk of output rows at a time."""
    (n, c), nd, m = x.shape[:2], len(k), w.shape[0]
    ext = tuple(
        max(p[i] + sz, (oshape[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i, sz in enumerate(x.shape[2:])
    )
    xb = batch_last(x, p, ext)
    st = xb.strides
    view = as_strided(
        xb,
        (c,) + tuple(k) + oshape + (n,),
        st[:1]
        + tuple(st[1 + i] * d[i] for i in range(nd))
        + tuple(st[1 + i] * s[i] for i in range(nd))
        + st[-1:],
        writeable=False,
    )
    rows, per_row = c * math.prod(k), math.prod(oshape[1:]) * n
    chunk = row_chunk(oshape[0], rows * xb.itemsize, per_row)
    buf = np.empty(rows * per_row * chunk, x.dtype)
    ybuf = np.empty(m * per_row * chunk, x.dtype)
    w2 = w.reshape(group, m // group, rows // group)
    sel = (slice(None),) * (1 + nd)
    for a in range(0, oshape[0], chunk):  # one iteration unless the columns would exceed the memory budget
        b = min(oshape[0], a + chunk)
        cols = buf[: rows * per_row * (b - a)]
        np.copyto(cols.reshape(view[sel + (slice(a, b),)].shape), view[sel + (slice(a, b),)])
        yb = ybuf[: m * per_row * (b - a)].reshape(group, m // group, -1)
        np.matmul(w2, cols.reshape(group, rows // group, -1), out=yb)
        np.copyto(y[:, :, a:b], batch_first(yb.reshape((m, b - a) + oshape[1:] + (n,))))


def row_chunk(n_rows: int, col_bytes: int, per_row: int) -> int:
    """How many output rows of batch-last columns to build and multiply at a time: few enough that the columns
    stay in cache between their copy and their GEMM (LeNet's second layer at batch 64: 1.3x), but at least
    GEMM_MIN_COLUMNS columns so that deep layers keep one large GEMM; never over the memory budget."""
    cached = max(CACHE_BUDGET // (col_bytes * per_row), -(-GEMM_MIN_COLUMNS // per_row))
    return max(1, min(n_rows, cached, IM2COL_BUDGET // (col_bytes * per_row)))


def batch_first(a: np.ndarray) -> np.ndarray:
    """A view of a [..., N] as [N, ...] (np.moveaxis costs more than small layers' arithmetic)."""
    return a.transpose((a.ndim - 1,) + tuple(range(a.ndim - 1)))


def batch_last(a: np.ndarray, p: Sequence[int] = (), ext: Sequence[int] | None = None) -> np.ndarray:
    """a [N, C, spatial...] as a contiguous [C, spatial..., N]; with ext, placed at the begin pads p inside
    zeros of spatial extent ext."""
    moved = a.transpose(tuple(range(1, a.ndim)) + (0,))
    if ext is None or tuple(ext) == a.shape[2:]:
        return np.ascontiguousarray(moved)
    out = np.zeros((a.shape[1],) + tuple(ext) + (a.shape[0],), a.dtype)
    out[(slice(None),) + tuple(slice(p[i], p[i] + n) for i, n in enumerate(a.shape[2:]))] = moved
    return out


# ---------------------------------------------------------------- ConvTranspose


@kernel("ConvTranspose")
def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    output_padding: Sequence[int] | None = None,
    output_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    ct = compute_dtype(x, "ConvTranspose")
    nd = spatial_rank(x, "ConvTranspose")
    n, c = x.shape[:2]
    k, m = w.shape[2:], w.shape[1] * group
    _check_conv_shapes("ConvTranspose", x, w, b, group, kernel_shape, w.shape[0], m)
    oshape, p = conv_transpose_output_shape(
        x.shape[2:],
        k,
        auto_pad=auto_pad,
        dilations=dilations,
        output_padding=output_padding,
        output_shape=output_shape,
        pads=pads,
        strides=strides,
    )
    s, d = per_axis(strides, nd, 1, "strides"), per_axis(dilations, nd, 1, "dilations")
    dtype, x, w = x.dtype, x.astype(ct, copy=False), w.astype(ct, copy=False)
    # columns [N, G, Mg*K, S] = W^T @ X per group, then col2im adds each kernel offset's slab into place
    wt = w.reshape(group, c // group, -1).transpose(0, 2, 1)
    cols = np.matmul(wt, x.reshape(n, group, c // group, -1)).reshape((n, m) + tuple(k) + x.shape[2:])
    y = _target(out, (n, m) + oshape, ct)
    if b is None:
        y.fill(0)
    else:
        np.copyto(y, b.astype(ct, copy=False).reshape((m,) + (1,) * nd))
    for off in np.ndindex(*k):
        dst, src = [slice(None)] * 2, [slice(None)] * 2 + list(off)
        for i, o in enumerate(off):
            shift = o * d[i] - p[i]  # output index of input index 0 for this offset
            lo = max(0, -(shift // s[i]))
            hi = min(x.shape[2 + i] - 1, (oshape[i] - 1 - shift) // s[i])
            if lo > hi:
                break
            dst.append(slice(lo * s[i] + shift, hi * s[i] + shift + 1, s[i]))
            src.append(slice(lo, hi + 1))
        else:
            yv = y[tuple(dst)]
            np.add(yv, cols[tuple(src)], out=yv)
    return deliver(y, out, dtype)
