"""Normalization kernels (numpy only): BatchNormalization, LayerNormalization, InstanceNormalization,
GroupNormalization; and Dropout, which like BatchNormalization computes otherwise in training mode."""

from __future__ import annotations

import numpy as np

from edgetrain.core.errors import ModelError, ShapeError, UnsupportedError

from .math import _axis, _broadcasts_to, _scale_shift, _work_dtype
from .reductions import _row_sums
from .registry import inference_dropout, kernel

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
