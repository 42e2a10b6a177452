"""The LSTM cell (gates i, o, f, c): one step forward with peepholes, input_forget and clip; one step back; and
the loop back through time of the common cell (no peepholes, no input_forget, no lengths), a few numpy calls a
step. The drivers (forward.py, backward.py) call them."""

from __future__ import annotations

import numpy as np

from .spec import Spec, _clip
from .trace import Trace


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
