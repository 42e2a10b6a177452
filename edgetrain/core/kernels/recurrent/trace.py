"""The trace: what one direction of the training-mode forward keeps for the backward (gate values,
pre-activations where a slope needs them, the clip mask, the states before each step), as blocks of one flat row
[size] per direction, and the views the drivers read and write it through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .activations import Act
from .spec import GATES, Spec


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
