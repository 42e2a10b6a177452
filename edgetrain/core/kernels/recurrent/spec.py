"""A recurrent node's inputs and attributes, checked, as a Spec in layout 0 (X [T, N, I]); the cells' gate counts
and default activations, the directions, and the order a direction takes its steps in (a reverse direction
reverses each sequence within its own length); clip applied to a step's pre-activations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError

from .activations import Act, _f32, resolve_activations

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


def _clip(spec: Spec, a: np.ndarray, kept: np.ndarray | None) -> None:
    if spec.clip is not None:
        if kept is not None:
            np.less_equal(np.abs(a), spec.clip, out=kept)
        np.clip(a, -spec.clip, spec.clip, out=a)
