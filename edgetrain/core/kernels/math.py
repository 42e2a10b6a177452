"""Math kernels (arrays -> arrays): MatMul, Gemm, softmaxes, reductions, norms, Dropout, Einsum, CumSum."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from edgetrain.core.errors import ModelError, ShapeError, UnsupportedError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from .registry import inference_dropout, kernel, noop_reduction

# -------------------------------------------------------------------------------- helpers


def _axis(op: str, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{op}: {name}={axis} is out of range for an input of rank {rank} "
            f"(supported: {-rank}..{rank - 1})"
        )
    return axis % rank


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The float dtype to compute in: float16 in float32, like onnxruntime; integers in float64."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return dtype
    return np.dtype(np.float64) if dtype.kind in "iub" else np.dtype(np.float32)


def _store(y: np.ndarray, dtype: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """y (computed in a work dtype) as the result: cast to dtype, into out when given."""
    if out is not None:
        if y is not out:
            np.copyto(out, y, casting="unsafe")
        return out
    return y if y.dtype == dtype else y.astype(dtype)


def _scale_shift(d: np.ndarray, scale, shift, dtype: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """d * scale + shift, overwriting the temporary d, or straight into out when no cast is needed."""
    y = out if out is not None and d.dtype == dtype else d
    np.multiply(d, scale, out=y, casting="same_kind")
    if shift is not None:
        np.add(y, shift, out=y, casting="same_kind")
    return _store(y, dtype, out)


# -------------------------------------------------------------------------------- MatMul, Gemm


def _matmul(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    try:
        if a.dtype == np.float16 and b.dtype == np.float16:
            # numpy's float16 matmul has no BLAS path and accumulates in float16: go through float32.
            return _store(np.asarray(np.matmul(a.astype(np.float32), b.astype(np.float32))), a.dtype, out)
        if (
            a.ndim == 2
            and b.ndim == 2
            and a.dtype == b.dtype
            and a.dtype.kind == "f"
            and a.dtype.itemsize >= 4
        ):
            # np.dot goes to BLAS gemm for every 2-D layout; np.matmul does not for some (an outer product, k=1,
            # is 5-7x slower through it): the same products either way
            if out is None or (out.flags.c_contiguous and out.dtype == a.dtype):
                return np.dot(a, b, out=out)
        # np.asarray: 1-D @ 1-D gives a numpy scalar.
        return np.asarray(np.matmul(a, b, out=out))
    except ValueError as e:
        raise ShapeError(
            f"{op}: input shapes {a.shape} and {b.shape} do not fit "
            f"(inner dimensions must match, batch dimensions broadcast): {e}"
        ) from e


@kernel("MatMul")
def matmul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _matmul("MatMul", a, b, out)


@kernel("Gemm")
def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    a = a.T if transA else a
    b = b.T if transB else b
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"Gemm: A{'^T' if transA else ''} {a.shape} and B{'^T' if transB else ''} {b.shape} "
            "must be matrices (M, K) and (K, N)"
        )
    use_c = c is not None and beta != 0
    if use_c and not _broadcasts_to(c.shape, (a.shape[0], b.shape[1])):
        raise ShapeError(f"Gemm: C {c.shape} does not broadcast to the result {(a.shape[0], b.shape[1])}")
    y = _matmul("Gemm", a, b, out)
    # In place on y; 'unsafe' only matters for integer Gemm with a fractional alpha/beta.
    if alpha != 1:
        np.multiply(y, alpha, out=y, casting="unsafe")
    if use_c:
        np.add(y, c if beta == 1 else beta * c, out=y, casting="unsafe")
    return y


# -------------------------------------------------------------------------------- Softmax family


def _shifted(op: str, x: np.ndarray, axis: int, out: np.ndarray | None) -> tuple[np.ndarray, int]:
    """x - max(x, axis) in the work dtype (into out when it has that dtype), and the axis normalised."""
    ax = _axis(op, axis, x.ndim)
    w = _work_dtype(x.dtype)
    xw = x if x.dtype == w else x.astype(w)
    m = np.max(xw, axis=ax, keepdims=True) if x.size else 0
    return np.subtract(xw, m, out=out if out is not None and out.dtype == w else None), ax


@kernel("Softmax")
def softmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    y, ax = _shifted("Softmax", x, axis, out)
    np.exp(y, out=y)
    y /= _sum(y, (ax,), True)
    return _store(y, x.dtype, out)


@kernel("LogSoftmax")
def log_softmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    y, ax = _shifted("LogSoftmax", x, axis, out)
    y -= np.log(_sum(np.exp(y), (ax,), True))
    return _store(y, x.dtype, out)


def _ce_weights(target: np.ndarray, c: int, dtype, label_smoothing: float, ignore_index) -> tuple:
    """(the smoothed one-hot target rows [n, c], the kept rows as 0/1 or None) of a cross-entropy."""
    n = target.shape[0]
    keep = None if ignore_index is None else (target != ignore_index)
    idx = target if keep is None else np.where(keep, target, 0)
    w = np.zeros((n, c), dtype)
    w[np.arange(n), idx] = 1
    if label_smoothing:
        w *= dtype.type(1.0 - label_smoothing)
        w += dtype.type(label_smoothing / c)
    return w, None if keep is None else keep.astype(dtype)


def _plain_ce(x: np.ndarray, label_smoothing: float, ignore_index) -> bool:
    """No smoothing, no ignored rows, float32/64 logits, rows at all: the case the short paths below take."""
    return (
        not label_smoothing
        and ignore_index is None
        and x.dtype.kind == "f"
        and x.dtype.itemsize >= 4
        and len(x) > 0
    )


def _shifted_rows(x: np.ndarray) -> np.ndarray:
    """x [n, c] minus each row's maximum (keepdims=True would cost more than the whole subtraction)."""
    return x - np.maximum.reduce(x, axis=1)[:, None]


def _softmax_cross_entropy_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    x = infos[0]
    reduced = node.attrs.get("reduction", "mean") in ("mean", "sum")
    return [TensorInfo(x.dtype, () if reduced else tuple(x.shape[:1]))]


@kernel("SoftmaxCrossEntropy", domain=PRIVATE_DOMAIN, shape=_softmax_cross_entropy_shape)
def softmax_cross_entropy(
    x: np.ndarray,
    target: np.ndarray,
    *,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
) -> np.ndarray:
    """The cross-entropy of logits x [n, c] against class labels [n] as CrossEntropyLoss builds it in standard ops
    (log-softmax, smoothed one-hot, the rows an ignore_index leaves out), in a few numpy calls."""
    if _plain_ce(x, label_smoothing, ignore_index):
        # the plain case in eight calls: log-sum-exp of the shifted rows minus each row's picked logit
        y = _shifted_rows(x)
        lse = np.log(np.add.reduce(np.exp(y), axis=1))
        nll = lse - y[np.arange(len(y)), target]
        total = np.add.reduce(nll)
        return np.asarray(total / x.dtype.type(len(nll)) if reduction == "mean" else total, x.dtype)
    logp = log_softmax(x, axis=1)
    w, keep = _ce_weights(target, x.shape[1], logp.dtype, label_smoothing, ignore_index)
    nll = -np.einsum("nc,nc->n", w, logp)
    if keep is None:
        total = nll.sum(dtype=nll.dtype)
        return np.asarray(total / nll.dtype.type(len(nll)) if reduction == "mean" else total, x.dtype)
    total = np.dot(nll, keep)
    return np.asarray(total / keep.sum(dtype=keep.dtype) if reduction == "mean" else total, x.dtype)


@kernel("SoftmaxCrossEntropyGrad", domain=PRIVATE_DOMAIN, shape=lambda node, infos: [infos[0]])
def softmax_cross_entropy_grad(
    x: np.ndarray,
    target: np.ndarray,
    dloss: np.ndarray,
    *,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """d loss / d x = dloss * (softmax(x) - smoothed one-hot) / (rows counted), left-out rows 0."""
    if _plain_ce(x, label_smoothing, ignore_index):
        p = np.exp(_shifted_rows(x), out=out)
        n = len(p)
        scale = np.asarray(dloss, p.dtype) / (p.dtype.type(n) if reduction == "mean" else p.dtype.type(1))
        np.multiply(p, np.divide(scale, np.add.reduce(p, axis=1))[:, None], out=p)
        p[np.arange(n), target] -= scale
        return p
    p = np.exp(log_softmax(x, axis=1))
    w, keep = _ce_weights(target, x.shape[1], p.dtype, label_smoothing, ignore_index)
    np.subtract(p, w, out=p)
    count = len(p) if keep is None else keep.sum(dtype=p.dtype)
    scale = np.asarray(dloss, p.dtype) / (p.dtype.type(count) if reduction == "mean" else p.dtype.type(1))
    if keep is not None:
        p *= keep[:, None]
    return _store(np.multiply(p, scale, out=p), x.dtype, out)


@kernel("Hardmax")
def hardmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    ax = _axis("Hardmax", axis, x.ndim)
    y = np.zeros_like(x) if out is None else out
    if out is not None:
        y.fill(0)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=ax), ax), 1, axis=ax)
    return y


# -------------------------------------------------------------------------------- reductions


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


# -------------------------------------------------------------------------------- normalisation


def _check_channels(op: str, x: np.ndarray, **params: np.ndarray | None) -> None:
    if x.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C, ...), got shape {x.shape}")
    for name, p in params.items():
        if p is not None and p.shape != (x.shape[1],):
            raise ShapeError(
                f"{op}: {name} must have shape ({x.shape[1]},) for input {x.shape}, got {p.shape}"
            )


def _view(out: np.ndarray | None, *shape: int) -> np.ndarray | None:
    """out reshaped without a copy (the interpreter's buffers are contiguous), to write the result into."""
    if out is None:
        return None
    assert out.flags.c_contiguous, "out= buffers must be C-contiguous"
    return out.reshape(shape)


def _buf(out: np.ndarray | None, dtype: np.dtype, *shape: int) -> np.ndarray | None:
    """out as scratch for the work-dtype intermediate, when it has that dtype."""
    return _view(out, *shape) if out is not None and out.dtype == dtype else None


def _standardise(x2: np.ndarray, epsilon: float, buf: np.ndarray | None = None):
    """Rows of the 2-D x2 centred: d = x - mean (written into buf when given), mean and 1/sqrt(var + eps)
    as (rows, 1) columns. Two passes (centre, then sum squares) for accuracy; einsum sums squares without
    a temporary."""
    n = max(x2.shape[1], 1)
    mean = (_row_sums(x2) / n)[:, None]
    d = np.subtract(x2, mean, out=buf)
    var = np.einsum("ij,ij->i", d, d)[:, None] / n
    return d, mean, 1 / np.sqrt(var + epsilon)


def _per_row(p: np.ndarray, n: int) -> np.ndarray:
    """A per-channel (C,) parameter as a column for the (N*C, -1) view of an (N, C, ...) tensor."""
    return np.tile(p, n)[:, None]


@kernel("BatchNormalization")
def batch_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    input_mean: np.ndarray,
    input_var: np.ndarray,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
    noutputs: int,
    out: np.ndarray | None = None,
):
    _check_channels("BatchNormalization", x, scale=scale, B=b, input_mean=input_mean, input_var=input_var)
    bshape = (-1,) + (1,) * (x.ndim - 2)
    if not training_mode:
        if noutputs > 1:
            raise ModelError(
                f"BatchNormalization: training_mode=0 has the one output Y, the node asks for "
                f"{noutputs} (running_mean/running_var exist only with training_mode=1)"
            )
        # One fused per-channel scale/shift: y = x * a + (B - mean * a), a = scale / sqrt(var + eps);
        # the (C,) factors in float64 (cheap), so float16 parameters lose nothing before the cast.
        a = scale.astype(np.float64) / np.sqrt(input_var.astype(np.float64) + epsilon)
        shift = (b - input_mean.astype(np.float64) * a).astype(x.dtype).reshape(bshape)
        y = np.multiply(x, a.astype(x.dtype).reshape(bshape), out=out)
        y += shift
        return y
    # Batch statistics over all axes but 1, on the (N, C, S) view.
    w = _work_dtype(x.dtype)
    n, c = x.shape[:2]
    x2 = x.astype(w, copy=False).reshape(n * c, -1)
    count = max(n * x2.shape[1], 1)
    mean = np.einsum("ncs->c", x2.reshape(n, c, -1)) / count
    d = np.subtract(x2.reshape(n, c, -1), mean[:, None], out=_buf(out, w, n, c, -1))
    var = np.einsum("ncs,ncs->c", d, d) / count
    a = scale / np.sqrt(var + epsilon)
    y = _scale_shift(d, a[:, None], b[:, None], x.dtype, _view(out, n, c, -1))
    y = out if out is not None else y.reshape(x.shape)
    if noutputs == 1:
        return y
    running_mean = (input_mean * momentum + mean * (1 - momentum)).astype(input_mean.dtype, copy=False)
    running_var = (input_var * momentum + var * (1 - momentum)).astype(input_var.dtype, copy=False)
    return (y, running_mean, running_var)[:noutputs]


def _check_stash(op: str, stash_type: int) -> None:
    if stash_type != 1:
        raise UnsupportedError(f"{op}: stash_type={stash_type} is not supported (supported: 1, float32)")


@kernel("LayerNormalization")
def layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    noutputs: int,
    out: np.ndarray | None = None,
):
    _check_stash("LayerNormalization", stash_type)
    ax = _axis("LayerNormalization", axis, x.ndim)
    inner = x.shape[ax:]
    for name, p in (("Scale", scale), ("B", b)):
        if p is not None and not _broadcasts_to(p.shape, inner):
            raise ShapeError(
                f"LayerNormalization: {name} {p.shape} does not broadcast to {inner} "
                f"(the input's dims from axis={axis})"
            )
    # stash_type=1: at least float32 (float64 input stays float64, as onnxruntime).
    w = _work_dtype(x.dtype)
    rows = int(np.prod(x.shape[:ax], dtype=np.int64))
    x2 = x.astype(w, copy=False).reshape(rows, -1)
    d, mean, inv_std = _standardise(x2, epsilon, _buf(out, w, rows, -1))
    d *= inv_std
    y = _scale_shift(d.reshape(x.shape), scale, b, x.dtype, out)
    if noutputs == 1:
        return y
    stat_shape = x.shape[:ax] + (1,) * len(inner)
    stats = (mean.reshape(stat_shape).astype(np.float32), inv_std.reshape(stat_shape).astype(np.float32))
    return (y, *stats)[:noutputs]


@kernel("InstanceNormalization")
def instance_normalization(
    x: np.ndarray, scale: np.ndarray, b: np.ndarray, *, epsilon: float = 1e-5, out: np.ndarray | None = None
) -> np.ndarray:
    _check_channels("InstanceNormalization", x, scale=scale, B=b)
    n, c = x.shape[:2]
    w = _work_dtype(x.dtype)
    d, _, inv_std = _standardise(x.astype(w, copy=False).reshape(n * c, -1), epsilon, _buf(out, w, n * c, -1))
    # scale folded into the per-(n, c) factor: one multiply pass over the data.
    y = _scale_shift(d, inv_std * _per_row(scale, n), _per_row(b, n), x.dtype, _view(out, n * c, -1))
    return y.reshape(x.shape) if out is None else out


@kernel("GroupNormalization")
def group_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    epsilon: float = 1e-5,
    num_groups: int,
    stash_type: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    _check_stash("GroupNormalization", stash_type)
    _check_channels("GroupNormalization", x, scale=scale, bias=bias)
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ShapeError(f"GroupNormalization: num_groups={num_groups} must divide the {c} channels")
    w = _work_dtype(x.dtype)
    g = num_groups
    d, _, inv_std = _standardise(x.astype(w, copy=False).reshape(n * g, -1), epsilon, _buf(out, w, n * g, -1))
    # Per-(n, c) factor: the group's 1/std times the channel's scale, so one multiply pass over the data.
    a = np.repeat(inv_std.reshape(n, g), c // g, axis=1) * scale
    d = d.reshape(n * c, -1)
    y = _scale_shift(d, a.reshape(-1, 1), _per_row(bias, n), x.dtype, _view(out, n * c, -1))
    return y.reshape(x.shape) if out is None else out


# -------------------------------------------------------------------------------- Dropout


@kernel("Dropout", view="reshape", view_if=inference_dropout)
def dropout(
    data: np.ndarray,
    ratio: np.ndarray | None = None,
    training_mode: np.ndarray | None = None,
    *,
    seed: int | None = None,
    noutputs: int,
):
    r = 0.5 if ratio is None else float(np.asarray(ratio).item())
    if not 0 <= r < 1:
        raise UnsupportedError(f"Dropout: ratio={r} is not supported (supported: 0 <= ratio < 1)")
    if training_mode is None or not np.asarray(training_mode).item() or r == 0:
        # Inference (or nothing to drop): the input itself, no copy.
        return (data, np.ones(data.shape, np.bool_)) if noutputs > 1 else data
    mask = np.random.default_rng(seed).random(data.shape, dtype=np.float32) >= r
    y = data * np.asarray(1 / (1 - r), dtype=data.dtype)  # inverted dropout: E[y] = x
    y *= mask
    return (y, mask) if noutputs > 1 else y


# -------------------------------------------------------------------------------- Einsum, CumSum

_EQUATION = re.compile(r"^\s*([A-Za-z.\s]*)((\s*,\s*[A-Za-z.\s]*)*)(->\s*[A-Za-z.\s]*)?$")


@kernel("Einsum")
def einsum(*inputs: np.ndarray, equation: str) -> np.ndarray:
    lhs = equation.split("->")[0]
    if not _EQUATION.match(equation) or lhs.count(",") + 1 != len(inputs):
        raise UnsupportedError(
            f"Einsum: equation={equation!r} is not valid for {len(inputs)} inputs "
            "(supported: numpy einsum syntax, e.g. 'bij,bjk->bik', '...ii->...i')"
        )
    # Extension float types (ml_dtypes' bfloat16) have no einsum loops: compute in float32, cast back.
    dt = inputs[0].dtype
    ops = [x.astype(np.float32) if x.dtype.kind == "V" else x for x in inputs]
    try:
        res = np.asarray(np.einsum(equation, *ops, optimize=True))
    except ValueError as e:
        raise ShapeError(
            f"Einsum: equation={equation!r} does not fit input shapes {[x.shape for x in inputs]}: {e}"
        ) from e
    # einsum may return a view of an input ('ij->ji'); outputs must own their memory for the arena.
    if any(np.may_share_memory(res, x) for x in ops):
        res = res.copy()
    return res if res.dtype == dt else res.astype(dt)


@kernel("CumSum")
def cumsum(
    x: np.ndarray, axis: np.ndarray, *, exclusive: int = 0, reverse: int = 0, out: np.ndarray | None = None
) -> np.ndarray:
    if np.size(axis) != 1:
        raise ShapeError(f"CumSum: axis must be a scalar tensor, got shape {np.shape(axis)}")
    ax = _axis("CumSum", int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    y = np.empty_like(x) if out is None else out
    xs, ys = (np.flip(x, ax), np.flip(y, ax)) if reverse else (x, y)
    if exclusive:
        n = x.shape[ax]

        def part(a, start, stop):
            return a[(slice(None),) * ax + (slice(start, stop),)]

        part(ys, 0, 1)[...] = 0
        np.cumsum(part(xs, 0, max(n - 1, 0)), axis=ax, dtype=x.dtype, out=part(ys, 1, None))
    else:
        np.cumsum(xs, axis=ax, dtype=x.dtype, out=ys)
    return y


# -------------------------------------------------------------------------------- lean specializations
# A kernel's `lean` builder: (node, input TensorInfos, constant inputs, the output's buffer or None, a dict the
# program's builders share) -> a function of the node's inputs, or None where the plain kernel must run. The
# interpreter asks for one when it compiles a training step (fastpaths "lean_kernels"): the step's shapes are
# static and its feeds checked, so the checks and dispatch a small batch pays on every call are done here once.
# Each runs the plain kernel's numpy calls in its order (bit for bit its result), only fewer of the others.

# elements: scratch a specialization keeps per program stays this small (256 KiB of float32)
_LEAN_SCRATCH = 1 << 16
# np.dot without its __array_function__ dispatch (a Python call per product): the same C function
_DOT = getattr(np.dot, "_implementation", np.dot)


def _blas_info(info: TensorInfo | None) -> bool:
    return info is not None and len(info.shape) == 2 and info.dtype.kind == "f" and info.dtype.itemsize >= 4


def _writable(out: np.ndarray | None, dtype: np.dtype) -> bool:
    """Whether out is a buffer np.dot writes straight into (else the plain kernel goes through np.matmul)."""
    return out is None or (out.flags.c_contiguous and out.dtype == dtype)


def _gemm_lean(node: Node, infos, consts, out, shared):
    # np.dot into the output's buffer with the transposes as views (BLAS reads them as they are), then the bias
    # added there: gemm()'s calls without its checks and broadcasting bookkeeping.
    a, b = infos[0], infos[1]
    c = infos[2] if len(infos) > 2 else None
    at = node.attrs
    ta, tb = bool(at.get("transA", 0)), bool(at.get("transB", 0))
    if at.get("alpha", 1.0) != 1 or not (_blas_info(a) and _blas_info(b)) or a.dtype != b.dtype:
        return None
    m, k = a.shape[::-1] if ta else a.shape
    k2, n = b.shape[::-1] if tb else b.shape
    use_c = c is not None and at.get("beta", 1.0) != 0
    if k != k2 or not _writable(out, a.dtype):
        return None
    if use_c and (at.get("beta", 1.0) != 1 or c.dtype != a.dtype or not _broadcasts_to(c.shape, (m, n))):
        return None
    dot, add = _DOT, np.add

    def gemm_lean(a, b, c=None):
        y = dot(a.T if ta else a, b.T if tb else b, out=out)
        if use_c:
            add(y, c, out=y)
        return y

    return gemm_lean


def _matmul_lean(node: Node, infos, consts, out, shared):
    a, b = infos
    if not (_blas_info(a) and _blas_info(b)) or a.dtype != b.dtype or not _writable(out, a.dtype):
        return None
    dot = _DOT
    return lambda a, b: dot(a, b, out=out)


def _reduce_sum_lean(node: Node, infos, consts, out, shared):
    # the bias gradient (dY [n, m] summed over the batch, keepdims=0), straight into its buffer
    data, axes = infos[0], consts[1] if len(consts) > 1 else None
    if node.attrs.get("keepdims", 1) or axes is None or np.shape(axes) != (1,) or int(axes[0]) not in (0, -2):
        return None
    if not _blas_info(data) or not data.shape[0] or (out is not None and out.dtype != data.dtype):
        return None
    reduce = np.add.reduce
    return lambda data, axes=None: reduce(data, axis=0, out=out)


gemm.lean = _gemm_lean
matmul.lean = _matmul_lean
reduce_sum.lean = _reduce_sum_lean


class _CrossEntropyRows:
    """What SoftmaxCrossEntropy's specialization leaves for its gradient's, in one program: exp(x - row max) and
    its row sums, which the plain gradient kernel computes again from the same logits with the same calls. The
    loss node runs before its gradient node in every run of the step (the gradient reads the loss's seed), so
    the gradient always finds them of this run."""

    def __init__(self, n: int, c: int, dtype: np.dtype):
        self.e = np.empty((n, c), dtype)
        self.s = np.empty(n, dtype)
        self.rows = np.arange(n)
        self.n = dtype.type(n)


def _ce_lean_ok(node: Node, infos) -> bool:
    x, t = infos[0], infos[1]
    at = node.attrs
    plain = not at.get("label_smoothing", 0.0) and at.get("ignore_index") is None
    return (
        plain
        and at.get("reduction", "mean") in ("mean", "sum")
        and _blas_info(x)
        and x.shape[0] > 0
        and len(t.shape) == 1
        and x.shape[0] * x.shape[1] <= _LEAN_SCRATCH
    )


def _softmax_cross_entropy_lean(node: Node, infos, consts, out, shared):
    if not _ce_lean_ok(node, infos):
        return None
    x = infos[0]
    rows = shared[("SoftmaxCrossEntropy", node.inputs[0], node.inputs[1])] = _CrossEntropyRows(
        *x.shape, x.dtype
    )
    e, s, ar, n = rows.e, rows.s, rows.rows, rows.n
    mean = node.attrs.get("reduction", "mean") == "mean"
    maxr, sub, exp, addr, log, asarray, dt = (
        np.maximum.reduce,
        np.subtract,
        np.exp,
        np.add.reduce,
        np.log,
        np.asarray,
        x.dtype,
    )

    def softmax_cross_entropy_lean(x, target):
        # softmax_cross_entropy's plain case; x[i, t] - max_i is the very subtraction that gives y[i, t] there
        m = maxr(x, axis=1)
        sub(x, m[:, None], out=e)
        exp(e, out=e)
        nll = log(addr(e, axis=1, out=s)) - (x[ar, target] - m)
        total = addr(nll)
        return asarray(total / n if mean else total, dt)

    return softmax_cross_entropy_lean


def _softmax_cross_entropy_grad_lean(node: Node, infos, consts, out, shared):
    rows = shared.get(("SoftmaxCrossEntropy", node.inputs[0], node.inputs[1]))
    if rows is None or not _ce_lean_ok(node, infos) or out is None or out.dtype != infos[0].dtype:
        return None
    e, s, ar = rows.e, rows.s, rows.rows
    count = rows.n if node.attrs.get("reduction", "mean") == "mean" else infos[0].dtype.type(1)
    mul, div, asarray, dt = np.multiply, np.divide, np.asarray, infos[0].dtype
    seed = consts[2]  # the loss's seed is a constant of the step: its scale is computed once
    fixed = None if seed is None else asarray(seed, dt) / count

    def softmax_cross_entropy_grad_lean(x, target, dloss):
        # softmax_cross_entropy_grad's plain case on the loss's exp and row sums
        scale = asarray(dloss, dt) / count if fixed is None else fixed
        mul(e, div(scale, s)[:, None], out=out)
        out[ar, target] -= scale
        return out

    return softmax_cross_entropy_grad_lean


softmax_cross_entropy.lean = _softmax_cross_entropy_lean
softmax_cross_entropy_grad.lean = _softmax_cross_entropy_grad_lean
