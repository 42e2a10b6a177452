"""Reduction kernels (numpy only): ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare,
ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin; and the sums the softmaxes and the
normalizations compute with."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgetrain.core.errors import ShapeError
from edgetrain.core.ir import Node

from .math import _axis, _blas_info, _work_dtype
from .registry import kernel, noop_reduction


def _reduce_axes(op: str, data: np.ndarray, axes: np.ndarray | None, noop: int) -> tuple[int, ...]:
    """The axes to reduce; () when the node is a no-op (empty axes with noop_with_empty_axes=1)."""
    if axes is None or np.size(axes) == 0:
        return () if noop else tuple(range(data.ndim))
    r = data.ndim
    got = [_axis(op, int(a), r, "axes") for a in np.asarray(axes).reshape(-1)]
    if len(set(got)) != len(got):
        raise ShapeError(f"{op}: axes {np.asarray(axes).tolist()} name an axis twice")
    return tuple(sorted(got))


def _count(data: np.ndarray, ax: tuple[int, ...]) -> int:
    return int(np.prod([data.shape[a] for a in ax], dtype=np.int64))


def _reduce(
    op: str,
    data,
    axes,
    keepdims,
    noop,
    fn: Callable[[np.ndarray, tuple, bool], np.ndarray],
    *,
    plain: bool = False,
) -> np.ndarray:
    """Shared frame: resolve axes, run fn(data, axes, keepdims) -> array, keep the input dtype.
    plain: a reduction whose no-op is the input itself (Sum, Mean, Max, Min, Prod): returned, not copied."""
    ax = _reduce_axes(op, data, axes, noop)
    if plain and not ax:
        return data
    res = np.asarray(fn(data, ax, bool(keepdims)))
    if res.dtype == data.dtype:
        return res
    with np.errstate(invalid="ignore"):  # integer log of 0: -inf becomes the dtype's minimum, as onnxruntime
        return res.astype(data.dtype)


def _row_sums(x2: np.ndarray) -> np.ndarray:
    """Row sums of a 2-D float array: einsum's SIMD sum is ~2x np.sum over short rows, and as fast as a BLAS
    matrix-vector product without BLAS threads fighting over the cores."""
    return np.einsum("ij->i", x2)


def _sum(x, ax, keep):
    if x.dtype.kind != "f":
        return np.sum(x, axis=ax, keepdims=keep, dtype=x.dtype)  # integer sums wrap in their own dtype
    w = _work_dtype(x.dtype)
    k = len(ax)
    if x.dtype == w and x.flags.c_contiguous and 0 < k < x.ndim and x.size and ax[0] == x.ndim - k:
        # Trailing axes (ReduceMean over H, W, say): one row per output.
        kept = x.shape[:-k]
        return _row_sums(x.reshape(-1, _count(x, ax))).reshape(kept + (1,) * k if keep else kept)
    return np.sum(x, axis=ax, keepdims=keep, dtype=w)


def _sum_square(x, ax, keep):
    x = x if x.dtype.kind != "f" else x.astype(_work_dtype(x.dtype), copy=False)
    return _sum(np.square(x), ax, keep)


def _float_then(f):
    """Wraps a float-only reduction so integer inputs go through float64 (truncated back, as onnxruntime)."""

    def run(x, ax, keep):
        return f(x.astype(_work_dtype(x.dtype), copy=False), ax, keep)

    return run


@kernel("ReduceSum", view="reshape", view_if=noop_reduction)
def reduce_sum(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    if (  # a bias gradient (dY [n, m] over the batch), the same sum as below without the axes' bookkeeping
        not keepdims
        and data.ndim == 2
        and axes is not None
        and axes.shape == (1,)
        and int(axes[0]) in (0, -2)
        and data.dtype.kind == "f"
        and data.dtype.itemsize >= 4
        and data.shape[0]
    ):
        return np.add.reduce(data, axis=0)
    return _reduce("ReduceSum", data, axes, keepdims, noop_with_empty_axes, _sum, plain=True)


def _mean(x, ax, keep):
    n = _count(x, ax)
    if x.dtype.kind in "iu":
        s = np.sum(x, axis=ax, keepdims=keep, dtype=x.dtype)
        if n == 0:
            return s
        q = s // n
        return q + ((q < 0) & (q * n != s))  # onnxruntime truncates toward zero, // floors
    return _sum(x, ax, keep) / max(n, 1)  # onnxruntime gives 0, not NaN, for the mean of an empty set


@kernel("ReduceMean", view="reshape", view_if=noop_reduction)
def reduce_mean(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce("ReduceMean", data, axes, keepdims, noop_with_empty_axes, _mean, plain=True)


def _extreme(ufunc: np.ufunc, x: np.ndarray, ax, keep):
    if _count(x, ax):
        return ufunc.reduce(x, axis=ax, keepdims=keep)
    # Empty set: the identity (-inf / the dtype's minimum for max), as the spec says.
    big = ufunc is np.minimum
    if x.dtype.kind == "f":
        ident = np.inf if big else -np.inf
    elif x.dtype.kind == "b":
        ident = big
    else:
        info = np.iinfo(x.dtype)
        ident = info.max if big else info.min
    return ufunc.reduce(x, axis=ax, keepdims=keep, initial=ident)


@kernel("ReduceMax", view="reshape", view_if=noop_reduction)
def reduce_max(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceMax",
        data,
        axes,
        keepdims,
        noop_with_empty_axes,
        lambda x, ax, k: _extreme(np.maximum, x, ax, k),
        plain=True,
    )


@kernel("ReduceMin", view="reshape", view_if=noop_reduction)
def reduce_min(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceMin",
        data,
        axes,
        keepdims,
        noop_with_empty_axes,
        lambda x, ax, k: _extreme(np.minimum, x, ax, k),
        plain=True,
    )


@kernel("ReduceProd", view="reshape", view_if=noop_reduction)
def reduce_prod(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceProd",
        data,
        axes,
        keepdims,
        noop_with_empty_axes,
        lambda x, ax, k: np.prod(
            x, axis=ax, keepdims=k, dtype=_work_dtype(x.dtype) if x.dtype.kind == "f" else x.dtype
        ),
        plain=True,
    )


@kernel("ReduceSumSquare")
def reduce_sum_square(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce("ReduceSumSquare", data, axes, keepdims, noop_with_empty_axes, _sum_square)


@kernel("ReduceL1")
def reduce_l1(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceL1", data, axes, keepdims, noop_with_empty_axes, lambda x, ax, k: _sum(np.abs(x), ax, k)
    )


@kernel("ReduceL2")
def reduce_l2(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceL2",
        data,
        axes,
        keepdims,
        noop_with_empty_axes,
        _float_then(lambda x, ax, k: np.sqrt(_sum_square(x, ax, k))),
    )


def _log(s):
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf is the spec's empty-set value
        return np.log(s)


@kernel("ReduceLogSum")
def reduce_log_sum(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce(
        "ReduceLogSum",
        data,
        axes,
        keepdims,
        noop_with_empty_axes,
        _float_then(lambda x, ax, k: _log(_sum(x, ax, k))),
    )


def _log_sum_exp(x, ax, keep):
    m = _extreme(np.maximum, x, ax, True)
    m = np.where(np.isfinite(m), m, 0)  # rows of -inf (or empty) would give inf - inf
    res = _log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
    return res if keep else np.squeeze(res, axis=ax)


@kernel("ReduceLogSumExp")
def reduce_log_sum_exp(
    data: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> np.ndarray:
    return _reduce("ReduceLogSumExp", data, axes, keepdims, noop_with_empty_axes, _float_then(_log_sum_exp))


def _arg(op: str, fn, data: np.ndarray, axis: int, keepdims: int, select_last_index: int) -> np.ndarray:
    ax = _axis(op, axis, data.ndim)
    if data.shape[ax] == 0:
        raise ShapeError(f"{op}: axis={axis} has length 0 in input shape {data.shape}")
    if select_last_index:
        idx = (data.shape[ax] - 1) - fn(np.flip(data, ax), axis=ax)
    else:
        idx = fn(data, axis=ax)
    idx = np.asarray(idx).astype(np.int64, copy=False)
    return np.expand_dims(idx, ax) if keepdims else idx


@kernel("ArgMax")
def argmax(data: np.ndarray, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> np.ndarray:
    return _arg("ArgMax", np.argmax, data, axis, keepdims, select_last_index)


@kernel("ArgMin")
def argmin(data: np.ndarray, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> np.ndarray:
    return _arg("ArgMin", np.argmin, data, axis, keepdims, select_last_index)


# -------------------------------------------------------------------------------- lean specialization (see math.py)


def _reduce_sum_lean(node: Node, infos, consts, out, shared):
    # the bias gradient (dY [n, m] summed over the batch, keepdims=0), straight into its buffer
    data, axes = infos[0], consts[1] if len(consts) > 1 else None
    if node.attrs.get("keepdims", 1) or axes is None or np.shape(axes) != (1,) or int(axes[0]) not in (0, -2):
        return None
    if not _blas_info(data) or not data.shape[0] or (out is not None and out.dtype != data.dtype):
        return None
    reduce = np.add.reduce
    return lambda data, axes=None: reduce(data, axis=0, out=out)


reduce_sum.lean = _reduce_sum_lean
