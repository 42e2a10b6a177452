"""Shape and layout kernels (arrays, shape tensors -> reshaped, sliced, tiled, padded, generated arrays)."""

from __future__ import annotations

import math

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ops import PRIVATE_DOMAIN

from ._util import _axes, _axis, _ints
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


# ------------------------------------------------ views: Reshape, Flatten, (Un)Squeeze, Transpose
@kernel("Reshape", view="reshape")
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


@kernel("Flatten", view="reshape")
def flatten(input: np.ndarray, *, axis: int = 1) -> np.ndarray:
    r = input.ndim
    if not -r <= axis <= r:
        raise ShapeError(f"Flatten: axis={axis} is out of range for rank {r} (accepted [{-r}, {r}])")
    axis = axis + r if axis < 0 else axis
    return input.reshape(math.prod(input.shape[:axis]), math.prod(input.shape[axis:]))


@kernel("Squeeze", view="reshape")
def squeeze(data: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    if axes is None or np.size(axes) == 0:  # empty axes squeeze every 1, as onnxruntime does
        return np.squeeze(data)
    ax = _axes(_ints(axes), data.ndim)
    bad = [a for a in ax if data.shape[a] != 1]
    if bad:
        raise ShapeError(f"Squeeze: axes {bad} of input shape {list(data.shape)} are not 1")
    return np.squeeze(data, axis=tuple(ax))


@kernel("Unsqueeze", view="reshape")
def unsqueeze(data: np.ndarray, axes: np.ndarray) -> np.ndarray:
    ax = _ints(axes)
    return np.expand_dims(data, tuple(_axes(ax, data.ndim + len(ax))))  # axes count in the output rank


@kernel("Transpose", view=True)
def transpose(data: np.ndarray, *, perm: list[int] | None = None) -> np.ndarray:
    if perm is None:
        return data.T
    if sorted(perm) != list(range(data.ndim)):
        raise ShapeError(f"Transpose: perm={list(perm)} is not a permutation of the {data.ndim} axes")
    return data.transpose(perm)


@kernel("After", domain=PRIVATE_DOMAIN, view=True, shape=lambda node, infos: [infos[0]])
def after(x: np.ndarray, token: np.ndarray) -> np.ndarray:
    """x itself, once token has been computed: an order the memory plan keeps (activation recomputation runs a
    recomputed value's nodes when the backward needs it). Its ONNX body is Identity(x)."""
    return x


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


@kernel("Split", view=True)
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


@kernel("Slice", view=True)
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


@kernel("Expand", view=True)
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


@kernel("Constant", view=True)
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


# ------------------------------------------------ Trilu
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
