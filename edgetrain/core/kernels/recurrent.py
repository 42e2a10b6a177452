"""Recurrent kernels: ONNX LSTM, GRU and RNN, their training-mode forwards (LSTMTrain, GRUTrain, RNNTrain) and
their fused backward ops (LSTMGrad, GRUGrad, RNNGrad).

One driver runs every cell: directions (forward, reverse, bidirectional), layouts 0 and 1, initial states,
sequence_lens (a reverse direction reverses each sequence within its own length; steps past a length leave the
state as it was and write zeros to Y), clip, every activation the spec lists, LSTM peepholes and input_forget, GRU
linear_before_reset. Per direction the input projection of all steps is one GEMM; each step is one GEMM against R
and a few elementwise passes, written where their results stay (Y's rows, or the trace's).

The training-mode forward also writes the trace (trace_blocks: every step's gate values, the states before each
step, what the backward needs besides): the backward reads it and runs back through time. Without a trace (the
fast path "recurrent-trace" off), the backward runs the forward again to make one. The gradient of each step's
pre-activations goes into one [T, N, G*H] array, so dX, dW and the recurrence weights' gradient are each one GEMM
over all steps; only dH (through R) is per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from .registry import kernel


def _f32(v: float) -> float:
    return float(np.float32(v))  # ONNX FLOAT attributes are 32-bit


# ---------------------------------------------------------------------------------------------------- activations
# name (lower case) -> (needs alpha, needs beta, default alpha, default beta). The spec: "default values are the
# same as of corresponding ONNX operators" (LeakyRelu 0.01, ThresholdedRelu 1.0, HardSigmoid 0.2/0.5, Elu 1.0);
# Affine and ScaledTanh have no ONNX operator, so no default: they need their values given.
ACTIVATIONS: dict[str, tuple[bool, bool, float | None, float | None]] = {
    "relu": (False, False, None, None),
    "tanh": (False, False, None, None),
    "sigmoid": (False, False, None, None),
    "affine": (True, True, None, None),
    "leakyrelu": (True, False, 0.01, None),
    "thresholdedrelu": (True, False, 1.0, None),
    "scaledtanh": (True, True, None, None),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, None),
    "softsign": (False, False, None, None),
    "softplus": (False, False, None, None),
}
SPELLING = {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "affine": "Affine",
    "leakyrelu": "LeakyRelu",
    "thresholdedrelu": "ThresholdedRelu",
    "scaledtanh": "ScaledTanh",
    "hardsigmoid": "HardSigmoid",
    "elu": "Elu",
    "softsign": "Softsign",
    "softplus": "Softplus",
}


@dataclass(frozen=True)
class Act:
    """One activation with its alpha and beta (0.0 where it takes none)."""

    name: str  # lower case, a key of ACTIVATIONS
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """act(x), written into out when given (the result either way)."""
        n = self.name
        if n == "sigmoid":
            return _sigmoid(x, out)
        if n == "tanh":
            return np.tanh(x, out=out)
        y = self._other(x)
        if out is None:
            return y
        out[...] = y
        return out

    def _other(self, x: np.ndarray) -> np.ndarray:
        n, a, b = self.name, self.alpha, self.beta
        if n == "relu":
            return np.maximum(x, 0)
        if n == "affine":
            return x * x.dtype.type(a) + x.dtype.type(b)
        if n == "leakyrelu":
            return np.where(x >= 0, x, x * x.dtype.type(a))
        if n == "thresholdedrelu":
            return np.where(x > a, x, x.dtype.type(0))
        if n == "scaledtanh":
            return np.tanh(x * x.dtype.type(b)) * x.dtype.type(a)
        if n == "hardsigmoid":
            return np.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1)
        if n == "elu":
            return np.where(x >= 0, x, np.expm1(np.minimum(x, 0)) * x.dtype.type(a))
        if n == "softsign":
            return x / (np.abs(x) + 1)
        assert n == "softplus", n
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def slope(self, x: np.ndarray | None, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """d act / dx at x, where y = act(x) (sigmoid and tanh read y alone: x may be None), written into out
        when given (the result either way)."""
        n = self.name
        if n == "sigmoid":  # y * (1 - y)
            out = np.subtract(1, y, out=out)
            out *= y
            return out
        if n == "tanh":  # 1 - y * y
            out = np.multiply(y, y, out=out)
            return np.subtract(1, out, out=out)
        s = self._other_slope(x, y)
        if out is None:
            return s
        out[...] = s
        return out

    def _other_slope(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        n, a, b = self.name, self.alpha, self.beta
        t = x.dtype.type
        if n == "relu":
            return (x > 0).astype(x.dtype)
        if n == "affine":
            return np.full_like(x, a)
        if n == "leakyrelu":
            return np.where(x >= 0, t(1), t(a))
        if n == "thresholdedrelu":
            return (x > a).astype(x.dtype)
        if n == "scaledtanh":
            u = np.tanh(x * t(b))
            return (1 - u * u) * t(a * b)
        if n == "hardsigmoid":
            z = x * t(a) + t(b)
            return ((z > 0) & (z < 1)) * t(a)
        if n == "elu":
            return np.where(x >= 0, t(1), y + t(a))
        if n == "softsign":
            d = np.abs(x) + 1
            return 1 / (d * d)
        assert n == "softplus", n
        with np.errstate(over="ignore"):
            return _sigmoid(x)


def _sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)); exp(-x) = inf for x < -88 (float32) gives 0, the right value: the callers' loops run
    under np.errstate(over="ignore") (entered once, not per step)."""
    e = np.negative(x, out=out)
    np.exp(e, out=e)
    e += 1
    return np.reciprocal(e, out=e)


def resolve_activations(
    op: str,
    per_direction: Sequence[str],
    directions: int,
    names: Sequence[str] | None,
    alpha: Sequence[float] | None,
    beta: Sequence[float] | None,
) -> list[list[Act]]:
    """The activations of each direction, from the node's attributes (or the spec's defaults); alpha and beta
    values are consumed in order by the activations that take them."""
    k = len(per_direction)
    if names is None:
        names = list(per_direction) * directions
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) == k and directions == 2:
        names = names * 2  # one list for both directions
    if len(names) != k * directions:
        raise UnsupportedError(
            f"attribute activations has {len(names)} names; a {op} with {directions} direction(s) takes "
            f"{k * directions} ({', '.join(per_direction)} per direction)"
        )
    alphas, betas = list(alpha or ()), list(beta or ())
    out: list[Act] = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise UnsupportedError(
                f"attribute activations: '{name}' is not an activation the {op} spec lists; use one of "
                f"{', '.join(SPELLING.values())}"
            )
        needs_a, needs_b, da, db = ACTIVATIONS[key]
        a = b = 0.0
        if needs_a:
            if alphas:
                a = alphas.pop(0)
            elif da is None:
                raise UnsupportedError(
                    f"attribute activation_alpha: activation {SPELLING[key]} needs an alpha value and none is left "
                    f"(it has no ONNX operator whose default could stand in); give one per {SPELLING[key]}"
                )
            else:
                a = da
        if needs_b:
            if betas:
                b = betas.pop(0)
            elif db is None:
                raise UnsupportedError(
                    f"attribute activation_beta: activation {SPELLING[key]} needs a beta value and none is left; "
                    f"give one per {SPELLING[key]}"
                )
            else:
                b = db
        out.append(Act(key, _f32(a), _f32(b)))
    return [out[d * k : (d + 1) * k] for d in range(directions)]


# ---------------------------------------------------------------------------------------------------- the setup
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
N_STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}  # outputs after Y: Y_h (and Y_c)


@dataclass
class Spec:
    """A recurrent node's inputs in layout 0, checked: X [T, N, I], W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H],
    initial states [D, N, H], P [D, 3H], lens [N] (None: every sequence is T long)."""

    op: str
    x: np.ndarray
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray | None
    lens: np.ndarray | None
    h0: np.ndarray | None
    c0: np.ndarray | None
    p: np.ndarray | None
    direction: str
    hidden: int
    layout: int
    acts: list[list[Act]]
    clip: float | None
    input_forget: bool
    linear_before_reset: bool

    @property
    def directions(self) -> int:
        return DIRECTIONS[self.direction]


def _direction(direction) -> str:
    d = direction.decode() if isinstance(direction, bytes) else str(direction)
    if d not in DIRECTIONS:
        raise UnsupportedError(f"attribute direction='{d}' is not one of forward, reverse, bidirectional")
    return d


def _layout0_x(op: str, x: np.ndarray, layout: int) -> np.ndarray:
    """X as given -> X [T, N, I] (layout 0), its dtype and rank checked."""
    if x.dtype.kind != "f":
        raise UnsupportedError(f"{op}: input X is {x.dtype}; the op takes float16, float32 or float64")
    if x.ndim != 3:
        raise ShapeError(f"{op}: input X has shape {x.shape}; it must be 3-D")
    if layout == 1:
        x = x.transpose(1, 0, 2)
    return x


def _optional_inputs(B, initial_h, initial_c, P, layout: int) -> tuple[np.ndarray | None, ...]:
    """B, initial_h, initial_c, P as given -> arrays (None where omitted), the states in layout 0."""
    b = None if B is None else np.asarray(B)
    h0 = None if initial_h is None else np.asarray(initial_h)
    c0 = None if initial_c is None else np.asarray(initial_c)
    if layout == 1:
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    p = None if P is None else np.asarray(P)
    return b, h0, c0, p


def _check_shapes(
    op: str, X, x: np.ndarray, hidden: int, layout: int, direction: str, given: dict[str, np.ndarray | None]
) -> None:
    """The inputs given (name -> array in layout 0, None: omitted) -> ShapeError at the first whose shape is not
    the one x [T, N, I], hidden_size and direction ask for."""
    _, n, i_size = x.shape
    nd, g = DIRECTIONS[direction], GATES[op]
    want = {
        "W": (nd, g * hidden, i_size),
        "R": (nd, g * hidden, hidden),
        "B": (nd, 2 * g * hidden),
        "initial_h": (nd, n, hidden),
        "initial_c": (nd, n, hidden),
        "P": (nd, 3 * hidden),
    }
    for key, v in given.items():
        if v is None:
            continue
        got, expected = v.shape, want[key]
        if tuple(got) != expected:
            shown = expected if layout == 0 or key not in ("initial_h", "initial_c") else (n, nd, hidden)
            raise ShapeError(
                f"{op}: input {key} has shape {tuple(got)}; with X {tuple(np.shape(X))}, hidden_size {hidden}, "
                f"layout {layout} and direction {direction} it must be {shown}"
            )


def _lengths(op: str, sequence_lens, n: int, t_len: int) -> np.ndarray | None:
    """sequence_lens as given -> the checked lengths [N] (int64), or None when omitted or every sequence is full."""
    if sequence_lens is None:
        return None
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (n,) or (lens < 0).any() or (lens > t_len).any():
        raise ShapeError(
            f"{op}: input sequence_lens {np.asarray(sequence_lens).tolist()} must hold {n} lengths "
            f"between 0 and the sequence length {t_len}"
        )
    if (lens == t_len).all():
        return None  # every sequence is full: the fast path, same result
    return lens


def make_spec(
    op: str,
    X,
    W,
    R,
    B,
    sequence_lens,
    initial_h,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    input_forget=0,
    linear_before_reset=0,
) -> Spec:
    """A recurrent node's inputs and attributes -> its Spec (inputs in layout 0), every one checked."""
    direction = _direction(direction)
    nd = DIRECTIONS[direction]
    if layout not in (0, 1):
        raise UnsupportedError(f"attribute layout={layout} is not 0 or 1")
    x, w, r = (np.asarray(v) for v in (X, W, R))
    x = _layout0_x(op, x, layout)
    t_len, n, _ = x.shape
    if w.ndim != 3 or r.ndim != 3:
        raise ShapeError(f"{op}: W {w.shape} and R {r.shape} must be 3-D")
    hidden = int(hidden_size) if hidden_size is not None else r.shape[-1]
    b, h0, c0, p = _optional_inputs(B, initial_h, initial_c, P, layout)
    given = {"W": w, "R": r, "B": b, "initial_h": h0, "initial_c": c0, "P": p}
    _check_shapes(op, X, x, hidden, layout, direction, given)
    lens = _lengths(op, sequence_lens, n, t_len)
    acts = resolve_activations(op, DEFAULT_ACTS[op], nd, activations, activation_alpha, activation_beta)
    return Spec(
        op,
        x,
        w,
        r,
        b,
        lens,
        h0,
        c0,
        p,
        direction,
        hidden,
        int(layout),
        acts,
        None if clip is None else _f32(clip),
        bool(input_forget),
        bool(linear_before_reset),
    )


def _order(spec: Spec, d: int) -> np.ndarray | None:
    """The time index each sample reads at each processing step of direction d ([T, N]), or None for the plain
    order (forward; reverse without lengths reverses the time axis as a whole)."""
    reverse = spec.direction == "reverse" or d == 1
    if not reverse or spec.lens is None:
        return None
    t = np.arange(spec.x.shape[0])[:, None]
    lens = spec.lens[None, :]
    return np.where(t < lens, lens - 1 - t, t)  # each sequence reversed within its length; an involution


def _steps_in(spec: Spec, d: int, v: np.ndarray) -> np.ndarray:
    """v [T, N, ...] in direction d's processing order."""
    idx = _order(spec, d)
    if idx is not None:
        return v[idx, np.arange(v.shape[1])]
    if spec.direction == "reverse" or d == 1:
        return v[::-1]
    return v


_steps_out = _steps_in  # the reordering is its own inverse


def _mask(spec: Spec) -> np.ndarray | None:
    """[T, N, 1] booleans: step t of sample n is within its length (None: all are)."""
    if spec.lens is None:
        return None
    return (np.arange(spec.x.shape[0])[:, None] < spec.lens[None, :])[:, :, None]


# ---------------------------------------------------------------------------------------------------- the cells
@dataclass
class Trace:
    """What one direction's forward keeps for its backward (processing order): gate values, the pre-activations
    (after clip) where a gate's activation needs them for its slope, the clip mask (1.0 where clip let the
    pre-activation through), and the states before each step (h[t], c[t]) and after the last (h[T], c[T])."""

    a: np.ndarray | None  # [T, N, G*H] pre-activations (None: sigmoid and tanh slopes read the gates alone)
    kept: np.ndarray | None  # [T, N, G*H] 1.0 where clip let the pre-activation through (None: no clip)
    gates: np.ndarray  # [T, N, G*H] activation outputs
    h: np.ndarray  # [T+1, N, H]
    c: np.ndarray | None  # [T+1, N, H] (LSTM)
    extra: np.ndarray | None  # GRU: [T, N, H] r*h (linear_before_reset=0) or h R_h^T + Rb_h (=1); LSTM: h(c)


def needs_pre(acts: Sequence[Sequence[Act]]) -> bool:
    """Whether a trace keeps the gates' pre-activations: the slope of an activation other than sigmoid and tanh
    reads its input, theirs read their output (h's activation reads the cell state, which the trace keeps)."""
    return any(a.name not in ("sigmoid", "tanh") for per_dir in acts for a in per_dir[:2])


def trace_blocks(
    op: str, t_len: int, n: int, hidden: int, *, pre: bool, clip: bool
) -> list[tuple[str, tuple[int, ...]]]:
    """The blocks of one direction's trace, in order (name, shape): the trace is their flat concatenation, one
    row [D, size] per direction (the training-mode forward's last output, read by the fused backward)."""
    gh = GATES[op] * hidden
    blocks = [("gates", (t_len, n, gh))]
    if pre:
        blocks.append(("a", (t_len, n, gh)))
    if clip:
        blocks.append(("kept", (t_len, n, gh)))
    blocks.append(("h", (t_len + 1, n, hidden)))
    if op == "LSTM":
        blocks.append(("c", (t_len + 1, n, hidden)))
    if op != "RNN":
        blocks.append(("extra", (t_len, n, hidden)))
    return blocks


def trace_size(op: str, t_len: int, n: int, hidden: int, *, pre: bool, clip: bool) -> int:
    return sum(int(np.prod(s)) for _, s in trace_blocks(op, t_len, n, hidden, pre=pre, clip=clip))


def _spec_blocks(spec: Spec) -> list[tuple[str, tuple[int, ...]]]:
    t_len, n, _ = spec.x.shape
    pre = needs_pre(spec.acts)
    return trace_blocks(spec.op, t_len, n, spec.hidden, pre=pre, clip=spec.clip is not None)


def carve(spec: Spec, row: np.ndarray) -> Trace:
    """One direction's trace row [size] -> its Trace of views."""
    views: dict[str, np.ndarray | None] = {"a": None, "kept": None, "c": None, "extra": None}
    at = 0
    for name, shape in _spec_blocks(spec):
        size = int(np.prod(shape))
        views[name] = row[at : at + size].reshape(shape)
        at += size
    assert at == row.shape[0], (at, row.shape)
    return Trace(**views)  # type: ignore[arg-type]


def new_trace_shape(spec: Spec) -> tuple[int, int]:
    return spec.directions, sum(int(np.prod(s)) for _, s in _spec_blocks(spec))


def new_trace(spec: Spec) -> np.ndarray:
    """An empty trace [D, size] for spec."""
    return np.empty(new_trace_shape(spec), spec.x.dtype)


def _clip(spec: Spec, a: np.ndarray, kept: np.ndarray | None) -> None:
    if spec.clip is not None:
        if kept is not None:
            np.less_equal(np.abs(a), spec.clip, out=kept)
        np.clip(a, -spec.clip, spec.clip, out=a)


def _bias(spec: Spec, d: int) -> tuple[np.ndarray, np.ndarray]:
    gh = GATES[spec.op] * spec.hidden
    if spec.b is None:
        z = np.zeros(gh, spec.x.dtype)
        return z, z
    return spec.b[d, :gh], spec.b[d, gh:]


def _initial(spec: Spec, v: np.ndarray | None, d: int) -> np.ndarray:
    if v is None:
        return np.zeros((spec.x.shape[1], spec.hidden), spec.x.dtype)
    return v[d]


def _projection(spec: Spec, d: int) -> np.ndarray:
    """Direction d's input projection of all steps (processing order), biases added: [T, N, G*H], one GEMM."""
    x = _steps_in(spec, d, spec.x)
    t_len, n, _ = x.shape
    hs = spec.hidden
    wb, rb = _bias(spec, d)
    xw = np.dot(x.reshape(t_len * n, -1), spec.w[d].T).reshape(t_len, n, GATES[spec.op] * hs)
    xw += wb
    if spec.op != "GRU":
        xw += rb  # GRU's h gate adds Rb_h inside the reset (linear_before_reset) or after R: added per step
    else:
        xw[..., : 2 * hs] += rb[: 2 * hs]
    return xw


class _Bufs:
    """Where direction d's forward writes each step: into the trace's rows when it keeps one (no copies), else
    into Y and a few scratch buffers reused from step to step."""

    def __init__(self, spec: Spec, d: int, y: np.ndarray, tr: Trace | None):
        t_len, n, _ = spec.x.shape
        hs, op, dt = spec.hidden, spec.op, spec.x.dtype
        gh = GATES[op] * hs
        self.tr, self.y = tr, y
        self.masked = spec.lens is not None
        self.a = np.empty((n, gh), dt) if tr is None or tr.a is None else None
        self.g = np.empty((n, gh), dt) if tr is None else None
        self.kept = None if tr is None else tr.kept
        self.states = None
        if tr is None:  # h (and c): two rows each, step t reads one and writes the other
            self.states = np.empty((2, 2 if op == "LSTM" else 1, n, hs), dt)
        self.ex = np.empty((n, hs), dt) if tr is None and op != "RNN" else None
        self.h_new = np.empty((n, hs), dt) if self.masked else None
        self.c_new = np.empty((n, hs), dt) if self.masked and op == "LSTM" else None

    def step(self, t: int):
        """(a, gates, kept, ex) of step t."""
        tr = self.tr
        if tr is None:
            return self.a, self.g, None, self.ex
        a = tr.a[t] if tr.a is not None else self.a
        return (
            a,
            tr.gates[t],
            None if tr.kept is None else tr.kept[t],
            None if tr.extra is None else tr.extra[t],
        )

    def state_out(self, t: int):
        """(h, c) buffers the states after step t go into (c None for GRU/RNN)."""
        if self.tr is not None:
            h, c = self.tr.h[t + 1], None if self.tr.c is None else self.tr.c[t + 1]
        else:
            s = self.states[(t + 1) % 2]
            h, c = (s[0], s[1] if s.shape[0] > 1 else None)
            if not self.masked:
                h = self.y[t]  # the state is Y's row: written once
        return h, c

    def new(self, h_out, c_out):
        """Where a step writes its new h and c: masked steps compute into scratch, then select."""
        if self.masked:
            return self.h_new, self.c_new
        return h_out, c_out


def run_direction(
    spec: Spec, d: int, y: np.ndarray, tr: Trace | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Direction d's forward: Y [T, N, H] (processing order) into y, its trace into tr when given; returns the
    final (h, c or None). The per-step work writes where its result stays (the trace's rows, or Y's)."""
    t_len, n, _ = spec.x.shape
    op = spec.op
    xw = _projection(spec, d)
    mask = _mask(spec)
    mask = None if mask is None else _steps_in(spec, d, mask)
    h = _initial(spec, spec.h0, d).astype(spec.x.dtype, copy=False)
    c = _initial(spec, spec.c0, d).astype(spec.x.dtype, copy=False) if op == "LSTM" else None
    bufs = _Bufs(spec, d, y, tr)
    if tr is not None:
        tr.h[0] = h
        if c is not None:
            tr.c[0] = c
    _, rb = _bias(spec, d)
    p = spec.p[d] if spec.p is not None else None
    r = spec.r[d]
    r_t = r.T
    acts = spec.acts[d]
    for t in range(t_len):
        a, gates, kept, ex = bufs.step(t)
        h_out, c_out = bufs.state_out(t)
        h_new, c_new = bufs.new(h_out, c_out)
        if op == "GRU":
            a[...] = xw[t]
            _gru_step(spec, a, h, r, rb, acts, kept, gates, ex, h_new)
        else:
            np.dot(h, r_t, out=a)
            a += xw[t]
            if op == "RNN":
                _clip(spec, a, kept)
                acts[0](a, gates)
                h_new[...] = gates
            else:
                _lstm_step(spec, a, c, p, acts, kept, gates, c_new, ex, h_new)
        if mask is not None:
            m = mask[t]  # past its length, a sample's Y is 0 and its state stays
            y[t] = 0
            np.copyto(y[t], h_new, where=m)
            np.copyto(h_out, h)
            np.copyto(h_out, h_new, where=m)
            if c_out is not None:
                np.copyto(c_out, c)
                np.copyto(c_out, c_new, where=m)
        h, c = h_out, c_out
    if mask is None and tr is not None:  # Y is the trace's h[1:]: one copy
        y[...] = tr.h[1:]
    return h.copy(), None if c is None else c.copy()


def _lstm_step(spec, a, c, p, acts, kept, gates, c_new, hc, h_new):
    """One LSTM step on a = X W^T + H R^T + biases [N, 4H] (gates i, o, f, c), in place; gate values into gates,
    the new cell state into c_new, h_act(c_new) into hc and the new h into h_new."""
    hs = spec.hidden
    f_act, g_act, h_act = acts
    if p is None:  # i, o and f side by side: one clip, one activation
        _clip(spec, a, kept)
        f_act(a[:, : 3 * hs], gates[:, : 3 * hs])
        gi, gf = gates[:, :hs], gates[:, 2 * hs : 3 * hs]
        if spec.input_forget:
            np.subtract(1, gi, out=gf)
        gc = g_act(a[:, 3 * hs :], gates[:, 3 * hs :])
        np.multiply(gf, c, out=c_new)
        np.multiply(gi, gc, out=h_new)  # h_new as scratch until the last line
        c_new += h_new
    else:
        ai, ao, af, ac = a[:, :hs], a[:, hs : 2 * hs], a[:, 2 * hs : 3 * hs], a[:, 3 * hs :]
        ai += p[:hs] * c
        af += p[2 * hs :] * c
        if spec.clip is not None:  # o's pre-activation gets its peephole (on the new c) first
            lim = spec.clip
            for k, part in ((0, ai), (2, af), (3, ac)):
                if kept is not None:
                    np.less_equal(np.abs(part), lim, out=kept[:, k * hs : (k + 1) * hs])
                np.clip(part, -lim, lim, out=part)
        gi = f_act(ai, gates[:, :hs])
        gf = gates[:, 2 * hs : 3 * hs]
        if spec.input_forget:
            np.subtract(1, gi, out=gf)
        else:
            f_act(af, gf)
        gc = g_act(ac, gates[:, 3 * hs :])
        np.multiply(gf, c, out=c_new)
        c_new += gi * gc
        ao += p[hs : 2 * hs] * c_new
        if spec.clip is not None:
            if kept is not None:
                np.less_equal(np.abs(ao), spec.clip, out=kept[:, hs : 2 * hs])
            np.clip(ao, -spec.clip, spec.clip, out=ao)
        f_act(ao, gates[:, hs : 2 * hs])
    h_act(c_new, hc)
    np.multiply(gates[:, hs : 2 * hs], hc, out=h_new)


def _gru_step(spec, a, h, r, rb, acts, kept, gates, ex, h_new):
    """One GRU step; a holds X W^T + Wb (+ Rb for z and r) [N, 3H] (gates z, r, h), updated in place; gate values
    into gates, the value R_h reads (r*h, or h R_h^T + Rb_h with linear_before_reset) into ex, the new h into
    h_new."""
    hs = spec.hidden
    f_act, g_act = acts
    if spec.linear_before_reset:  # one product against all of R
        hr = np.dot(h, r.T)
        a[:, : 2 * hs] += hr[:, : 2 * hs]
        np.add(hr[:, 2 * hs :], rb[2 * hs :], out=ex)  # h R_h^T + Rb_h
    else:
        a[:, : 2 * hs] += np.dot(h, r[: 2 * hs].T)
    azr, ah = a[:, : 2 * hs], a[:, 2 * hs :]
    if spec.clip is not None:
        if kept is not None:
            np.less_equal(np.abs(azr), spec.clip, out=kept[:, : 2 * hs])
        np.clip(azr, -spec.clip, spec.clip, out=azr)
    f_act(azr, gates[:, : 2 * hs])
    z, rr = gates[:, :hs], gates[:, hs : 2 * hs]
    if spec.linear_before_reset:
        ah += rr * ex
    else:
        np.multiply(rr, h, out=ex)
        ah += np.dot(ex, r[2 * hs :].T)
        ah += rb[2 * hs :]
    if spec.clip is not None:
        if kept is not None:
            np.less_equal(np.abs(ah), spec.clip, out=kept[:, 2 * hs :])
        np.clip(ah, -spec.clip, spec.clip, out=ah)
    hh = g_act(ah, gates[:, 2 * hs :])
    np.subtract(h, hh, out=h_new)  # (1 - z) * hh + z * h = hh + z * (h - hh)
    h_new *= z
    h_new += hh


def forward(spec: Spec, noutputs: int, trace: np.ndarray | None = None):
    """(Y, Y_h[, Y_c]) in the node's layout; each direction's trace written into trace [D, size] when given."""
    t_len, n, _ = spec.x.shape
    nd, hs = spec.directions, spec.hidden
    dt = spec.x.dtype
    y = np.empty((t_len, nd, n, hs), dt)
    yh = np.empty((nd, n, hs), dt)
    yc = np.empty((nd, n, hs), dt)
    y_d = np.empty((t_len, n, hs), dt)
    for d in range(nd):
        tr = None if trace is None else carve(spec, trace[d])
        with np.errstate(over="ignore"):  # sigmoid's exp(-x) overflows to inf for x < -88: 1 / inf = 0, right
            yh[d], c = run_direction(spec, d, y_d, tr)
        y[:, d] = _steps_out(spec, d, y_d)
        if c is not None:
            yc[d] = c
    if spec.layout == 1:
        y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
        y, yh, yc = np.ascontiguousarray(y), np.ascontiguousarray(yh), np.ascontiguousarray(yc)
    outs = (y, yh, yc) if spec.op == "LSTM" else (y, yh)
    return outs[: max(1, noutputs)]


# ---------------------------------------------------------------------------------------------------- the kernels
def _run_forward(
    op: str,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    noutputs: int = 1,
    out: np.ndarray | None = None,
    **attrs,
):
    """The kernels' shared body: their parameters (a kernel passes its locals()) -> the outputs asked for; the
    training-mode forwards (op "LSTMTrain", ...) write the trace first, into out when given (its planned buffer)."""
    train = op.endswith("Train")
    op = op[: -len("Train")] if train else op
    spec = make_spec(op, X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs)
    if not train:
        outs = forward(spec, noutputs)
        return outs if len(outs) > 1 else outs[0]
    trace = new_trace(spec) if out is None else out
    assert trace.shape == new_trace_shape(spec) and trace.dtype == spec.x.dtype, (trace.shape, trace.dtype)
    return (trace, *forward(spec, N_STATES[op] + 1, trace))


def _run_backward(
    op: str,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    dY=None,
    dY_h=None,
    dY_c=None,
    noutputs: int = 1,
    **attrs,
):
    """The fused backward ops' shared body: their parameters (a kernel passes its locals()) -> the gradients.
    initial_h may be the training forward's trace (2-D, where a state is 3-D): it holds the initial states."""
    trace = None
    if initial_h is not None and np.ndim(initial_h) == 2:
        trace, initial_h = initial_h, None  # the backward reads the states from the trace
    spec = make_spec(op, X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs)
    return backward(spec, dY, dY_h, dY_c, noutputs, trace)


@kernel("LSTM")
def lstm(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
):
    return _run_forward("LSTM", **locals())


@kernel("GRU")
def gru(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
):
    return _run_forward("GRU", **locals())


@kernel("RNN")
def rnn(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
):
    return _run_forward("RNN", **locals())


# ---------------------------------------------------------------------------------------------------- backward
def _seed(spec: Spec, v: np.ndarray | None, kind: str) -> np.ndarray | None:
    """A gradient seed in layout 0 ([T, D, N, H] for Y, [D, N, H] for the states)."""
    if v is None:
        return None
    v = np.asarray(v)
    if spec.layout == 1:
        v = v.transpose(1, 2, 0, 3) if kind == "Y" else v.transpose(1, 0, 2)
    return v


def backward(spec: Spec, dy, dyh, dyc, noutputs: int, trace: np.ndarray | None = None):
    """Gradients (dX, dW, dR, dB, d initial_h[, d initial_c, dP]) of a recurrent node, in its layout; the
    first noutputs of them. trace: the training-mode forward's (LSTMTrain, ...); without it, the forward runs
    again to make one."""
    if trace is None:
        trace = new_trace(spec)
        forward(spec, 3, trace)
    else:
        trace = _checked_trace(spec, trace)
    traces = [carve(spec, trace[d]) for d in range(spec.directions)]
    dy, dyh, dyc = _seed(spec, dy, "Y"), _seed(spec, dyh, "h"), _seed(spec, dyc, "h")
    t_len, n, i_size = spec.x.shape
    nd, hs, g = spec.directions, spec.hidden, GATES[spec.op]
    dt = spec.x.dtype
    want_w = noutputs > 1
    dx = np.zeros((t_len, n, i_size), dt)
    dw = np.zeros_like(spec.w) if want_w else None
    dr = np.zeros_like(spec.r) if want_w else None
    db = np.zeros((nd, 2 * g * hs), dt) if want_w else None
    dh0 = np.zeros((nd, n, hs), dt)
    dc0 = np.zeros((nd, n, hs), dt)
    dp = np.zeros((nd, 3 * hs), dt)
    mask = _mask(spec)
    for d in range(nd):
        tr = traces[d]
        da, extra_grad, dh, dc = _back_through_time(spec, d, tr, mask, dy, dyh, dyc)
        dh0[d] = dh
        if dc is not None:
            dc0[d] = dc
        # the GEMMs over all steps
        da2 = da.reshape(t_len * n, g * hs)
        dx_d = np.dot(da2, spec.w[d]).reshape(t_len, n, i_size)
        dx += _steps_out(spec, d, dx_d)
        if want_w:
            _weight_grads(spec, d, tr, da, extra_grad, dw, dr, db, dp)
    if spec.layout == 1:
        dx = dx.transpose(1, 0, 2)
        dh0 = dh0.transpose(1, 0, 2)
        dc0 = dc0.transpose(1, 0, 2)
    outs = [np.ascontiguousarray(dx), dw, dr, db, np.ascontiguousarray(dh0)]
    if spec.op == "LSTM":
        outs += [np.ascontiguousarray(dc0), dp]
    return tuple(outs[:noutputs]) if noutputs > 1 else outs[0]


def _checked_trace(spec: Spec, trace) -> np.ndarray:
    trace = np.asarray(trace)
    want = new_trace_shape(spec)
    if trace.shape != want or trace.dtype != spec.x.dtype:
        raise ShapeError(
            f"{spec.op}Grad: input trace is {trace.dtype} {tuple(trace.shape)}; the {spec.op}Train node of these "
            f"inputs and attributes writes {spec.x.dtype} {want}"
        )
    return trace


def _back_through_time(
    spec: Spec, d: int, tr: Trace, mask: np.ndarray | None, dy, dyh, dyc
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Direction d's trace and the seeds (layout 0) -> (da [T, N, G*H]: the gradient of every step's
    pre-activations, in processing order; GRU's extra_grad [T, N, H] or None; d initial_h; d initial_c or None)."""
    t_len, n, _ = spec.x.shape
    hs, g = spec.hidden, GATES[spec.op]
    dt = spec.x.dtype
    m = None if mask is None else _steps_in(spec, d, mask)
    dy_d = None if dy is None else _steps_in(spec, d, dy[:, d])
    dh = np.zeros((n, hs), dt) if dyh is None else dyh[d].astype(dt, copy=True)
    dc = None
    if spec.op == "LSTM":
        dc = np.zeros((n, hs), dt) if dyc is None else dyc[d].astype(dt, copy=True)
    da = np.empty((t_len, n, g * hs), dt)
    extra_grad = np.empty((t_len, n, hs), dt) if spec.op == "GRU" else None
    r = spec.r[d]
    p = spec.p[d] if spec.p is not None else None
    slopes = _slopes(spec, tr, d)
    slope_h = spec.acts[d][2].slope(tr.c[1:], tr.extra) if spec.op == "LSTM" else None
    if spec.op == "LSTM" and p is None and not spec.input_forget and m is None:
        dh, dc = _lstm_loop(spec, tr, dy_d, dh, dc, r, da, slopes, slope_h)
        return da, None, dh, dc
    # the hot path: per step, only the cell's own call; da and extra_grad are filled in place, step by step
    for t in range(t_len - 1, -1, -1):
        # the state after step t is h[t+1]; with a mask, a padded step passes its gradient straight through
        if dy_d is not None:
            dh_new = dh + dy_d[t]
        else:
            dh_new = dh
        if m is not None:
            mt = m[t]
            dh_pass = np.where(mt, 0, dh)
            dh_new = np.where(mt, dh_new, 0)
            if dc is not None:
                dc_pass = np.where(mt, 0, dc)
                dc = np.where(mt, dc, 0)
        if spec.op == "RNN":
            np.multiply(dh_new, slopes[t], out=da[t])
            dh = np.dot(da[t], r)
        elif spec.op == "LSTM":
            dh, dc = _lstm_back(spec, tr, t, dh_new, dc, p, r, da[t], slopes[t], slope_h[t])
        else:
            dh = _gru_back(spec, tr, t, dh_new, r, da[t], slopes[t], extra_grad[t])
        if m is not None:
            dh = dh + dh_pass
            if dc is not None:
                dc = dc + dc_pass
    return da, extra_grad, dh, dc


def _lstm_loop(spec: Spec, tr: Trace, dy_d, dh, dc, r, da, s, s_h) -> tuple[np.ndarray, np.ndarray]:
    """Back through time for an LSTM without peepholes, input_forget or lengths (the common cell), in seven
    numpy calls a step: each gate's gradient is dct (the cell state's) times a factor computed for all steps at
    once, o's is dh times its own. Fills da [T, N, 4H]; returns (d initial_h, d initial_c). s and s_h (the gates'
    and h's slopes, owned here) become those factors in place."""
    hs = spec.hidden
    t_len, n, _ = da.shape
    g = tr.gates
    s[..., :hs] *= g[..., 3 * hs :]  # i = dct * gc * slope_i
    s[..., hs : 2 * hs] *= tr.extra  # o = dh * h_act(c) * slope_o
    s[..., 2 * hs : 3 * hs] *= tr.c[:-1]  # f = dct * c_prev * slope_f
    s[..., 3 * hs :] *= g[..., :hs]  # c = dct * gi * slope_c
    s_h *= g[..., hs : 2 * hs]  # dct = dh * o * slope_h(c) + dc
    m4, da4 = s.reshape(t_len, n, 4, hs), da.reshape(t_len, n, 4, hs)
    gf = g[..., 2 * hs : 3 * hs]
    dct = np.empty((n, hs), da.dtype)
    dh_new = np.empty((n, hs), da.dtype) if dy_d is not None else dh
    for t in range(t_len - 1, -1, -1):
        if dy_d is not None:
            np.add(dh, dy_d[t], out=dh_new)
        np.multiply(dh_new, s_h[t], out=dct)
        dct += dc
        np.multiply(dct[:, None, :], m4[t], out=da4[t])  # o's slot too, overwritten next
        np.multiply(dh_new, m4[t, :, 1], out=da4[t, :, 1])
        np.multiply(dct, gf[t], out=dc)
        np.dot(da[t], r, out=dh)
    return dh, dc


def _weight_grads(
    spec: Spec, d: int, tr: Trace, da: np.ndarray, extra_grad: np.ndarray | None, dw, dr, db, dp
) -> None:
    """Direction d's da (and GRU's extra_grad) -> its dW, dR, dB (and LSTM's dP) into dw, dr, db, dp, each one
    GEMM or sum over all steps."""
    t_len, n, i_size = spec.x.shape
    hs, g = spec.hidden, GATES[spec.op]
    da2 = da.reshape(t_len * n, g * hs)
    x_d = _steps_in(spec, d, spec.x)
    dw[d] = np.dot(da2.T, x_d.reshape(t_len * n, i_size))
    db[d, : g * hs] = da2.sum(axis=0)
    hprev = tr.h[:-1].reshape(t_len * n, hs)
    if spec.op == "GRU":
        dr[d, : 2 * hs] = np.dot(da2[:, : 2 * hs].T, hprev)
        db[d, g * hs : g * hs + 2 * hs] = da2[:, : 2 * hs].sum(axis=0)
        eg = extra_grad.reshape(t_len * n, hs)
        if spec.linear_before_reset:  # extra_grad = d(h R_h^T + Rb_h)
            dr[d, 2 * hs :] = np.dot(eg.T, hprev)
            db[d, g * hs + 2 * hs :] = eg.sum(axis=0)
        else:  # extra_grad = d a_h: R_h reads r*h
            dr[d, 2 * hs :] = np.dot(eg.T, tr.extra.reshape(t_len * n, hs))
            db[d, g * hs + 2 * hs :] = eg.sum(axis=0)
    else:
        dr[d] = np.dot(da2.T, hprev)
        db[d, g * hs :] = db[d, : g * hs]
    if spec.op == "LSTM" and spec.p is not None:
        dai, dao, daf = da[..., :hs], da[..., hs : 2 * hs], da[..., 2 * hs : 3 * hs]
        dp[d, :hs] = (dai * tr.c[:-1]).sum(axis=(0, 1))
        dp[d, hs : 2 * hs] = (dao * tr.c[1:]).sum(axis=(0, 1))
        if not spec.input_forget:
            dp[d, 2 * hs :] = (daf * tr.c[:-1]).sum(axis=(0, 1))


def _slopes(spec: Spec, tr: Trace, d: int) -> np.ndarray:
    """[T, N, G*H]: the slope of each gate's activation at every step (0 where clip bounded its input), computed
    for all steps at once."""
    hs, op = spec.hidden, spec.op
    acts = spec.acts[d]
    s = np.empty_like(tr.gates)
    k = {"RNN": 1, "LSTM": 3, "GRU": 2}[op] * hs  # the gates the first activation applies to
    a = tr.a
    acts[0].slope(None if a is None else a[..., :k], tr.gates[..., :k], out=s[..., :k])
    if op != "RNN":
        acts[1].slope(None if a is None else a[..., k:], tr.gates[..., k:], out=s[..., k:])
    if tr.kept is not None:
        s *= tr.kept
    return s


def _lstm_back(spec: Spec, tr: Trace, t: int, dh_new, dc, p, r, da, s, s_h):
    """One step back through an LSTM cell: (dh_prev, dc_prev); fills da [N, 4H] (i, o, f, c). s: the gates'
    slopes at this step, s_h: h's slope at the new cell state."""
    hs = spec.hidden
    gates = tr.gates[t]
    gi, go, gf, gc = gates[:, :hs], gates[:, hs : 2 * hs], gates[:, 2 * hs : 3 * hs], gates[:, 3 * hs :]
    dai, dao, daf, dac = da[:, :hs], da[:, hs : 2 * hs], da[:, 2 * hs : 3 * hs], da[:, 3 * hs :]
    np.multiply(dh_new, tr.extra[t], out=dao)  # h = o * h_act(c)
    dao *= s[:, hs : 2 * hs]
    dct = dh_new * go
    dct *= s_h
    dct += dc
    if p is not None:
        dct += dao * p[hs : 2 * hs]
    np.multiply(dct, gc, out=dai)
    np.multiply(dct, tr.c[t], out=daf)  # with a mask, c[t] is the state this step read
    if spec.input_forget:  # f = 1 - i
        dai -= daf
        daf[...] = 0
    else:
        daf *= s[:, 2 * hs : 3 * hs]
    dai *= s[:, :hs]
    np.multiply(dct, gi, out=dac)
    dac *= s[:, 3 * hs :]
    dc_prev = dct * gf
    if p is not None:
        dc_prev += dai * p[:hs]
        if not spec.input_forget:
            dc_prev += daf * p[2 * hs :]
    return np.dot(da, r), dc_prev


def _gru_back(spec: Spec, tr: Trace, t: int, dh_new, r, da, s, extra_grad):
    """One step back through a GRU cell: dh_prev; fills da [N, 3H] (z, r, h) and extra_grad (the gradient of
    what R_h multiplies: d(h R_h^T + Rb_h) with linear_before_reset, else d a_h)."""
    hs = spec.hidden
    gates = tr.gates[t]
    z, rr, hh = gates[:, :hs], gates[:, hs : 2 * hs], gates[:, 2 * hs :]
    daz, dar, dah = da[:, :hs], da[:, hs : 2 * hs], da[:, 2 * hs :]
    h_prev = tr.h[t]
    np.subtract(1, z, out=dah)  # h = (1 - z) * hh + z * h_prev
    dah *= dh_new
    dah *= s[:, 2 * hs :]
    np.subtract(h_prev, hh, out=daz)
    daz *= dh_new
    daz *= s[:, :hs]
    dh_prev = dh_new * z
    if spec.linear_before_reset:
        np.multiply(dah, rr, out=extra_grad)  # a_h = x W_h^T + r * (h R_h^T + Rb_h)
        np.multiply(dah, tr.extra[t], out=dar)
        dh_prev += np.dot(extra_grad, r[2 * hs :])
    else:
        d_rh = np.dot(dah, r[2 * hs :])  # a_h = x W_h^T + (r * h) R_h^T + Rb_h
        np.multiply(d_rh, h_prev, out=dar)
        d_rh *= rr
        dh_prev += d_rh
        extra_grad[...] = dah
    dar *= s[:, hs : 2 * hs]
    dh_prev += np.dot(da[:, : 2 * hs], r[: 2 * hs])
    return dh_prev


# LSTMGrad(X, W, R, B, sequence_lens, initial_h, initial_c, P, dY, dY_h, dY_c) -> dX, dW, dR, dB, d initial_h,
# d initial_c, dP (the LSTM's attributes); an omitted seed is a zero gradient. In place of initial_h, the fused
# backward may read LSTMTrain's trace [D, size], whose states begin with the initial ones: then it runs no forward
# (the trace is 2-D, a state 3-D: the kernel, the shapes and the body tell them apart so).
def _backward_shapes(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    """LSTMGrad, GRUGrad, RNNGrad: the gradients of X, W, R, B, initial_h (and initial_c, P), each of its input's
    shape; B, initial_h (initial_c, P) of their default shape when the node has no such input."""
    x, w, r = infos[0], infos[1], infos[2]
    gates = {"LSTMGrad": 4, "GRUGrad": 3, "RNNGrad": 1}[node.op_type]
    d, hidden = w.shape[0], r.shape[2]
    batch_first = bool(int(node.attrs.get("layout", 0)))
    batch = x.shape[0] if batch_first else x.shape[1]
    state = (batch, d, hidden) if batch_first else (d, batch, hidden)

    def given(k: int, shape: tuple[int, ...]) -> TensorInfo:
        return infos[k] if k < len(infos) and infos[k] is not None else TensorInfo(x.dtype, shape)

    h0 = given(5, state)
    if len(h0.shape) == 2:  # the training forward's trace stands in for initial_h (it holds the states)
        h0 = TensorInfo(x.dtype, state)
    made = [x, w, r, given(3, (d, 2 * gates * hidden)), h0]
    if node.op_type == "LSTMGrad":
        made += [given(6, state), given(7, (d, 3 * hidden))]
    return [TensorInfo(x.dtype, tuple(m.shape)) for m in made[: len(node.outputs)]]


@kernel("LSTMGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def lstm_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    dY=None,
    dY_h=None,
    dY_c=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
):
    return _run_backward("LSTM", **locals())


# GRUGrad(X, W, R, B, sequence_lens, initial_h or the trace, dY, dY_h) -> dX, dW, dR, dB, d initial_h
@kernel("GRUGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def gru_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    dY=None,
    dY_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
):
    return _run_backward("GRU", **locals())


# RNNGrad(X, W, R, B, sequence_lens, initial_h or the trace, dY, dY_h) -> dX, dW, dR, dB, d initial_h
@kernel("RNNGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def rnn_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    dY=None,
    dY_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
):
    return _run_backward("RNN", **locals())


# ---------------------------------------------------------------------------------------------------- training mode
# LSTMTrain (LSTM's inputs and attributes) -> trace, Y, Y_h, Y_c; GRUTrain / RNNTrain -> trace, Y, Y_h. The forward
# of the training step where a backward reads it: each direction's trace [D, size] (trace_blocks: gates, states,
# ...), which the fused backward reads instead of running the forward again, written first (into its planned
# buffer: it is the largest output), and the op's outputs (all of them, whichever the graph reads).
def _train_shapes(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    op = node.op_type[: -len("Train")]
    x, r = infos[0], infos[2]
    d, hidden = r.shape[0], r.shape[2]
    batch_first = bool(int(node.attrs.get("layout", 0)))
    t_len, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    y = (batch, t_len, d, hidden) if batch_first else (t_len, d, batch, hidden)
    state = (batch, d, hidden) if batch_first else (d, batch, hidden)
    acts = resolve_activations(
        op,
        DEFAULT_ACTS[op],
        d,
        node.attrs.get("activations"),
        node.attrs.get("activation_alpha"),
        node.attrs.get("activation_beta"),
    )
    size = trace_size(op, t_len, batch, hidden, pre=needs_pre(acts), clip=node.attrs.get("clip") is not None)
    shapes = [(d, size), y] + [state] * N_STATES[op]
    return [TensorInfo(x.dtype, s) for s in shapes]


@kernel("LSTMTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def lstm_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("LSTMTrain", **locals())


@kernel("GRUTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def gru_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("GRUTrain", **locals())


@kernel("RNNTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def rnn_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("RNNTrain", **locals())
