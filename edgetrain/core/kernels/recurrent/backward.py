"""The backward driver: from the trace (made by running the forward again when there is none), back through time
per direction (RNN's step here, LSTM's and GRU's from their modules), the gradient of every step's
pre-activations in one array, then dX, dW, dR and dB each one GEMM or sum over all steps."""

from __future__ import annotations

import numpy as np

from edgetrain.core.errors import ShapeError

from .forward import forward
from .gru import _gru_back
from .lstm import _lstm_back, _lstm_loop
from .spec import GATES, Spec, _mask, _steps_in, _steps_out
from .trace import Trace, carve, new_trace, new_trace_shape


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
