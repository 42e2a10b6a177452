"""Gradient rules of shape and data-movement ops (reshapes, Concat/Split, Slice, Pad, Tile, gathers, scatters)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node
from edgetrain.core.kernels.cast import NUMPY_TO_ONNX
from edgetrain.core.kernels.resize import nearest_index, resize_plan, resize_weights, source_coords
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.registry import body, grad

Grads = list[str | None]  # one gradient name (or None) per output / input

_INT64_MIN = int(np.iinfo(np.int64).min)


def _zeros(g: GradContext, shape: Sequence[int], like: str) -> str:
    """Zeros of `shape` in like's dtype: a broadcast scalar (a zero-stride view in numpy, no stored tensor)."""
    return g.op("Expand", g.scalar_like(0.0, like, hint="zero"), g.ints(shape, hint="shape"))


def _const_array(g: GradContext, node: Node, k: int, what: str) -> np.ndarray | None:
    """Input k of node (None when omitted); a value computed at run time is unsupported."""
    if k >= len(node.inputs) or not node.inputs[k]:
        return None
    v = g.const_value(node.inputs[k])
    if v is None:
        raise UnsupportedError(
            f"{node.label}: input '{what}' ('{node.inputs[k]}') is computed at run time; the gradient rule of "
            f"{node.op_type} needs it constant"
        )
    return v


def _const_ints(g: GradContext, node: Node, k: int, what: str) -> list[int] | None:
    v = _const_array(g, node, k, what)
    return None if v is None else [int(i) for i in np.asarray(v).reshape(-1)]


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _int64(g: GradContext, indices: str) -> str:
    if g.dtype(indices) == np.int64:
        return indices
    return g.op("Cast", indices, to=NUMPY_TO_ONNX[np.dtype(np.int64)])


# ------------------------------------------------------------------------------------------------ views


# Reshape, Flatten, Squeeze, Unsqueeze: y = x in another shape: dx = dy reshaped back to x's shape
@grad("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.reshape(dys[0], g.shape(node.inputs[0]))]


# y = transpose(x, perm): dx = transpose(dy, perm^-1)
@grad("Transpose")
def transpose_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    rank = len(g.shape(node.inputs[0]))
    perm = g.attr(node, "perm")
    perm = list(range(rank))[::-1] if perm is None else [_axis(p, rank) for p in perm]
    return [g.op("Transpose", dys[0], perm=[int(i) for i in np.argsort(perm)])]


# y = broadcast of x to a shape: dx = dy summed over the broadcast axes, which the driver's reduction of every
# gradient to its input's shape already does.
@grad("Expand")
def expand_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [dys[0]]


# y = tile(x, r): seen as (r0, d0, r1, d1, ...), y is x broadcast over the r axes: dx = dy summed over them
@grad("Tile")
def tile_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), xs = dys, g.shape(node.inputs[0])
    if math.prod(xs) == 0:
        return [_zeros(g, xs, dy)]
    reps = [o // d for o, d in zip(g.shape(dy), xs)]
    if all(r == 1 for r in reps):
        return [dy]
    split, axes = [], []
    for r, d in zip(reps, xs):
        if r > 1:
            axes.append(len(split))
            split.append(r)
        split.append(d)
    return [g.op("ReduceSum", g.reshape(dy, split), g.ints(axes), keepdims=0)]


# y = x restricted to lower/upper triangles: a projection, so dx = trilu(dy) with the same k and upper
@grad("Trilu")
def trilu_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    k = [i for i in node.inputs[1:2] if i]
    return [g.op("Trilu", dys[0], *k, upper=g.attr(node, "upper"))]


# DepthToSpace and SpaceToDepth (DCR) are each other's inverse permutation: dx = the inverse op on dy. ONNX's
# SpaceToDepth has no mode, so the inverse of DepthToSpace CRD is spelled out: reshape, transpose, reshape.
@grad("DepthToSpace")
def depth_to_space_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), bs = dys, g.attr(node, "blocksize")
    if g.attr(node, "mode") == "DCR":
        return [g.op("SpaceToDepth", dy, blocksize=bs)]
    n, c, h, w = g.shape(node.inputs[0])
    t = g.op("Transpose", g.reshape(dy, [n, c // (bs * bs), h, bs, w, bs]), perm=[0, 1, 3, 5, 2, 4])
    return [g.reshape(t, [n, c, h, w])]


@grad("SpaceToDepth")
def space_to_depth_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return [g.op("DepthToSpace", dys[0], blocksize=g.attr(node, "blocksize"), mode=g.attr(node, "mode"))]


# ------------------------------------------------------------------------------------------------ Concat, Split


# y = concat(x_1..x_n, axis): dx_i = the slab of dy x_i filled (one Split for all; a Slice when one is needed)
@grad("Concat")
def concat_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), xs = dys, node.inputs
    if len(xs) == 1:
        return [dy]
    a = _axis(g.attr(node, "axis"), len(g.shape(dy)))
    sizes = [g.shape(x)[a] for x in xs]
    if sum(needs) == 1:
        k = needs.index(True)
        start = sum(sizes[:k])
        sl = g.op(
            "Slice", dy, g.ints([start], hint="starts"), g.ints([start + sizes[k]], hint="ends"), g.ints([a])
        )
        return [sl if i == k else None for i in range(len(xs))]
    return g.ops("Split", dy, g.ints(sizes, hint="split"), n=len(xs), axis=a)


# y_1..y_n = split(x, axis): dx = concat(dy_1..dy_n, axis), zeros for outputs no gradient flows into
@grad("Split")
def split_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    xs = g.shape(x)
    a = _axis(g.attr(node, "axis"), len(xs))
    sizes = _split_sizes(g, node, xs[a])
    parts = []
    for dy, n in zip(dys, sizes):
        parts.append(dy if dy else _zeros(g, xs[:a] + (n,) + xs[a + 1 :], next(d for d in dys if d)))
    return [parts[0] if len(parts) == 1 else g.op("Concat", *parts, axis=a)]


def _split_sizes(g: GradContext, node: Node, dim: int) -> list[int]:
    """The part sizes along the axis, as the kernel computes them (outputs may be unnamed, so not from shapes)."""
    given = _const_ints(g, node, 1, "split")
    if given is not None:
        return given
    n = g.attr(node, "num_outputs") or len(node.outputs)
    chunk = -(-dim // n)
    return [max(0, min(chunk, dim - k * chunk)) for k in range(n)]


# ------------------------------------------------------------------------------------------------ Slice, Pad


# y = x[s_a : e_a : k_a] on some axes: dx = zeros with dy written at the selected positions. Built without a
# scatter: reverse dy on axes with k < 0 (then the positions ascend from the lowest one), interleave k - 1 zeros
# after each element on axes with |k| > 1 (reshape to (n, 1), pad to (n, |k|), reshape to n*|k|), then one Pad
# puts it at the lowest selected index (a negative end pad crops the interleave's trailing zeros).
@grad("Slice")
def slice_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), xs = dys, g.shape(node.inputs[0])
    ns, lo, step = g.shape(dy), *_slice_plan(g, node, xs)
    if math.prod(ns) == 0:
        return [_zeros(g, xs, dy)]
    rev = [a for a, k in enumerate(step) if k < 0]
    if rev:
        m = len(rev)
        dy = g.op(
            "Slice",
            dy,
            g.ints([-1] * m, hint="starts"),
            g.ints([_INT64_MIN] * m, hint="ends"),
            g.ints(rev),
            g.ints([-1] * m, hint="steps"),
        )
    k = [abs(s) for s in step]
    if any(s > 1 for s in k):
        split = [v for n, s in zip(ns, k) for v in ((n, 1) if s > 1 else (n,))]
        after = [v for s in k for v in ((0, s - 1) if s > 1 else (0,))]
        dy = g.op("Pad", g.reshape(dy, split), g.ints([0] * len(split) + after, hint="pads"))
        dy = g.reshape(dy, [n * s for n, s in zip(ns, k)])
    pads = lo + [d - b - n * s for d, b, n, s in zip(xs, lo, ns, k)]
    return [g.op("Pad", dy, g.ints(pads, hint="pads")) if any(pads) else dy]


def _slice_plan(g: GradContext, node: Node, xs: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(lowest selected index, step) per axis of x, with the kernel's clamping."""
    st, en = _const_ints(g, node, 1, "starts"), _const_ints(g, node, 2, "ends")
    axes = _const_ints(g, node, 3, "axes") or list(range(len(st)))
    steps = _const_ints(g, node, 4, "steps") or [1] * len(st)
    lo, step = [0] * len(xs), [1] * len(xs)
    for a, s, e, k in zip(axes, st, en, steps):
        a, dim = _axis(a, len(xs)), xs[_axis(a, len(xs))]
        s = s + dim if s < 0 else s
        if k > 0:
            lo[a] = min(max(s, 0), dim)
        else:  # the selection descends from s: its lowest index is s + (n - 1) * k, n = output size
            e = e + dim if e < 0 else e
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            n = len(range(s, e, k))
            lo[a] = s + (n - 1) * k if n else 0
        step[a] = k
    return lo, step


# Pad: y = x cropped by the negative pads, then padded by the positive ones (the kernel's order).
#   constant: dx = dy with the pads removed and the crops zero-filled, i.e. Pad(dy, -pads) (a Slice when no pad
#             is negative: a view in numpy); d constant_value = sum(dy) - sum(dx).
#   edge, reflect, wrap: each padded element is a copy of an element of x: its gradient is added to that
#             element (per axis; the index maps are separable, so the order of axes does not matter).
@grad("Pad")
def pad_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), x = dys, node.inputs[0]
    mode = g.attr(node, "mode")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise UnsupportedError(f"{node.label}: Pad mode={mode!r} has no gradient rule")
    before, after = _full_pads(g, node, len(g.shape(x)))
    if mode == "constant":
        dx = _unpad(g, dy, before, after)
        dcv = None
        if len(needs) > 2 and needs[2]:
            total = g.op("Sub", g.op("ReduceSum", dy, keepdims=0), g.op("ReduceSum", dx, keepdims=0))
            dcv = g.reshape(total, g.shape(node.inputs[2]))
        return [dx, None, dcv][: len(node.inputs)]
    crop = [(max(-b, 0), max(-e, 0)) for b, e in zip(before, after)]
    d = dy
    for a, (b, e) in enumerate(zip(before, after)):
        b, e = max(b, 0), max(e, 0)
        if b or e:
            d = _fold_axis(g, d, a, b, e, mode)
    if any(c for cs in crop for c in cs):
        d = g.op("Pad", d, g.ints([c[0] for c in crop] + [c[1] for c in crop], hint="pads"))
    return [d]


def _full_pads(g: GradContext, node: Node, rank: int) -> tuple[list[int], list[int]]:
    pads = _const_ints(g, node, 1, "pads")
    axes = _const_ints(g, node, 3, "axes")
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    return before, after


def _unpad(g: GradContext, dy: str, before: list[int], after: list[int]) -> str:
    if not any(before) and not any(after):
        return dy
    if min(before + after) >= 0:
        axes = [a for a, (b, e) in enumerate(zip(before, after)) if b or e]
        ys = g.shape(dy)
        starts, ends = [before[a] for a in axes], [ys[a] - after[a] for a in axes]
        return g.op("Slice", dy, g.ints(starts, hint="starts"), g.ints(ends, hint="ends"), g.ints(axes))
    return g.op("Pad", dy, g.ints([-b for b in before] + [-e for e in after], hint="pads"))


def _fold_axis(g: GradContext, d: str, a: int, b: int, e: int, mode: str) -> str:
    """The gradient of padding axis a by (b, e) in an edge/reflect/wrap mode: d (length b + n + e on axis a)
    folded back to length n."""
    shape = g.shape(d)
    n = shape[a] - b - e

    def part(start: int, end: int, step: int = 1) -> str:
        return g.op("Slice", d, g.ints([start]), g.ints([end]), g.ints([a]), g.ints([step], hint="steps"))

    def placed(t: str, lo: int) -> str:  # t (length m on axis a) put at [lo, lo + m) of zeros of length n
        pads = [0] * (2 * len(shape))
        pads[a], pads[a + len(shape)] = lo, n - lo - g.shape(t)[a]
        return g.op("Pad", t, g.ints(pads, hint="pads"))

    if mode == "wrap":
        # y[j] = x[(j - b) mod n]: shift so that x[0] sits at a multiple of n, then sum the periods
        lead = -b % n
        m = -(-(lead + shape[a]) // n)
        pads = [0] * (2 * len(shape))
        pads[a], pads[a + len(shape)] = lead, m * n - lead - shape[a]
        t = g.reshape(g.op("Pad", d, g.ints(pads, hint="pads")), shape[:a] + (m, n) + shape[a + 1 :])
        return g.op("ReduceSum", t, g.ints([a]), keepdims=0)
    terms = [part(b, b + n)]
    if mode == "edge":  # y[:b] = x[0], y[b + n:] = x[n - 1]
        for lo, (s, t) in ((0, (0, b)), (n - 1, (b + n, b + n + e))):
            if t > s:
                terms.append(placed(g.op("ReduceSum", part(s, t), g.ints([a]), keepdims=1), lo))
    else:  # reflect: y[j] = x[b - j] for j < b, y[b + n + j] = x[n - 2 - j] for j < e
        if b:
            terms.append(placed(part(b - 1, _INT64_MIN, -1), 1))
        if e:
            terms.append(placed(part(b + n + e - 1, b + n - 1, -1), n - 1 - e))
    return terms[0] if len(terms) == 1 else g.op("Sum", *terms)


# ------------------------------------------------------------------------------------------------ gathers


# y = gather(x, idx, axis): dx = zeros with dy added at the gathered rows, duplicates summed. Seen as x (P, D, Q)
# and dy (P, M, Q): one ScatterND(add) of dy's M rows into zeros (D, P, Q) (transposes only when P > 1). It is
# exact with duplicate indices and costs O(dy) (a OneHot-MatMul would build an M x D matrix).
@grad("Gather")
def gather_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (x, idx) = dys, node.inputs
    xs = g.shape(x)
    a = _axis(g.attr(node, "axis"), len(xs))
    p, d, q, m = math.prod(xs[:a]), xs[a], math.prod(xs[a + 1 :]), math.prod(g.shape(idx))
    rows = g.reshape(_int64(g, idx), [m, 1])
    upd = g.reshape(dy, [m, q]) if p == 1 else g.op("Transpose", g.reshape(dy, [p, m, q]), perm=[1, 0, 2])
    acc = g.op("ScatterND", _zeros(g, [d, p, q] if p > 1 else [d, q], dy), rows, upd, reduction="add")
    if p > 1:
        acc = g.op("Transpose", acc, perm=[1, 0, 2])
    return [g.reshape(acc, xs)]


# y[i][j] = x[idx[i][j]][j] (axis 0; likewise for others): dx = ScatterElements(add) of dy into zeros at idx
@grad("GatherElements")
def gather_elements_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (x, idx) = dys, node.inputs
    zeros = _zeros(g, g.shape(x), dy)
    return [g.op("ScatterElements", zeros, idx, dy, axis=g.attr(node, "axis"), reduction="add")]


# y = x[idx[..., :]] (batch_dims = 0): dx = ScatterND(add) of dy into zeros at idx
@grad("GatherND")
def gather_nd_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (x, idx) = dys, node.inputs
    if g.attr(node, "batch_dims"):
        raise UnsupportedError(
            f"{node.label}: GatherND with batch_dims > 0 has no gradient rule; supported: 0"
        )
    return [g.op("ScatterND", _zeros(g, g.shape(x), dy), idx, dy, reduction="add")]


# y = x with updates written (reduction none) or added (add) at idx:
#   dx = dy, with the overwritten positions zeroed for none; d updates = dy gathered at idx.
# With duplicate indices and reduction none, the spec leaves the written value undefined; every duplicate
# then gets the gradient.
@grad("ScatterElements", "ScatterND")
def scatter_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), (idx, upd) = dys, node.inputs[1:]
    reduction = g.attr(node, "reduction")
    if reduction not in ("none", "add"):
        raise UnsupportedError(
            f"{node.label}: {node.op_type} with reduction={reduction!r} has no gradient rule; supported: 'none', "
            "'add'"
        )
    elements = node.op_type == "ScatterElements"
    axis = {"axis": g.attr(node, "axis")} if elements else {}
    dx = du = None
    if needs[0]:
        dx = dy
        if reduction == "none":
            dx = g.op(node.op_type, dy, idx, _zeros(g, g.shape(upd), dy), **axis)
    if needs[2]:
        du = g.op("GatherElements" if elements else "GatherND", dy, idx, **axis)
    return [dx, None, du]


# ------------------------------------------------------------------------------------------------ Resize


# y = x resampled axis by axis, each axis a linear map: y = W_a x along a, W_a (n_out, n_in) a one-hot (nearest)
# or tap-weight (linear, cubic, antialias) matrix. dx = W_a^T dy along every resized axis (any order: the maps
# commute). W_a comes from the kernel's own sampling code, so it matches the forward exactly; for
# tf_crop_and_resize the rows of extrapolated outputs are zero (they hold a constant, not x).
@grad("Resize")
def resize_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    (dy,), x = dys, node.inputs[0]
    d = dy
    for a, w in _resize_matrices(g, node, g.shape(x)):
        ds = g.shape(d)
        p, n_out, q = math.prod(ds[:a]), ds[a], math.prod(ds[a + 1 :])
        wc = g.const(w.astype(g.dtype(x)), hint="resize_w")
        if q == 1:
            t = g.op("MatMul", g.reshape(d, [p, n_out]), wc)
        else:
            t = g.op(
                "MatMul",
                g.const(np.ascontiguousarray(w.T).astype(g.dtype(x)), hint="resize_wt"),
                g.reshape(d, [p, n_out, q]),
            )
        d = g.reshape(t, ds[:a] + (w.shape[1],) + ds[a + 1 :])
    return [d]


def _resize_matrices(g: GradContext, node: Node, xs: tuple[int, ...]) -> list[tuple[int, np.ndarray]]:
    """(axis, W) of every axis the forward resamples, W of shape (n_out, n_in) in float64."""

    consts = [_const_array(g, node, k, what) for k, what in ((1, "roi"), (2, "scales"), (3, "sizes"))]
    mode, ctm = g.attr(node, "mode"), g.attr(node, "coordinate_transformation_mode")
    antialias, exclude = g.attr(node, "antialias"), g.attr(node, "exclude_outside")
    plan = resize_plan(xs, *consts, g.attr(node, "axes"), g.attr(node, "keep_aspect_ratio_policy"))
    out = []
    for a, n_out, rscale, r0, r1 in plan:
        n_in = xs[a]
        if rscale == 1 and n_out == n_in and (ctm != "tf_crop_and_resize" or (r0, r1) == (0, 1)):
            continue  # the kernel leaves this axis alone
        src = source_coords(ctm, n_out, n_in, rscale, r0, r1)
        if mode == "nearest":
            w = np.zeros((n_out, n_in))
            w[np.arange(n_out), nearest_index(src, g.attr(node, "nearest_mode"), n_in)] = 1.0
        else:
            scale = rscale if antialias else 1.0
            normalize = bool(antialias or exclude)
            w = resize_weights(
                src.astype(np.float64), n_in, mode, g.attr(node, "cubic_coeff_a"), scale, exclude, normalize
            )
        if ctm == "tf_crop_and_resize":
            w[(src < 0) | (src > n_in - 1)] = 0.0
        out.append((a, w))
    return out


# y = each sequence reversed within its length (a permutation that is its own inverse): dx = the same of dy
@grad("ReverseSequence")
def reverse_sequence_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    attrs = {k: node.attrs[k] for k in ("batch_axis", "time_axis") if k in node.attrs}
    return [g.op("ReverseSequence", dys[0], node.inputs[1], **attrs)]


# After(x, token) orders a recomputation (edgetrain.graph.recompute); as ONNX it is x itself
@body("After")
def _after_body(g: GradContext, node: Node) -> list[str]:
    return [g.op("Identity", node.inputs[0])]
