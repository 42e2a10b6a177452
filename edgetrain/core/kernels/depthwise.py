"""Depthwise convolution (group == input channels, any channel multiplier): forward, dX and dW (numpy only), as
multiply-accumulates over the kernel offsets, where im2col would build columns for thousands of [1, K] products.

Each offset's window is one contiguous block of a "wide" copy of the padded input: the padded input is split
into its stride phases (xpad[..., r::s] for every r < s), each laid out on one grid Q with the images one after
another, so that the strided window of a kernel offset is a shifted slice of one phase. Results come out on the
same grid, wider than the output: the positions past the output's edge hold garbage that is cropped (or, in the
gradients, meets zeros). Every numpy call then runs over one block of long rows, where strided 4-D views spend
their time in numpy's per-row overhead.

Two layouts of the grid:
- channels first: [C, phase, N * Q + slack], a row per channel, the weight a per-row factor;
- channels last: [phase, Q + slack, N, C * mult], a row per grid position, the weight a row of N * C * mult
  values: for the late layers of mobile nets (a few pixels, hundreds of channels), whose channel rows would
  be a few dozen elements long.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edgetrain.core import fastpaths

Ints = tuple[int, ...]

# ---- the switches of the convolution and pooling kernels' fast paths (here, the module nn and nn_grad both import)

# every path's name (nn and nn_grad add theirs on import): read together when a step is compiled
PATHS: list[str] = []
# the switches a compiled (lean) step read when it was compiled, innermost last; empty outside such a step's call
_PINNED: list[frozenset[str]] = []


def on(name: str) -> bool:
    """Whether the fast path `name` is on: as read when the running step was compiled (pinned), else now (a kernel
    called outside a compiled step: an inference graph, a test)."""
    return name in _PINNED[-1] if _PINNED else fastpaths.enabled(name)


def lean_builder(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The interpreter's `lean` hook for kernel fn: at compile time, reads every path's switch once and returns fn
    with the node's attributes bound that runs under those switches (no switch read per call)."""

    params = inspect.signature(fn).parameters

    def build(node, infos, consts, out, shared):
        kwargs = dict(node.attrs)
        if "out" in params:
            kwargs["out"] = out
        if "noutputs" in params:
            kwargs["noutputs"] = 1  # the interpreter asks only single-output nodes for a lean step
        state = frozenset(p for p in PATHS if fastpaths.enabled(p))
        pin, unpin = _PINNED.append, _PINNED.pop

        def pinned(*inputs):
            pin(state)
            try:
                return fn(*inputs, **kwargs)
            finally:
                unpin()

        return pinned

    return build


# fast path (edgetrain.core.fastpaths): a depthwise conv over few positions as one small dense matrix per channel
DENSE = "depthwise_dense"
PATHS.append(DENSE)
# ... when that matrix (input positions x output positions) has at most this many entries: the last layers of mobile
# nets (4x4 and 2x2 with 3x3 and 5x5 kernels: 1.3-3.4x faster than the multiply-adds over the offsets, measured),
# whose padding the matrix leaves out; or at most DENSE_MAX_ENTRIES when an image has at most DENSE_TAPS_RATIO times
# the kernel's offsets as positions (EfficientNet's 5x5 over 8x8: 1.3-1.9x; 3x3 over 8x8 would lose 2x)
DENSE_SMALL_ENTRIES = 256
DENSE_MAX_ENTRIES = 4096
DENSE_TAPS_RATIO = 3

# outputs with at most this many positions per image (the last layers of mobile nets: 2x2, 4x4) are computed on
# their own positions, channels last, rather than on the phase grid of the padded input (9x larger for a 5x5
# kernel over 2x2): 1.4-7x faster there, slower from 8x8 on (measured)
POSITIONS_MAX = 16


class row_buffers:
    """Within it, numpy's ufuncs run unbuffered over rows of `row` elements or more: numpy 2.x copies the
    operands of a call through its buffers (8192 elements) when their contiguous rows are shorter than about
    half of that, which made the multiply-adds here 2-3x slower (a per-row factor times 32 rows of 2312: 21 us
    buffered, 7.6 us not). Rows of a few hundred elements gain nothing: they keep the default."""

    def __init__(self, row: int):
        self.size = min(8192, row // 16 * 16) if row >= 256 else None

    def __enter__(self) -> None:
        self.old = np.setbufsize(self.size) if self.size else None

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            np.setbufsize(self.old)


def _row_major(shape: Ints) -> Ints:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


class _Grid:
    """The phase grid of the windows of kernel k (strides s, dilations d) over an input of spatial shape sp placed
    at begin pads p, giving the output spatial shape o, for n images of c input and cm = c * mult output
    channels."""

    def __init__(self, sp: Ints, p: Ints, s: Ints, d: Ints, k: Ints, o: Ints, n: int, c: int, cm: int):
        nd = len(sp)
        ext = [max(p[i] + sp[i], (o[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i in range(nd)]
        self.sp, self.p, self.s, self.o = sp, p, s, o
        self.n, self.c, self.cm, self.mult = n, c, cm, cm // c
        self.q = tuple(-(-ext[i] // s[i]) for i in range(nd))
        self.size = int(np.prod(self.q))
        self.nph = int(np.prod(s))
        qst, sst = _row_major(self.q), _row_major(s)
        self.taps = [  # (phase, shift on the grid) per kernel offset, in W's row-major order
            (
                sum(off[i] * d[i] % s[i] * sst[i] for i in range(nd)),
                sum(off[i] * d[i] // s[i] * qst[i] for i in range(nd)),
            )
            for off in itertools.product(*map(range, k))
        ]
        self.slack = max(sh for _, sh in self.taps)
        # channels last where a channel's row is short (numpy's per-row cost dominates) and a position's row
        # longer; past ~500 its transposes cost more than the rows save (measured)
        self.last = n * self.size < 512 and self.size < cm
        self.wide = (self.size, n * cm) if self.last else (c, self.mult, n * self.size)
        self.row = self.wide[-1]
        self.phases = list(self._phases())

    def _phases(self):
        """(phase, grid slices, input slices) of each phase that holds input elements."""
        nd = len(self.sp)
        for ph, r in enumerate(itertools.product(*map(range, self.s))):
            gsl, asl = [], []
            for i in range(nd):
                si, pi = self.s[i], self.p[i]
                lo = max(0, -(-(pi - r[i]) // si))
                hi = (pi - r[i] + self.sp[i] - 1) // si
                if hi < lo:
                    break
                start = lo * si + r[i] - pi
                gsl.append(slice(lo, hi + 1))
                asl.append(slice(start, start + (hi - lo) * si + 1, si))
            else:
                yield ph, tuple(gsl), tuple(asl)

    # ---- the padded input, phase by phase

    def _input_views(self, buf: np.ndarray, a: np.ndarray):
        """(phase block of buf, matching part of a [N, C, sp...]) pairs, as [C, N, ...] (channels first) or
        [..., N, C, mult] (last: a broadcast over the channel copies)."""
        n, c, m, nd = self.n, self.c, self.mult, len(self.q)
        if self.last:
            at = a.transpose(tuple(range(2, 2 + nd)) + (0, 1))[..., None]
            for ph, gsl, asl in self.phases:
                yield buf[ph, : self.size].reshape(self.q + (n, c, m))[gsl], at[asl]
        else:
            at, whole = a.swapaxes(0, 1), (slice(None),) * 2
            for ph, gsl, asl in self.phases:
                yield buf[:, ph, : n * self.size].reshape((c, n) + self.q)[whole + gsl], at[whole + asl]

    def input_buffer(self, dtype) -> np.ndarray:
        """Zeros for the phases of a padded input: [C, phase, N*Q + slack] channels first, [phase,
        Q + slack, N, C, mult] channels last (each channel repeated for its outputs)."""
        if self.last:
            return np.zeros((self.nph, self.size + self.slack, self.n, self.c, self.mult), dtype)
        return np.zeros((self.c, self.nph, self.n * self.size + self.slack), dtype)

    def place_input(self, x: np.ndarray, fill: float = 0) -> np.ndarray:
        """x [N, C, sp...] placed in an input buffer whose padding holds fill (MaxPoolGrad's -inf)."""
        buf = self.input_buffer(x.dtype)
        if fill:
            buf.fill(fill)
        for dst, src in self._input_views(buf, x):
            np.copyto(dst, src)
        return buf

    def gather_input(self, buf: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out [N, C, sp...] = the unpadded part of an input buffer (summed over the channel copies)."""
        for src, dst in self._input_views(buf, out):
            if self.last and self.mult > 1:
                np.sum(src, axis=-1, out=dst[..., 0])
            else:
                np.copyto(dst, src)
        return out

    def block(self, buf: np.ndarray, ph: int, sh: int) -> np.ndarray:
        """The window of one kernel offset (phase ph, shift sh): [Q, N * Cm] or [C, 1, N * Q]."""
        if self.last:
            return buf.reshape(self.nph, -1, self.n * self.cm)[ph, sh : sh + self.size]
        return buf[:, ph, None, sh : sh + self.row]

    # ---- results on the grid

    def weights(self, w: np.ndarray) -> np.ndarray:
        """W [Cm, 1, k...] as each offset's factor of a block: [K, N * Cm] or [K, C, mult, 1]."""
        wk = w.reshape(self.cm, -1).T
        if self.last:
            return np.tile(wk, (1, self.n))
        return np.ascontiguousarray(wk).reshape(-1, self.c, self.mult, 1)

    def crop(self, a: np.ndarray) -> np.ndarray:
        """The output part of a wide array, as [N, Cm, *o] (a view)."""
        nd = len(self.q)
        if self.last:
            g = a.reshape(self.q + (self.n, self.cm)).transpose((nd, nd + 1) + tuple(range(nd)))
        else:
            g = a.reshape((self.cm, self.n) + self.q).swapaxes(0, 1)
        return g[(slice(None),) * 2 + tuple(slice(0, v) for v in self.o)]

    def place_output(self, dy: np.ndarray) -> np.ndarray:
        """dY [N, Cm, *o] as a wide array, zeros past the output's edge."""
        a = np.zeros(self.wide, dy.dtype)
        np.copyto(self.crop(a), dy)
        return a


@functools.lru_cache(maxsize=256)
def _grid(sp: Ints, p: Ints, s: Ints, d: Ints, k: Ints, o: Ints, n: int, c: int, cm: int) -> _Grid:
    return _Grid(sp, p, s, d, k, o, n, c, cm)


def grid(sp, p, s, d, k, o, n, c, cm) -> _Grid:
    """The phase grid (cached) of windows of kernel k (strides s, dilations d) over inputs [n, c, sp...] at begin
    pads p, giving outputs [n, cm, o...]."""
    return _geometry(sp, p, s, d, k, o, n, c, cm)


def _geometry(sp, p, s, d, k, o, n, c, cm) -> _Grid:
    return _grid(tuple(sp), tuple(p[: len(sp)]), tuple(s), tuple(d), tuple(k), tuple(o), n, c, cm)


def _batches(n: int, per_image: int, budget: int) -> list[tuple[int, int]]:
    """Batch chunks whose temporaries (per_image bytes an image) stay within budget bytes."""
    step = max(1, min(n, budget // max(1, per_image)))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _per_image(x_like: np.ndarray, sp: Ints, o: Ints, cm: int, k: Ints) -> int:
    """Bytes of temporaries per image: about three grids of the padded extent (input or dX phases, dY or the
    accumulator, the product)."""
    ext = int(np.prod([max(a, b) + kk for a, b, kk in zip(sp, o, k)]))
    return 3 * x_like.dtype.itemsize * ext * max(cm, x_like.shape[1])


def conv(
    x: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, o: Ints, y: np.ndarray, budget: int
) -> None:
    """y [N, Cm, *o] = the depthwise convolution of x [N, C, sp...] (begin pads p) by w [Cm, 1, k...], a batch
    chunk at a time within budget bytes of temporaries."""
    if math.prod(o) <= POSITIONS_MAX:
        _conv_positions(x, w, p, s, d, o, y)
        return
    if _dense(x.shape[2:], o, x.shape[1], w.shape[0], math.prod(w.shape[2:])):
        _conv_dense(x, w, p, s, d, o, y)
        return
    for lo, hi in _batches(x.shape[0], _per_image(x, x.shape[2:], o, w.shape[0], w.shape[2:]), budget):
        _conv(x[lo:hi], w, p, s, d, o, y[lo:hi])


def grad_input(
    dy: np.ndarray, w: np.ndarray, c: int, sp: Ints, p: Ints, s: Ints, d: Ints, budget: int
) -> np.ndarray:
    """dX [N, C, *sp] of a depthwise convolution from dY [N, Cm, *o] and W [Cm, 1, k...]."""
    dx = np.empty((dy.shape[0], c) + tuple(sp), dy.dtype)
    if math.prod(dy.shape[2:]) <= POSITIONS_MAX:
        _grad_input_positions(dy, w, p, s, d, dx)
        return dx
    if _dense(sp, dy.shape[2:], c, dy.shape[1], math.prod(w.shape[2:])):
        _grad_input_dense(dy, w, p, s, d, dx)
        return dx
    for lo, hi in _batches(dy.shape[0], _per_image(dy, sp, dy.shape[2:], dy.shape[1], w.shape[2:]), budget):
        _grad_input(dy[lo:hi], w, p, s, d, dx[lo:hi])
    return dx


def grad_weight(
    dy: np.ndarray, x: np.ndarray, k: Ints, p: Ints, s: Ints, d: Ints, want_b: bool, budget: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """(dW [Cm, K], dB [Cm] or None) of a depthwise convolution from dY [N, Cm, *o] and x [N, C, sp...]."""
    if math.prod(dy.shape[2:]) <= POSITIONS_MAX:
        return _grad_weight_positions(dy, x, k, p, s, d, want_b)
    if _dense(x.shape[2:], dy.shape[2:], x.shape[1], dy.shape[1], math.prod(k)):
        return _grad_weight_dense(dy, x, k, p, s, d, want_b)
    dw = db = None
    for lo, hi in _batches(x.shape[0], _per_image(x, x.shape[2:], dy.shape[2:], dy.shape[1], k), budget):
        part, part_b = _grad_weight(dy[lo:hi], x[lo:hi], k, p, s, d, want_b)
        dw = part if dw is None else dw + part
        db = part_b if db is None else db + part_b
    return dw, db


def _conv(x: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, o: Ints, y: np.ndarray) -> None:
    g = _geometry(x.shape[2:], p, s, d, w.shape[2:], o, x.shape[0], x.shape[1], w.shape[0])
    xb, wk = g.place_input(x), g.weights(w)
    acc = np.empty(g.wide, x.dtype)
    tmp = np.empty(g.wide, x.dtype) if len(g.taps) > 1 else None
    with row_buffers(g.row):
        for j, (ph, sh) in enumerate(g.taps):
            if j == 0:
                np.multiply(g.block(xb, ph, sh), wk[j], out=acc)
            else:
                np.multiply(g.block(xb, ph, sh), wk[j], out=tmp)
                np.add(acc, tmp, out=acc)
    np.copyto(y, g.crop(acc))


def _grad_input(dy: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, dx: np.ndarray) -> None:
    """Each offset's dY * W added into its window of the padded dX."""
    n, cm, c, sp = dy.shape[0], dy.shape[1], dx.shape[1], dx.shape[2:]
    g = _geometry(sp, p, s, d, w.shape[2:], dy.shape[2:], n, c, cm)
    dyw, wk = g.place_output(dy), g.weights(w)
    dxb = g.input_buffer(dy.dtype)
    tmp = np.empty(g.wide, dy.dtype)
    with row_buffers(g.row):
        for j, (ph, sh) in enumerate(g.taps):
            np.multiply(dyw, wk[j], out=tmp)
            dst = g.block(dxb, ph, sh)
            if g.last or g.mult == 1:
                np.add(dst, tmp, out=dst)
            else:  # the channel's outputs each add their part
                for i in range(g.mult):
                    np.add(dst, tmp[:, i : i + 1], out=dst)
    g.gather_input(dxb, dx)


def _grad_weight(dy, x, k, p, s, d, want_b: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Per offset, the sum over images and positions of dY times the offset's window."""
    n, c, cm = x.shape[0], x.shape[1], dy.shape[1]
    g = _geometry(x.shape[2:], p, s, d, k, dy.shape[2:], n, c, cm)
    xb, dyw = g.place_input(x), g.place_output(dy)
    dw = np.empty((len(g.taps), cm), x.dtype)
    with row_buffers(g.row):
        if g.last:  # per offset and column (image, channel): the sum over positions, then over images
            ones, tmp = np.ones(g.size, x.dtype), np.empty(g.wide, x.dtype)
            for j, (ph, sh) in enumerate(g.taps):
                np.multiply(g.block(xb, ph, sh), dyw, out=tmp)
                np.sum((ones @ tmp).reshape(n, cm), axis=0, out=dw[j])
            db = np.sum((ones @ dyw).reshape(n, cm), axis=0) if want_b else None
        else:  # per offset, a dot product per output channel (twice as fast as einsum's)
            for j, (ph, sh) in enumerate(g.taps):
                np.matmul(dyw, g.block(xb, ph, sh).swapaxes(1, 2), out=dw[j].reshape(c, g.mult, 1))
            db = dyw.reshape(cm, -1) @ np.ones(g.row, x.dtype) if want_b else None
    return dw.T, db


# ---- few positions: per channel, one dense [input positions, output positions] matrix of the kernel's taps


def _dense(sp: Ints, o: Ints, c: int, cm: int, kk: int) -> bool:
    pin, entries = math.prod(sp), math.prod(sp) * math.prod(o)
    if cm != c or entries > DENSE_MAX_ENTRIES:
        return False
    return (entries <= DENSE_SMALL_ENTRIES or pin <= DENSE_TAPS_RATIO * kk) and on(DENSE)


@functools.lru_cache(maxsize=256)
def _dense_taps(sp: Ints, p: Ints, s: Ints, d: Ints, k: Ints, o: Ints) -> np.ndarray:
    """[input positions, output positions]: the kernel offset (row-major, as W's) joining each input position to
    each output position, or prod(k) (a zero) where none does (padding, or outside the window)."""
    tap = np.zeros((math.prod(sp), math.prod(o)), np.int64)
    hit = np.ones(tap.shape, bool)
    for i in range(len(sp)):
        inp = np.arange(sp[i]).reshape((1,) * i + (-1,) + (1,) * (len(sp) - 1 - i)) * np.ones(sp, np.int64)
        out = np.arange(o[i]).reshape((1,) * i + (-1,) + (1,) * (len(o) - 1 - i)) * np.ones(o, np.int64)
        off = inp.reshape(-1, 1) + p[i] - out.reshape(1, -1) * s[i]  # = tap * d for a joining tap
        t = off // d[i]
        hit &= (off % d[i] == 0) & (t >= 0) & (t < k[i])
        tap = tap * k[i] + np.clip(t, 0, k[i] - 1)
    return np.where(hit, tap, math.prod(k))


def _dense_weights(w: np.ndarray, sp, p, s, d, o) -> np.ndarray:
    """W [C, 1, k...] as [C, input positions, output positions] (zeros where no tap joins them)."""
    k = w.shape[2:]
    taps = _dense_taps(tuple(sp), tuple(p[: len(sp)]), tuple(s), tuple(d), tuple(k), tuple(o))
    wz = np.zeros((w.shape[0], math.prod(k) + 1), w.dtype)
    wz[:, :-1] = w.reshape(w.shape[0], -1)
    return wz[:, taps]


def _channel_rows(a: np.ndarray) -> np.ndarray:
    """a [N, C, spatial...] as a contiguous [C, N, positions]: per channel, the images' positions as rows."""
    return np.ascontiguousarray(a.reshape(a.shape[0], a.shape[1], -1).transpose(1, 0, 2))


def _to_batch_first(r: np.ndarray, out: np.ndarray) -> None:
    """out [N, C, spatial...] = r [C, N, positions]."""
    np.copyto(out.reshape(out.shape[0], out.shape[1], -1), r.transpose(1, 0, 2))


def _conv_dense(x: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, o: Ints, y: np.ndarray) -> None:
    _to_batch_first(_channel_rows(x) @ _dense_weights(w, x.shape[2:], p, s, d, o), y)


def _grad_input_dense(dy: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, dx: np.ndarray) -> None:
    wf = _dense_weights(w, dx.shape[2:], p, s, d, dy.shape[2:])
    _to_batch_first(_channel_rows(dy) @ wf.transpose(0, 2, 1), dx)


def _grad_weight_dense(dy, x, k, p, s, d, want_b: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """dW per channel: X^T dY [input positions, output positions], each entry added to the tap joining them (a
    product with the taps' one-hot matrix)."""
    c, kk = x.shape[1], math.prod(k)
    taps = _dense_taps(
        tuple(x.shape[2:]), tuple(p[: len(k)]), tuple(s), tuple(d), tuple(k), tuple(dy.shape[2:])
    )
    dyr = _channel_rows(dy)
    dwf = _channel_rows(x).transpose(0, 2, 1) @ dyr  # [C, input positions, output positions]
    onehot = (taps.reshape(-1, 1) == np.arange(kk)).astype(x.dtype)
    dw = dwf.reshape(c, -1) @ onehot
    db = dyr.reshape(c, -1) @ np.ones(dyr.shape[1] * dyr.shape[2], x.dtype) if want_b else None
    return dw, db


# ---- few output positions: channels last, each kernel offset's window a strided view of the padded input


@functools.lru_cache(maxsize=256)
def _live_windows(
    sp: Ints, p: Ints, s: Ints, d: Ints, k: Ints, o: Ints
) -> tuple[Ints, tuple[tuple[int, tuple], ...]]:
    """(padded extent, (offset index, window slices) of each kernel offset whose window reaches the input): the
    others read only padding, so they add nothing (a 5x5 kernel over 2x2 with pads 2: 9 of 25 offsets)."""
    nd = len(sp)
    ext = tuple(max(p[i] + sp[i], (o[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i in range(nd))
    live = []
    for j, off in enumerate(itertools.product(*map(range, k))):
        lo = [off[i] * d[i] for i in range(nd)]
        hi = [lo[i] + (o[i] - 1) * s[i] for i in range(nd)]
        if all(hi[i] >= p[i] and lo[i] < p[i] + sp[i] for i in range(nd)):
            live.append((j, tuple(slice(lo[i], hi[i] + 1, s[i]) for i in range(nd))))
    return ext, tuple(live)


def _windows(sp, p, s, d, k, o):
    return _live_windows(tuple(sp), tuple(p[: len(sp)]), tuple(s), tuple(d), tuple(k), tuple(o))


def _channels_last(a: np.ndarray) -> np.ndarray:
    """a [N, C, spatial...] as a view [spatial..., N, C]."""
    nd = a.ndim - 2
    return a.transpose(tuple(range(2, 2 + nd)) + (0, 1))


def _padded_last(x: np.ndarray, p: Ints, ext: Ints) -> np.ndarray:
    """x [N, C, sp...] placed at the begin pads p of zeros [ext..., N, C]."""
    nd = x.ndim - 2
    xl = np.zeros(tuple(ext) + x.shape[:2], x.dtype)
    xl[tuple(slice(p[i], p[i] + x.shape[2 + i]) for i in range(nd))] = _channels_last(x)
    return xl


def _conv_positions(x: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, o: Ints, y: np.ndarray) -> None:
    if _dense(x.shape[2:], o, x.shape[1], w.shape[0], math.prod(w.shape[2:])):
        _conv_dense(x, w, p, s, d, o, y)
        return
    (n, c), cm, nd = x.shape[:2], w.shape[0], x.ndim - 2
    mult = cm // c
    ext, live = _windows(x.shape[2:], p, s, d, w.shape[2:], o)
    xl = _padded_last(x, p, ext)
    wk = w.reshape(c, mult, -1).transpose(2, 0, 1)  # [K, C, mult]
    acc = np.zeros(tuple(o) + (n, c, mult), x.dtype)
    tmp = np.empty_like(acc)
    for j, (k, sl) in enumerate(live):
        dst = acc if j == 0 else tmp
        np.multiply(xl[sl][..., None], wk[k], out=dst)
        if j:
            np.add(acc, tmp, out=acc)
    np.copyto(y, acc.reshape(tuple(o) + (n, cm)).transpose((nd, nd + 1) + tuple(range(nd))))


def _grad_input_positions(dy: np.ndarray, w: np.ndarray, p: Ints, s: Ints, d: Ints, dx: np.ndarray) -> None:
    if _dense(dx.shape[2:], dy.shape[2:], dx.shape[1], dy.shape[1], math.prod(w.shape[2:])):
        _grad_input_dense(dy, w, p, s, d, dx)
        return
    (n, cm), c, nd = dy.shape[:2], dx.shape[1], dy.ndim - 2
    mult, o = cm // c, dy.shape[2:]
    ext, live = _windows(dx.shape[2:], p, s, d, w.shape[2:], o)
    dyl = np.ascontiguousarray(_channels_last(dy)).reshape(tuple(o) + (n, c, mult))
    wk = w.reshape(c, mult, -1).transpose(2, 0, 1)
    dxl = np.zeros(tuple(ext) + (n, c), dy.dtype)
    tmp = np.empty_like(dyl)
    for k, sl in live:
        np.multiply(dyl, wk[k], out=tmp)
        dst = dxl[sl]
        if mult == 1:
            np.add(dst, tmp[..., 0], out=dst)
        else:
            dst += tmp.sum(axis=-1)
    inner = dxl[tuple(slice(p[i], p[i] + dx.shape[2 + i]) for i in range(nd))]
    np.copyto(dx, inner.transpose((nd, nd + 1) + tuple(range(nd))))


def _grad_weight_positions(dy, x, k, p, s, d, want_b: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if _dense(x.shape[2:], dy.shape[2:], x.shape[1], dy.shape[1], math.prod(k)):
        return _grad_weight_dense(dy, x, k, p, s, d, want_b)
    (n, c), cm = x.shape[:2], dy.shape[1]
    mult, o = cm // c, dy.shape[2:]
    ext, live = _windows(x.shape[2:], p, s, d, k, o)
    xl = _padded_last(x, p, ext)
    dyl = np.ascontiguousarray(_channels_last(dy)).reshape(tuple(o) + (n, c, mult))
    rows = math.prod(o) * n
    ones = np.ones(rows, x.dtype)
    dw = np.zeros((math.prod(k), cm), x.dtype)
    tmp = np.empty_like(dyl)
    for j, sl in live:  # per offset: the column sums (a matmul with ones) of dY times its window
        np.multiply(dyl, xl[sl][..., None], out=tmp)
        np.matmul(ones, tmp.reshape(rows, cm), out=dw[j])
    db = ones @ dyl.reshape(rows, cm) if want_b else None
    return dw.T, db
