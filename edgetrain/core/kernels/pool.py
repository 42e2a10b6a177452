"""Pooling kernels (numpy only): MaxPool (and its indices), AveragePool, LpPool, GlobalAveragePool,
GlobalMaxPool, and LRN (a window across channels). Their geometry is window.py's, their gradients are in
nn_grad.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError

from .registry import kernel
from .window import _target, compute_dtype, deliver, pad_input, pool_setup, sliding_windows, spatial_rank

# ---------------------------------------------------------------- MaxPool


@kernel("MaxPool")
def max_pool(
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    storage_order: int = 0,
    strides: Sequence[int] | None = None,
    out: np.ndarray | None = None,
    noutputs: int = 1,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    if x.dtype.kind not in "fiu":
        raise UnsupportedError(f"MaxPool input dtype {x.dtype} is not supported; use a float or integer type")
    if storage_order not in (0, 1):
        raise UnsupportedError(
            f"MaxPool storage_order={storage_order} is not supported; use 0 (row-major) or 1 (column-major)"
        )
    oshape, p, k, s, d = pool_setup(x, "MaxPool", kernel_shape, auto_pad, ceil_mode, dilations, pads, strides)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = pad_input(x, p, oshape, k, s, d, lowest)
    y = _target(out, x.shape[:2] + oshape, x.dtype)
    if noutputs < 2:
        _window_reduce(np.maximum, xp, k, s, d, oshape, y)
        return deliver(y, out, x.dtype)
    idx = _max_pool_argmax(x, xp, y, oshape, p, k, s, d, storage_order)
    return deliver(y, out, x.dtype), idx


def _max_pool_argmax(x, xp, y, oshape, p, k, s, d, storage_order) -> np.ndarray:
    """Fills y with the window maxima and returns their int64 indices into the flattened unpadded x, the first
    maximum in window order winning as in onnxruntime; padding never wins over a real element."""
    nd = len(oshape)
    sp = x.shape[2:]
    axes = range(nd) if storage_order == 0 else range(nd - 1, -1, -1)
    mult, acc = [0] * nd, 1
    for i in reversed(list(axes)):
        mult[i], acc = acc, acc * sp[i]
    idx = np.empty(y.shape, np.int64)
    real = np.empty(y.shape, bool)  # whether idx already points at a real (not padded) element
    for j, (off, sl) in enumerate(sliding_windows(k, s, d, oshape)):
        grid = [
            (np.arange(oshape[i], dtype=np.int64) * s[i] + off[i] * d[i] - p[i]).reshape(
                (-1,) + (1,) * (nd - 1 - i)
            )
            for i in range(nd)
        ]
        flat, valid = np.int64(0), np.bool_(True)
        for i, g in enumerate(grid):
            flat = flat + g * mult[i]
            valid = valid & (g >= 0) & (g < sp[i])
        v = xp[sl]
        if j == 0:
            np.copyto(y, v)
            np.copyto(idx, flat)
            np.copyto(real, valid)
            continue
        better = (v > y) | (~real & valid)
        np.copyto(y, v, where=better)
        np.copyto(idx, flat, where=better)
        real |= valid
    base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * nd)
    idx += base * math.prod(sp)
    return idx


# ---------------------------------------------------------------- AveragePool, LpPool


def avg_divisor(sp, oshape, p, k, s, d, count_include_pad: int, dtype) -> np.ndarray | float:
    """Per-output-position element count, as onnxruntime: real elements only, or every window position up to
    the end of the explicit pads (never the extra region ceil_mode adds)."""
    nd = len(oshape)
    counts = []
    for i in range(nd):
        start = np.arange(oshape[i]) * s[i] - p[i]
        if count_include_pad:
            end = np.minimum(start + k[i] * d[i], sp[i] + p[i + nd])
            cnt = 1 + (end - start - 1) // d[i]
        else:
            taps = start[:, None] + np.arange(k[i]) * d[i]
            cnt = ((taps >= 0) & (taps < sp[i])).sum(axis=1)
        counts.append(np.maximum(cnt, 1).reshape((-1,) + (1,) * (nd - 1 - i)))
    total = counts[0]
    for cnt in counts[1:]:
        total = total * cnt
    if np.all(total == total.flat[0]):
        return dtype.type(total.flat[0])
    return total.astype(dtype)


def _window_reduce(ufunc, xp: np.ndarray, k, s, d, oshape, y: np.ndarray) -> np.ndarray:
    """y = ufunc over the kernel offsets' strided slices of xp; the first two combined in one pass, not copied
    first (1.2x faster for 2x2 windows)."""
    views = [xp[sl] for _, sl in sliding_windows(k, s, d, oshape)]
    if len(views) == 1:
        np.copyto(y, views[0])
        return y
    ufunc(views[0], views[1], out=y)
    for v in views[2:]:
        ufunc(y, v, out=y)
    return y


@kernel("AveragePool")
def average_pool(
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    ct = compute_dtype(x, "AveragePool")
    oshape, p, k, s, d = pool_setup(
        x, "AveragePool", kernel_shape, auto_pad, ceil_mode, dilations, pads, strides
    )
    xp = pad_input(x.astype(ct, copy=False), p, oshape, k, s, d, 0)
    y = _window_reduce(np.add, xp, k, s, d, oshape, _target(out, x.shape[:2] + oshape, ct))
    y /= avg_divisor(x.shape[2:], oshape, p, k, s, d, count_include_pad, ct)
    return deliver(y, out, x.dtype)


@kernel("LpPool")
def lp_pool(
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    p: int = 2,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    ct = compute_dtype(x, "LpPool")
    if p < 1:
        raise UnsupportedError(f"LpPool p={p} is not supported; use an integer p >= 1")
    oshape, pp, k, s, d = pool_setup(x, "LpPool", kernel_shape, auto_pad, ceil_mode, dilations, pads, strides)
    xa = np.abs(x.astype(ct, copy=False))
    xa = np.square(xa, out=xa) if p == 2 else np.power(xa, ct.type(p), out=xa) if p > 1 else xa
    xp = pad_input(xa, pp, oshape, k, s, d, 0)
    y = _window_reduce(np.add, xp, k, s, d, oshape, _target(out, x.shape[:2] + oshape, ct))
    if p == 2:
        np.sqrt(y, out=y)
    elif p > 1:
        np.power(y, ct.type(1.0 / p), out=y)
    return deliver(y, out, x.dtype)


# ---------------------------------------------------------------- global pools, LRN


@kernel("GlobalAveragePool")
def global_average_pool(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    ct = compute_dtype(x, "GlobalAveragePool")
    nd = spatial_rank(x, "GlobalAveragePool")
    shape = x.shape[:2] + (1,) * nd
    y = _target(out, shape, ct)
    np.mean(x.reshape(x.shape[0], x.shape[1], -1), axis=2, dtype=ct, out=y.reshape(x.shape[:2]))
    return deliver(y, out, x.dtype)


@kernel("GlobalMaxPool")
def global_max_pool(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    if x.dtype.kind not in "fiu":
        raise UnsupportedError(
            f"GlobalMaxPool input dtype {x.dtype} is not supported; use a float or integer type"
        )
    nd = spatial_rank(x, "GlobalMaxPool")
    y = _target(out, x.shape[:2] + (1,) * nd, x.dtype)
    np.max(x.reshape(x.shape[0], x.shape[1], -1), axis=2, out=y.reshape(x.shape[:2]))
    return deliver(y, out, x.dtype)


@kernel("LRN")
def lrn(
    x: np.ndarray,
    *,
    alpha: float = 0.0001,
    beta: float = 0.75,
    bias: float = 1.0,
    size: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    ct = compute_dtype(x, "LRN")
    if size < 1:
        raise UnsupportedError(f"LRN size={size} is not supported; use a size >= 1")
    if x.ndim < 2:
        raise ShapeError(f"LRN needs an input of shape [N, C, ...], got {list(x.shape)}")
    xc = x.astype(ct, copy=False)
    c, lo = x.shape[1], (size - 1) // 2
    # sum of squares over the channel window [c - lo, c + size - 1 - lo]: `size` shifted slices of a
    # zero-padded copy (a running cumsum would lose precision over many channels)
    sq = np.zeros((x.shape[0], c + size - 1) + x.shape[2:], ct)
    np.square(xc, out=sq[:, lo : lo + c])
    den = sq[:, :c].copy()
    for j in range(1, size):
        den += sq[:, j : j + c]
    den *= ct.type(alpha / size)
    den += ct.type(bias)
    np.power(den, ct.type(beta), out=den)
    y = _target(out, x.shape, ct)
    np.divide(xc, den, out=y)
    return deliver(y, out, x.dtype)
