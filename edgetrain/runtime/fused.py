"""The optimizer's update as a few numpy calls over flat buffers (numpy only): (gradients, learning rate) -> the
next parameters and optimizer state, for SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW, with
optional global gradient-norm clipping.

Parameters of one dtype live in one contiguous array, each a view into it; so do their gradients (the step program
writes them there directly) and each kind of state. The update is the same arithmetic, in the same order and
dtypes, as the update nodes edgetrain.optimizers builds into the step graph, so the result is that graph's, bit for
bit, whatever the number of tensors. Next values go to a second set of buffers; only when every one is usable do
the two sets swap: a refused step leaves the parameters and state as they were, without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .kernels import KERNELS

SUPPORTED = ("SGD", "Adam", "AdamW")


def fusable(config: Mapping[str, Any], dtypes: Sequence[np.dtype]) -> bool:
    """Whether this optimizer config can run fused (clipping across dtypes would need the graph's casts)."""
    if config.get("type") not in SUPPORTED:
        return False
    return not (config.get("clip_grad_norm") is not None and len(set(dtypes)) > 1)


class _Group:
    """The parameters of one dtype: their flat buffers (two sets of parameters and state, one of gradients, two
    scratch) and each tensor's view into each."""

    def __init__(
        self, dtype: np.dtype, names: list[str], shapes: dict[str, tuple[int, ...]], kinds: list[str]
    ):
        self.dtype, self.names = dtype, names
        self.slices = {}
        off = 0
        for n in names:
            size = math.prod(shapes[n])
            self.slices[n] = (off, off + size, shapes[n])
            off += size
        self.size = off
        self.kinds = kinds  # state kinds: "momentum", or "exp_avg" and "exp_avg_sq"
        self.params = [np.zeros(off, dtype), np.zeros(off, dtype)]
        self.state = {k: [np.zeros(off, dtype), np.zeros(off, dtype)] for k in kinds}
        self.grad = np.zeros(off, dtype)
        self.s1, self.s2 = np.zeros(off, dtype), np.zeros(off, dtype)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return {n: flat[a:b].reshape(shape) for n, (a, b, shape) in self.slices.items()}


class FusedOptimizer:
    """Owns the parameters and optimizer state of a session as flat buffers; see the module docstring.

    params: parameter name -> (shape, dtype), in the artifact's order; state_roles: state name -> (kind, weight)
    with kind "momentum", "exp_avg", "exp_avg_sq" or "step"; initial: name -> initial value (params and state)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        params: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        state_roles: Mapping[str, tuple[str, str]],
        initial: Mapping[str, np.ndarray],
    ):
        self.config = dict(config)
        self.kind = self.config["type"]
        by_dtype: dict[np.dtype, list[str]] = {}
        for name, (_, dtype) in params.items():
            by_dtype.setdefault(np.dtype(dtype), []).append(name)
        kinds = sorted({k for k, _ in state_roles.values() if k != "step"})
        shapes = {n: tuple(s) for n, (s, _) in params.items()}
        self.groups = [_Group(dt, names, shapes, kinds) for dt, names in by_dtype.items()]
        self.state_name = {(k, w): n for n, (k, w) in state_roles.items()}  # (kind, weight) -> state name
        self.step_name = next((n for n, (k, _) in state_roles.items() if k == "step"), None)
        self.step_value = np.zeros((), np.float32)
        self.cur = 0
        self._views = [self._collect(0), self._collect(1)]
        self.load(initial)

    def _collect(self, k: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for g in self.groups:
            out.update(g.views(g.params[k]))
            for kind, bufs in g.state.items():
                for w, v in g.views(bufs[k]).items():
                    name = self.state_name.get((kind, w))
                    if name is not None:
                        out[name] = v
        return out

    # ---- what the session sees -----------------------------------------------------------------------------
    def values(self) -> dict[str, np.ndarray]:
        """Every parameter and state tensor by name: views into the current buffers (the step counter as a 0-d
        array). Write into them (np.copyto), never rebind them."""
        out = dict(self._views[self.cur])
        if self.step_name is not None:
            out[self.step_name] = self.step_value
        return out

    def gradients(self) -> dict[str, np.ndarray]:
        """Parameter -> the view its gradient must be written into."""
        out = {}
        for g in self.groups:
            out.update(g.views(g.grad))
        return out

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Copies the given parameters and state into the current buffers."""
        current = self.values()
        for name, v in values.items():
            if name == self.step_name:
                self.step_value = np.array(v, np.float32).reshape(())
            elif name in current:
                np.copyto(current[name], v)

    # ---- the update ----------------------------------------------------------------------------------------
    def update(self, lr: float) -> list[str]:
        """Computes the next parameters and state from the gradients into the other buffers; when all are usable,
        makes them current and returns []; else returns the names that are not, and changes nothing."""
        nxt = 1 - self.cur
        if self.config.get("clip_grad_norm") is not None:
            self._clip()
        step_next = None
        for g in self.groups:
            if self.kind == "SGD":
                self._sgd(g, lr, nxt)
            else:
                step_next = self._adam(g, lr, nxt)
        bad = [n for g in self.groups for n in self._unusable(g, nxt)]
        if bad:
            return bad
        self.cur = nxt
        if self.step_name is not None:
            self.step_value = step_next if step_next is not None else self.step_value + np.float32(1)
        return []

    def _unusable(self, g: _Group, k: int) -> list[str]:
        # One BLAS dot product per buffer: x.x is not finite when any value is NaN or infinite, or when a value is
        # so large (|x| > sqrt(max)) that products of such values overflow: the same bound the session's checks
        # use, found in a fraction of their time. Only then are the tensors looked at one by one, to name them.
        from .training import _usable

        bad = []
        if not np.isfinite(np.dot(g.params[k], g.params[k])):
            views = g.views(g.params[k])
            bad += [n for n, v in views.items() if not _usable(v)]
        for kind, bufs in g.state.items():
            # SGD's new parameters are w - lr * (an expression of the new momentum): a momentum that is not
            # finite makes them not finite (lr 0 too: 0 * inf is NaN), so checking them has checked it
            if self.kind == "SGD" and not bad:
                continue
            if not np.isfinite(np.dot(bufs[k], bufs[k])):
                views = g.views(bufs[k])
                bad += [self.state_name.get((kind, w), w) for w, v in views.items() if not _usable(v)]
        if (g.params[k].size or g.state) and not bad and not np.isfinite(np.dot(g.params[k], g.params[k])):
            bad.append("the parameters together (their squared norm overflows)")
        return bad

    def _clip(self) -> None:
        # as edgetrain.optimizers._clip_by_global_norm: each gradient's ReduceSumSquare (the same kernel), their
        # Sum, Sqrt, coef = min(max_norm / (total + 1e-6), 1), every gradient times coef
        max_norm = float(self.config["clip_grad_norm"])
        grads = [v for g in self.groups for v in g.views(g.grad).values()]
        sq = KERNELS["ReduceSumSquare"].fn
        squares = [sq(v, keepdims=0) for v in grads]
        total = squares[0] if len(squares) == 1 else KERNELS["Sum"].fn(*squares)
        total = np.sqrt(total)
        t = total.dtype.type
        coef = np.minimum(np.divide(t(max_norm), np.add(total, t(1e-6))), t(1.0))
        for g in self.groups:
            np.multiply(g.grad, coef, out=g.grad)

    def _sgd(self, g: _Group, lr: float, k: int) -> None:
        # as edgetrain.optimizers.SGD.make: d = g + w * wd; v' = v * m + d * (1 - damp) (v' = d on the first
        # step when damp != 0); d = d + v' * m (Nesterov) or v'; w' = w - d * lr
        c = self.config
        t = g.dtype.type
        w, cur = g.params[self.cur], self.cur
        d = g.grad
        if c.get("weight_decay"):
            np.multiply(w, t(c["weight_decay"]), out=g.s1)
            np.add(g.grad, g.s1, out=g.s1)
            d = g.s1
        if c.get("momentum"):
            v, vn = g.state["momentum"][cur], g.state["momentum"][k]
            np.multiply(v, t(c["momentum"]), out=vn)
            if c.get("dampening"):
                first = float(self.step_value) == 0.0
                np.multiply(d, t(1.0 - c["dampening"]), out=g.s2)
                np.add(vn, g.s2, out=vn)
                if first:
                    np.copyto(vn, d)
            else:
                np.add(vn, d, out=vn)
            if c.get("nesterov"):
                np.multiply(vn, t(c["momentum"]), out=g.s2)
                np.add(d, g.s2, out=g.s1)
                d = g.s1
            else:
                d = vn
        np.multiply(d, t(np.float32(lr)), out=g.s2)
        np.subtract(w, g.s2, out=g.params[k])

    def _adam(self, g: _Group, lr: float, k: int) -> np.ndarray:
        # as edgetrain.optimizers.Adam.make: m' = m b1 + d (1 - b1); v' = v b2 + d d (1 - b2); t = step + 1;
        # w' = w (1 - lr wd, AdamW) - (lr / (1 - b1^t)) * (m' / (sqrt(v' / (1 - b2^t)) + eps))
        c = self.config
        t = g.dtype.type
        b1, b2 = (float(b) for b in c["betas"])
        cur, w = self.cur, g.params[self.cur]
        lr_t = t(np.float32(lr))
        decoupled = self.kind == "AdamW"
        d = g.grad
        if c.get("weight_decay") and not decoupled:
            np.multiply(w, t(c["weight_decay"]), out=g.s1)
            np.add(g.grad, g.s1, out=g.s1)
            d = g.s1
        m, mn = g.state["exp_avg"][cur], g.state["exp_avg"][k]
        v, vn = g.state["exp_avg_sq"][cur], g.state["exp_avg_sq"][k]
        np.multiply(m, t(b1), out=mn)
        np.multiply(d, t(1 - b1), out=g.s2)
        np.add(mn, g.s2, out=mn)
        np.multiply(d, d, out=g.s2)
        np.multiply(g.s2, t(1 - b2), out=g.s2)
        np.multiply(v, t(b2), out=vn)
        np.add(vn, g.s2, out=vn)
        step_next = np.add(self.step_value, np.float32(1))
        ts = np.asarray(step_next).astype(g.dtype)
        pow_ = KERNELS["Pow"].fn
        one = np.asarray(t(1.0))
        bc1 = np.subtract(one, pow_(np.asarray(t(b1)), ts))
        bc2 = np.subtract(one, pow_(np.asarray(t(b2)), ts))
        np.divide(vn, bc2, out=g.s2)
        np.sqrt(g.s2, out=g.s2)
        np.add(g.s2, t(c["eps"]), out=g.s2)
        np.divide(mn, g.s2, out=g.s2)
        np.multiply(np.divide(lr_t, bc1), g.s2, out=g.s2)
        if c.get("weight_decay") and decoupled:
            np.multiply(w, np.subtract(one, np.multiply(lr_t, t(c["weight_decay"]))), out=g.params[k])
            np.subtract(g.params[k], g.s2, out=g.params[k])
        else:
            np.subtract(w, g.s2, out=g.params[k])
        return step_next
