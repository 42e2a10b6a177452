"""The GRU cell (gates z, r, h), with and without linear_before_reset: one step forward and one step back. The
drivers (forward.py, backward.py) call them."""

from __future__ import annotations

import numpy as np

from .spec import Spec
from .trace import Trace


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
