"""Indexing kernels (data, index tensors -> gathered, scattered, one-hot, nonzero, top-k arrays)."""

from __future__ import annotations

import math

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError

from ._util import _axis
from .registry import kernel


# ------------------------------------------------ gather and scatter
def _out_of_range(op: str, what: str, err: IndexError) -> ShapeError:
    return ShapeError(f"{op}: {what} holds an index out of range ({err})")


@kernel("Gather")
def gather(
    data: np.ndarray, indices: np.ndarray, *, axis: int = 0, out: np.ndarray | None = None
) -> np.ndarray:
    a = _axis(axis, data.ndim)
    try:  # negative indices count from the end, as the spec says
        return np.asarray(np.take(data, indices, axis=a, out=out))  # 0-d indices into 1-D data: no scalar
    except IndexError as e:
        raise _out_of_range("Gather", "indices", e) from None


def _along_axis(op: str, data: np.ndarray, indices: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """The fancy index that picks data[..., indices[i, j, ...], ...] along axis (indices may be smaller than
    data on the other axes, which np.take_along_axis does not allow)."""
    a = _axis(axis, data.ndim)
    fits = indices.ndim == data.ndim and all(
        n <= d or i == a for i, (n, d) in enumerate(zip(indices.shape, data.shape, strict=True))
    )
    if not fits:
        raise ShapeError(
            f"{op}: indices shape {list(indices.shape)} does not fit data shape "
            f"{list(data.shape)} outside axis={axis}"
        )
    r = indices.ndim
    return tuple(
        indices if i == a else np.arange(n).reshape([-1 if j == i else 1 for j in range(r)])
        for i, n in enumerate(indices.shape)
    )


@kernel("GatherElements")
def gather_elements(data: np.ndarray, indices: np.ndarray, *, axis: int = 0) -> np.ndarray:
    idx = _along_axis("GatherElements", data, indices, axis)
    try:
        return data[idx]
    except IndexError as e:
        raise _out_of_range("GatherElements", "indices", e) from None


@kernel("GatherND")
def gather_nd(data: np.ndarray, indices: np.ndarray, *, batch_dims: int = 0) -> np.ndarray:
    b, k = batch_dims, indices.shape[-1]
    if indices.shape[:b] != data.shape[:b] or not 1 <= k <= data.ndim - b:
        raise ShapeError(
            f"GatherND: indices shape {list(indices.shape)} does not fit data shape "
            f"{list(data.shape)} with batch_dims={b}"
        )
    nb, m = math.prod(data.shape[:b]), math.prod(indices.shape[b:-1])
    d = data.reshape((nb,) + data.shape[b:])
    ix = indices.reshape(nb, m, k)
    try:
        res = d[(np.arange(nb)[:, None],) + tuple(ix[..., j] for j in range(k))]
    except IndexError as e:
        raise _out_of_range("GatherND", "indices", e) from None
    return res.reshape(indices.shape[:-1] + data.shape[b + k :])


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _wrap_index(op: str, ind: np.ndarray, n) -> np.ndarray:
    """Indices in [-n, n - 1] (n may be one size per column) made non-negative; others are a user error."""
    if ind.size and ((ind < -n) | (ind >= n)).any():
        raise ShapeError(f"{op}: indices hold an index out of range (accepted [-n, n - 1] for sizes {n})")
    return np.where(ind < 0, ind + n, ind).astype(np.int64, copy=False)


def _scatter(op: str, data, shape2: tuple[int, int], pos, vals, reduction: str, out):
    """A copy of data seen as shape2 = (rows, row length), with vals[i] written or reduced into row pos[i]."""
    if reduction != "none" and reduction not in _REDUCTIONS:
        raise UnsupportedError(
            f"{op}: reduction={reduction!r} is not supported; supported: {['none', *_REDUCTIONS]}"
        )
    res = data.copy() if out is None or not out.flags.c_contiguous else out
    if res is out:
        np.copyto(res, data)
    if reduction == "none":
        res.reshape(shape2)[pos] = vals
    elif shape2[1] == 1:  # single elements: ufunc.at is fast here (numpy >= 1.25)
        _REDUCTIONS[reduction].at(res.reshape(-1), pos, vals.reshape(-1))
    elif len(pos):
        _reduce_into(res.reshape(shape2), pos, vals, _REDUCTIONS[reduction])
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


def _reduce_into(rows: np.ndarray, pos: np.ndarray, vals: np.ndarray, ufunc: np.ufunc) -> None:
    """rows[pos[i]] = ufunc(rows[pos[i]], vals[i]) in update order, duplicates included; ~2x faster than
    ufunc.at on rows of 64 (numpy 2.4). A stable sort makes each target's updates a run; runs of one merge in
    one vectorised call, longer runs fold with one reduceat (only the float rounding order differs)."""
    order = np.argsort(pos, kind="stable")
    p, v = pos[order], vals[order]
    first = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1])))
    length = np.diff(np.append(first, len(p)))
    single = first[length == 1]
    rows[p[single]] = ufunc(rows[p[single]], v[single])
    many = length > 1
    if many.any():  # reduceat pays per run: give it the runs that need folding only
        starts = np.concatenate(([0], np.cumsum(length[many])[:-1]))
        target = p[first[many]]
        rows[target] = ufunc(rows[target], ufunc.reduceat(v[np.repeat(many, length)], starts, axis=0))


@kernel("ScatterElements")
def scatter_elements(
    data: np.ndarray,
    indices: np.ndarray,
    updates: np.ndarray,
    *,
    axis: int = 0,
    reduction: str = "none",
    out: np.ndarray | None = None,
) -> np.ndarray:
    if updates.shape != indices.shape:
        raise ShapeError(
            f"ScatterElements: updates shape {list(updates.shape)} != indices shape {list(indices.shape)}"
        )
    idx = list(_along_axis("ScatterElements", data, indices, axis))
    a = _axis(axis, data.ndim)
    idx[a] = _wrap_index("ScatterElements", indices, data.shape[a])
    pos = sum(i * math.prod(data.shape[d + 1 :]) for d, i in enumerate(idx))  # flat offsets into data
    pos = np.broadcast_to(pos, indices.shape).reshape(-1)
    return _scatter("ScatterElements", data, (data.size, 1), pos, updates.reshape(-1, 1), reduction, out)


@kernel("ScatterND")
def scatter_nd(
    data: np.ndarray,
    indices: np.ndarray,
    updates: np.ndarray,
    *,
    reduction: str = "none",
    out: np.ndarray | None = None,
) -> np.ndarray:
    k = indices.shape[-1]
    if not 1 <= k <= data.ndim or updates.shape != indices.shape[:-1] + data.shape[k:]:
        raise ShapeError(
            f"ScatterND: indices shape {list(indices.shape)} and updates shape "
            f"{list(updates.shape)} do not fit data shape {list(data.shape)}"
        )
    ind = _wrap_index("ScatterND", indices.reshape(-1, k), np.array(data.shape[:k]))
    strides = np.array([math.prod(data.shape[d + 1 : k]) for d in range(k)], np.int64)
    pos = (ind * strides).sum(axis=1)  # row of data seen as (prod(shape[:k]), prod(shape[k:]))
    shape2 = (math.prod(data.shape[:k]), math.prod(data.shape[k:]))
    return _scatter("ScatterND", data, shape2, pos, updates.reshape(len(pos), shape2[1]), reduction, out)


@kernel("OneHot")
def one_hot(indices: np.ndarray, depth: np.ndarray, values: np.ndarray, *, axis: int = -1) -> np.ndarray:
    n = int(np.asarray(depth).reshape(-1)[0])
    r = indices.ndim
    if not -r - 1 <= axis <= r:
        raise ShapeError(
            f"OneHot: axis={axis} is out of range for indices of rank {r} (accepted [{-r - 1}, {r}])"
        )
    a = axis % (r + 1)
    ind = indices.astype(np.int64)
    ind = np.where(ind < 0, ind + n, ind)  # [-depth, -1] counts from depth; other out-of-range rows stay off
    mask = np.expand_dims(ind, a) == np.arange(n).reshape([-1 if i == a else 1 for i in range(r + 1)])
    vals = np.asarray(values).reshape(-1)
    return np.where(mask, vals[1:2], vals[0:1])  # 1-element arrays keep the values' dtype (no promotion)


# ------------------------------------------------ NonZero, TopK
@kernel("NonZero")
def non_zero(X: np.ndarray) -> np.ndarray:
    x = X.reshape(1) if X.ndim == 0 else X  # a scalar answers as a 1-D tensor, like onnxruntime
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@kernel("TopK")
def top_k(
    X: np.ndarray, K: np.ndarray, *, axis: int = -1, largest: int = 1, sorted: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    a = _axis(axis, X.ndim)
    k, n = int(np.asarray(K).reshape(-1)[0]), X.shape[a]
    if not 0 <= k <= n:
        raise ShapeError(f"TopK: K={k} is out of range for axis {axis} of size {n}")
    # A stable sort breaks ties by lower index first. For largest, sort the reversed axis ascending and read
    # it backwards: equal values then come out lowest index first too (no negation: it breaks unsigned ints).
    # sorted=0 leaves the order free; a sorted answer is one.
    if largest:
        order = np.argsort(np.flip(X, a), axis=a, kind="stable")
        idx = (n - 1) - np.flip(order, a)[(slice(None),) * a + (slice(0, k),)]
    else:
        idx = np.argsort(X, axis=a, kind="stable")[(slice(None),) * a + (slice(0, k),)]
    idx = idx.astype(np.int64, copy=False)
    return np.take_along_axis(X, idx, axis=a), idx


@kernel("ReverseSequence")
def reverse_sequence(
    input: np.ndarray, sequence_lens: np.ndarray, *, batch_axis: int = 1, time_axis: int = 0
) -> np.ndarray:
    """Each batch element's first sequence_lens[b] steps along time_axis reversed, the rest copied."""
    if sorted((batch_axis, time_axis)) != [0, 1] or input.ndim < 2:
        raise UnsupportedError(
            f"ReverseSequence: batch_axis={batch_axis}, time_axis={time_axis}; the spec allows 0 and 1 "
            "(one each) on an input of rank 2 or more"
        )
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    t_len, n = input.shape[time_axis], input.shape[batch_axis]
    if lens.shape != (n,) or (lens < 0).any() or (lens > t_len).any():
        raise ShapeError(
            f"ReverseSequence: sequence_lens {lens.tolist()} must hold {n} lengths between 0 and {t_len}"
        )
    t = np.arange(t_len)[:, None]
    idx = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # [T, N]
    cols = np.arange(n)[None, :]
    if time_axis == 0:
        return input[idx, cols]
    return input[cols.T, idx.T]
