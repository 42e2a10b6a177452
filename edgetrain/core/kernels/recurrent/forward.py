"""The forward driver: per direction, the input projection of all steps as one GEMM, then each step's cell (RNN's
here, LSTM's and GRU's from their modules) written where its result stays: the trace's rows when it keeps one, else
Y's rows and a few scratch buffers; sequence lengths by masking."""

from __future__ import annotations

import numpy as np

from .gru import _gru_step
from .lstm import _lstm_step
from .spec import GATES, Spec, _clip, _mask, _steps_in, _steps_out
from .trace import Trace, carve


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
