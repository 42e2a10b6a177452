"""Shape and data-movement kernels (arrays, shape tensors -> reshaped, sliced, gathered, padded arrays)."""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError, UnsupportedError
from .registry import kernel

# ONNX TensorProto.DataType -> numpy dtype, for the attributes that name a dtype (EyeLike's `dtype`).
_ONNX_DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


def _ints(a) -> list[int]:
    """A shape-like input (any int dtype, any rank) as Python ints: no int64 overflow in the clamping math."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{what}={axis} is out of range for an input of rank {rank} (accepted [{-rank}, {rank - 1}])"
        )
    return axis % rank


def _axes(axes, rank: int, what: str = "axes") -> list[int]:
    norm = [_axis(a, rank, what) for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"{what}={list(axes)} repeats an axis")
    return norm


# ------------------------------------------------ views: Reshape, Flatten, (Un)Squeeze, Transpose
@kernel("Reshape")
def reshape(data: np.ndarray, shape: np.ndarray, *, allowzero: int = 0) -> np.ndarray:
    dims = _ints(shape)
    if not allowzero:
        if any(d == 0 and i >= data.ndim for i, d in enumerate(dims)):
            raise ShapeError(
                f"Reshape: shape {dims} copies (0) a dim that input shape {list(data.shape)} lacks"
            )
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    known = math.prod(d for d in dims if d != -1)
    n_infer = dims.count(-1)
    if n_infer > 1 or any(d < -1 for d in dims):
        raise ShapeError(f"Reshape: shape {dims} may hold one -1 and no other negative dim")
    if (known == 0 or data.size % known) if n_infer else data.size != known:
        raise ShapeError(
            f"Reshape: input shape {list(data.shape)} ({data.size} elements) cannot be reshaped to {dims}"
        )
    return data.reshape(dims)  # a view whenever the input's strides allow


@kernel("Flatten")
def flatten(input: np.ndarray, *, axis: int = 1) -> np.ndarray:
    r = input.ndim
    if not -r <= axis <= r:
        raise ShapeError(f"Flatten: axis={axis} is out of range for rank {r} (accepted [{-r}, {r}])")
    axis = axis + r if axis < 0 else axis
    return input.reshape(math.prod(input.shape[:axis]), math.prod(input.shape[axis:]))


@kernel("Squeeze")
def squeeze(data: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    if axes is None or np.size(axes) == 0:  # empty axes squeeze every 1, as onnxruntime does
        return np.squeeze(data)
    ax = _axes(_ints(axes), data.ndim)
    bad = [a for a in ax if data.shape[a] != 1]
    if bad:
        raise ShapeError(f"Squeeze: axes {bad} of input shape {list(data.shape)} are not 1")
    return np.squeeze(data, axis=tuple(ax))


@kernel("Unsqueeze")
def unsqueeze(data: np.ndarray, axes: np.ndarray) -> np.ndarray:
    ax = _ints(axes)
    return np.expand_dims(data, tuple(_axes(ax, data.ndim + len(ax))))  # axes count in the output rank


@kernel("Transpose")
def transpose(data: np.ndarray, *, perm: list[int] | None = None) -> np.ndarray:
    if perm is None:
        return data.T
    if sorted(perm) != list(range(data.ndim)):
        raise ShapeError(f"Transpose: perm={list(perm)} is not a permutation of the {data.ndim} axes")
    return data.transpose(perm)


# ------------------------------------------------ Concat, Split, Slice, Expand, Tile
@kernel("Concat")
def concat(*inputs: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    a = _axis(axis, inputs[0].ndim)
    ref = inputs[0].shape[:a] + inputs[0].shape[a + 1 :]
    for x in inputs[1:]:
        if x.ndim != inputs[0].ndim or x.shape[:a] + x.shape[a + 1 :] != ref:
            raise ShapeError(
                f"Concat: input shapes {[list(x.shape) for x in inputs]} differ outside axis={axis}"
            )
    return np.concatenate(inputs, axis=a, out=out)


@kernel("Split")
def split(
    input: np.ndarray,
    split: np.ndarray | None = None,
    *,
    axis: int = 0,
    num_outputs: int | None = None,
    noutputs: int,
) -> np.ndarray | tuple[np.ndarray, ...]:
    a = _axis(axis, input.ndim)
    dim = input.shape[a]
    if split is not None:
        sizes = _ints(split)
        if sum(sizes) != dim or min(sizes, default=0) < 0:
            raise ShapeError(f"Split: split={sizes} does not add up to {dim}, the size of axis {axis}")
    else:
        n = noutputs if num_outputs is None else num_outputs
        if n < 1 or num_outputs is None and dim % n:
            raise ShapeError(f"Split: axis {axis} of size {dim} does not split evenly into {n} outputs")
        # Uneven num_outputs: chunks of ceil(dim / n), the last ones smaller (onnx's reference).
        chunk = -(-dim // n)
        sizes = [max(0, min(chunk, dim - k * chunk)) for k in range(n)]
    if len(sizes) != noutputs:
        raise ShapeError(f"Split: the node has {noutputs} outputs but splits into {len(sizes)} parts {sizes}")
    parts = np.split(input, np.cumsum(sizes[:-1]), axis=a)  # views
    return tuple(parts) if noutputs > 1 else parts[0]


@kernel("Slice")
def slice_(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    st, en = _ints(starts), _ints(ends)
    ax = list(range(len(st))) if axes is None else _axes(_ints(axes), data.ndim)
    sp = [1] * len(st) if steps is None else _ints(steps)
    if not len(st) == len(en) == len(ax) == len(sp):
        raise ShapeError(f"Slice: starts {st}, ends {en}, axes {ax} and steps {sp} differ in length")
    index = [slice(None)] * data.ndim
    for a, s, e, step in zip(ax, st, en, sp, strict=True):
        if step == 0:
            raise ShapeError(f"Slice: steps={sp} has a 0 step (axis {a})")
        dim = data.shape[a]
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:  # end clamps to -1, which means "through index 0", i.e. None in a Python slice
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        index[a] = slice(s, None if e < 0 else e, step)
    return data[tuple(index)]  # a view


@kernel("Expand")
def expand(input: np.ndarray, shape: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    try:
        target = np.broadcast_shapes(input.shape, tuple(_ints(shape)))
    except ValueError:
        raise ShapeError(
            f"Expand: input shape {list(input.shape)} does not broadcast with shape {_ints(shape)}"
        ) from None
    if out is not None:
        np.copyto(out, input)
        return out
    # A read-only broadcast view (zero strides): it aliases the input and must not be written to.
    return np.broadcast_to(input, target)


@kernel("Tile")
def tile(input: np.ndarray, repeats: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    reps = _ints(repeats)
    if len(reps) != input.ndim or min(reps, default=0) < 0:
        raise ShapeError(f"Tile: repeats={reps} must hold {input.ndim} non-negative values, one per axis")
    shape = [r * d for r, d in zip(reps, input.shape, strict=True)]
    res = np.empty(shape, input.dtype) if out is None or not out.flags.c_contiguous else out
    # Seen as (r0, d0, r1, d1, ...), the output is the input broadcast over the r axes: one copy, no np.tile.
    np.copyto(
        res.reshape([v for r, d in zip(reps, input.shape, strict=True) for v in (r, d)]),
        input.reshape([v for d in input.shape for v in (1, d)]),
    )
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


# ------------------------------------------------ generators: Shape, Size, Constant, Range
@kernel("Shape")
def shape(data: np.ndarray, *, end: int | None = None, start: int = 0) -> np.ndarray:
    return np.array(data.shape[start:end], dtype=np.int64)  # Python slicing clamps exactly as the spec


@kernel("Size")
def size(data: np.ndarray) -> np.ndarray:
    return np.array(data.size, dtype=np.int64)


@kernel("Constant")
def constant(
    *,
    value: np.ndarray | None = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
    sparse_value=None,
) -> np.ndarray:
    if sparse_value is not None:
        raise UnsupportedError(
            "Constant: sparse_value is not supported; supported: value, value_float(s), "
            "value_int(s), value_string(s)"
        )
    given = [
        (v, dt)
        for v, dt in (
            (value, None),
            (value_float, np.float32),
            (value_floats, np.float32),
            (value_int, np.int64),
            (value_ints, np.int64),
            (value_string, object),
            (value_strings, object),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise UnsupportedError(f"Constant: needs exactly one value attribute, got {len(given)}")
    v, dt = given[0]
    res = np.array(v, dtype=dt) if dt is not None else np.asarray(v).view()
    res.flags.writeable = False  # the attribute itself (no copy per run): nobody may write into it
    return res


@kernel("ConstantOfShape")
def constant_of_shape(
    input: np.ndarray, *, value: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        raise ShapeError(f"ConstantOfShape: value must hold one element, got shape {list(np.shape(value))}")
    res = np.empty(_ints(input), fill.dtype) if out is None else out
    res[...] = fill[0]
    return res


def _is_half(dtype: np.dtype) -> bool:
    return dtype == np.float16 or dtype.name == "bfloat16"


@kernel("Range")
def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, *, stash_type: int = 1) -> np.ndarray:
    dtype = np.asarray(start).dtype
    s, l, d = (np.asarray(v).reshape(-1)[0].item() for v in (start, limit, delta))
    if not d:
        raise ShapeError("Range: delta is 0")
    n = -((s - l) // d) if dtype.kind in "iu" else math.ceil((float(l) - float(s)) / float(d))
    work = dtype
    if _is_half(dtype):  # stash_type: the dtype of the arithmetic, for 16-bit floats only
        if stash_type not in (1, 11):
            raise UnsupportedError(
                f"Range: stash_type={stash_type} is not supported; supported: 1 (float), 11 (double)"
            )
        work = np.dtype(np.float32 if stash_type == 1 else np.float64)
    res = np.arange(max(n, 0)).astype(work)
    res *= np.asarray(delta).astype(work)  # start + i * delta, as the spec says, in the input dtype
    res += np.asarray(start).astype(work)
    return res if work == dtype else res.astype(dtype)


@kernel("EyeLike")
def eye_like(input: np.ndarray, *, dtype: int | None = None, k: int = 0) -> np.ndarray:
    if input.ndim != 2:
        raise ShapeError(f"EyeLike: input must be 2-D, got shape {list(input.shape)}")
    if dtype is not None and dtype not in _ONNX_DTYPES:
        raise UnsupportedError(f"EyeLike: dtype={dtype} is not supported; supported: {sorted(_ONNX_DTYPES)}")
    return np.eye(*input.shape, k=k, dtype=input.dtype if dtype is None else _ONNX_DTYPES[dtype])


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


# ------------------------------------------------ Pad
_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@kernel("Pad")
def pad(
    data: np.ndarray,
    pads: np.ndarray,
    constant_value: np.ndarray | None = None,
    axes: np.ndarray | None = None,
    *,
    mode: str = "constant",
) -> np.ndarray:
    if mode not in _PAD_MODES:
        raise UnsupportedError(f"Pad: mode={mode!r} is not supported; supported: {list(_PAD_MODES)}")
    r = data.ndim
    ax = list(range(r)) if axes is None else _axes(_ints(axes), r)
    p = _ints(pads)
    if len(p) != 2 * len(ax):
        raise ShapeError(f"Pad: pads={p} must hold 2 values per padded axis ({len(ax)} axes)")
    before, after = [0] * r, [0] * r
    for i, a in enumerate(ax):
        before[a], after[a] = p[i], p[i + len(ax)]
    # Negative pads crop first (a view), then the rest pads: onnxruntime's order for every mode.
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(before, after, data.shape, strict=True))
    if any(s.stop < s.start for s in crop):
        raise ShapeError(f"Pad: pads={p} crop more than input shape {list(data.shape)} holds")
    x = data[crop]
    before, after = [max(b, 0) for b in before], [max(e, 0) for e in after]
    if mode == "constant":
        given = constant_value is not None and np.size(constant_value) > 0
        cv = np.asarray(constant_value).reshape(-1)[0] if given else 0
        return np.pad(x, list(zip(before, after, strict=True)), constant_values=cv)
    for a in range(r):
        n = x.shape[a]
        if (before[a] or after[a]) and (n == 0 or mode == "reflect" and max(before[a], after[a]) > n - 1):
            raise ShapeError(
                f"Pad: mode={mode!r} cannot pad axis {a} of size {n} by "
                f"({before[a]}, {after[a]}) (reflect allows at most size - 1)"
            )
    return np.pad(x, list(zip(before, after, strict=True)), mode=mode)


# ------------------------------------------------ NonZero, TopK, Trilu
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


@kernel("Trilu")
def trilu(
    input: np.ndarray, k: np.ndarray | None = None, *, upper: int = 1, out: np.ndarray | None = None
) -> np.ndarray:
    if input.ndim < 2:
        raise ShapeError(f"Trilu: input must have rank >= 2, got shape {list(input.shape)}")
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    n, m = input.shape[-2:]
    keep = ~np.tri(n, m, kk - 1, dtype=bool) if upper else np.tri(n, m, kk, dtype=bool)
    res = np.zeros_like(input) if out is None else out
    if out is not None:
        res.fill(0)
    np.copyto(res, input, where=keep)
    return res


# ------------------------------------------------ DepthToSpace, SpaceToDepth
def _block_mode(op: str, mode: str, blocksize: int, x: np.ndarray) -> None:
    if mode not in ("DCR", "CRD"):
        raise UnsupportedError(f"{op}: mode={mode!r} is not supported; supported: ['DCR', 'CRD']")
    if x.ndim != 4 or blocksize < 1:
        raise ShapeError(
            f"{op}: needs a 4-D input and blocksize >= 1, got shape {list(x.shape)} and blocksize={blocksize}"
        )


def _permuted_copy(
    src: np.ndarray, shape6: list[int], shape4: list[int], out: np.ndarray | None
) -> np.ndarray:
    """Writes src (a permuted 6-D view) into a 4-D result seen as shape6: one copy, no temporary."""
    res = np.empty(shape4, src.dtype) if out is None or not out.flags.c_contiguous else out
    np.copyto(res.reshape(shape6), src)
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


@kernel("DepthToSpace")
def depth_to_space(
    input: np.ndarray, *, blocksize: int, mode: str = "DCR", out: np.ndarray | None = None
) -> np.ndarray:
    _block_mode("DepthToSpace", mode, blocksize, input)
    n, c, h, w = input.shape
    bs = blocksize
    if c % (bs * bs):
        raise ShapeError(f"DepthToSpace: channels {c} are not a multiple of blocksize**2 = {bs * bs}")
    c2 = c // (bs * bs)
    if mode == "DCR":
        src = input.reshape(n, bs, bs, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        src = input.reshape(n, c2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return _permuted_copy(src, [n, c2, h, bs, w, bs], [n, c2, h * bs, w * bs], out)


@kernel("SpaceToDepth")
def space_to_depth(
    input: np.ndarray, *, blocksize: int, mode: str = "DCR", out: np.ndarray | None = None
) -> np.ndarray:
    _block_mode("SpaceToDepth", mode, blocksize, input)
    n, c, h, w = input.shape
    bs = blocksize
    if h % bs or w % bs:
        raise ShapeError(f"SpaceToDepth: spatial shape {[h, w]} is not a multiple of blocksize={bs}")
    x6 = input.reshape(n, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        src, shape6 = x6.transpose(0, 3, 5, 1, 2, 4), [n, bs, bs, c, h // bs, w // bs]
    else:
        src, shape6 = x6.transpose(0, 1, 3, 5, 2, 4), [n, c, bs, bs, h // bs, w // bs]
    return _permuted_copy(src, shape6, [n, c * bs * bs, h // bs, w // bs], out)


# ------------------------------------------------ Resize
_RESIZE_MODES = ("nearest", "linear", "cubic")
_CTMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UnsupportedError(f"Resize: {name}={value!r} is not supported; supported: {list(choices)}")


@kernel("Resize")
def resize(
    X: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> np.ndarray:
    ctm = coordinate_transformation_mode
    _check_choice("mode", mode, _RESIZE_MODES)
    _check_choice("coordinate_transformation_mode", ctm, _CTMS)
    _check_choice("nearest_mode", nearest_mode, _NEAREST_MODES)
    _check_choice("keep_aspect_ratio_policy", keep_aspect_ratio_policy, _ASPECT_POLICIES)
    if mode != "nearest" and X.dtype.kind != "f":
        raise UnsupportedError(
            f"Resize: mode={mode!r} supports float inputs only, got {X.dtype} "
            "(mode='nearest' takes every dtype)"
        )
    plan = _resize_plan(X.shape, roi, scales, sizes, axes, keep_aspect_ratio_policy)
    work = X.dtype if X.dtype == np.float64 or mode == "nearest" else np.dtype(np.float32)
    y, masks = X, []
    for a, n_out, rscale, r0, r1 in sorted(plan, key=lambda p: p[1] / max(X.shape[p[0]], 1)):  # shrink first
        n_in = X.shape[a]
        if rscale == 1 and n_out == n_in and (ctm != "tf_crop_and_resize" or (r0, r1) == (0, 1)):
            continue  # identity along this axis
        x = _source_coords(ctm, n_out, n_in, rscale, r0, r1)
        if ctm == "tf_crop_and_resize":
            masks.append((a, (x < 0) | (x > n_in - 1)))
        if mode == "nearest":
            y = np.take(y, _nearest_index(x, nearest_mode, n_in), axis=a)
        else:
            w = _resize_weights(
                x.astype(np.float64),
                n_in,
                mode,
                cubic_coeff_a,
                rscale if antialias else 1.0,
                exclude_outside,
                normalize=bool(antialias or exclude_outside),
            )
            y = _matmul_along(y.astype(work, copy=False), w.astype(work), a)
    if masks:
        hit = np.zeros([1] * X.ndim, bool)
        for a, m in masks:
            hit = hit | m.reshape([-1 if i == a else 1 for i in range(X.ndim)])
        y = np.array(y, dtype=work)  # a nearest result may still be a view of X
        np.copyto(y, np.asarray(extrapolation_value, dtype=work), where=np.broadcast_to(hit, y.shape))
    return y.astype(X.dtype, copy=False) if y is not X else y.copy()


def _resize_plan(shape, roi, scales, sizes, axes, policy) -> list[tuple[int, int, float, float, float]]:
    """(axis, output size, scale, roi start, roi end) per resized axis, with onnxruntime's float32 scales."""
    f32 = np.float32
    r = len(shape)
    ax = list(range(r)) if axes is None else _axes(axes, r, "axes")
    scales = None if scales is None or np.size(scales) == 0 else np.asarray(scales, f32).reshape(-1)
    sizes = None if sizes is None or np.size(sizes) == 0 else _ints(sizes)
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize: give exactly one of the inputs scales and sizes")
    given = scales if sizes is None else sizes
    rois = [0.0] * len(ax) + [1.0] * len(ax) if roi is None or np.size(roi) == 0 else _floats(roi)
    if len(given) != len(ax) or len(rois) != 2 * len(ax):
        raise ShapeError(
            f"Resize: scales/sizes ({len(given)}) and roi ({len(rois)}) must hold 1 and 2 "
            f"values per resized axis ({len(ax)} axes of input shape {list(shape)})"
        )
    if sizes is None:
        if min(scales) <= 0:
            raise ShapeError(f"Resize: scales={scales.tolist()} must be > 0")
        rs = [f32(s) for s in scales]
        outs = [int(np.floor(s * f32(shape[a]))) for a, s in zip(ax, rs, strict=True)]
    else:
        rs = [f32(n) / f32(shape[a]) for a, n in zip(ax, sizes, strict=True)]
        outs = list(sizes)
        if policy != "stretch":
            s = min(rs) if policy == "not_larger" else max(rs)
            rs = [s] * len(ax)
            outs = [int(np.floor(s * f32(shape[a]) + f32(0.5))) for a in ax]  # round half up
    return [
        (a, n, float(s), rois[i], rois[i + len(ax)])
        for i, (a, n, s) in enumerate(zip(ax, outs, rs, strict=True))
    ]


def _floats(a) -> list[float]:
    return [float(v) for v in np.asarray(a, np.float32).reshape(-1)]


def _source_coords(ctm: str, n_out: int, n_in: int, rscale: float, r0: float, r1: float) -> np.ndarray:
    """x_original of every output index, in float32 and in onnxruntime's order of operations: nearest-pixel
    rounding at exact halves must come out the same."""
    f = np.float32
    y, s, half = np.arange(n_out, dtype=f), f(rscale), f(0.5)
    if ctm == "half_pixel":
        return (y + half) / s - half
    if ctm == "half_pixel_symmetric":  # onnxruntime adds the half pixel in double here
        offset = f(n_in) / f(2) * (f(1) - f(n_out) / (s * f(n_in)))
        return (float(offset) + (y.astype(np.float64) + 0.5) / float(s) - 0.5).astype(f)
    if ctm == "pytorch_half_pixel":
        return (y + half) / s - half if n_out > 1 else np.zeros(n_out, f)
    if ctm == "align_corners":
        return y * f(n_in - 1) / f(n_out - 1) if n_out > 1 else np.zeros(n_out, f)
    if ctm == "asymmetric":
        return y / s
    r0, r1 = f(r0), f(r1)  # tf_crop_and_resize
    if n_out > 1:
        return r0 * f(n_in - 1) + y * (r1 - r0) * f(n_in - 1) / f(n_out - 1)
    return np.full(n_out, f(0.5 * (float(r0) + float(r1)) * (n_in - 1)), f)


def _nearest_index(x: np.ndarray, nearest_mode: str, n_in: int) -> np.ndarray:
    fl = np.floor(x)
    if nearest_mode == "round_prefer_floor":
        i = fl + (x - fl > 0.5)
    elif nearest_mode == "round_prefer_ceil":
        i = fl + (x - fl >= 0.5)
    else:
        i = fl if nearest_mode == "floor" else np.ceil(x)
    return np.clip(i, 0, n_in - 1).astype(np.intp)


def _resize_weights(
    x: np.ndarray, n_in: int, mode: str, a: float, rscale: float, exclude_outside: int, normalize: bool
) -> np.ndarray:
    """The (n_out, n_in) matrix of one axis: linear or cubic taps around each x, stretched by 1/rscale when
    antialiasing a downscale (rscale < 1), edge-clamped or (exclude_outside) dropped outside the input."""
    radius = 1 if mode == "linear" else 2
    inv = min(rscale, 1.0)
    support = radius / inv
    j = np.floor(x - support)[:, None] + 1 + np.arange(2 * math.ceil(support) + 1)
    t = np.abs(j - x[:, None]) * inv
    if mode == "linear":
        w = np.maximum(1 - t, 0)
    else:
        far = np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0)
        w = np.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1, far)
    if exclude_outside:
        w *= (j >= 0) & (j < n_in)
    if normalize:
        total = w.sum(axis=1, keepdims=True)
        w /= np.where(total == 0, 1, total)
    rows = np.arange(len(x))[:, None] * n_in
    flat = (rows + np.clip(j, 0, n_in - 1).astype(np.int64)).reshape(-1)
    return np.bincount(flat, weights=w.reshape(-1), minlength=len(x) * n_in).reshape(len(x), n_in)


def _matmul_along(y: np.ndarray, w: np.ndarray, a: int) -> np.ndarray:
    """Applies the (n_out, n_in) matrix w along axis a of y: one BLAS call (batched over the leading axes)."""
    if a == y.ndim - 1:
        return y @ w.T
    shp = y.shape
    y3 = y.reshape(math.prod(shp[:a]), shp[a], math.prod(shp[a + 1 :]))
    return np.matmul(w, y3).reshape(shp[:a] + (w.shape[0],) + shp[a + 1 :])
