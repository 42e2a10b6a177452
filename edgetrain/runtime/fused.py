"""The optimizer's update as a few numpy calls over flat buffers (numpy only): (gradients, learning rate) -> the
next parameters and optimizer state, for SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW, with
optional global gradient-norm clipping.

Parameters of one dtype live in one contiguous array, each a view into it; so do their gradients (the step program
writes them there directly) and each kind of state. The update is the same arithmetic, in the same order and
dtypes, as the update nodes edgetrain.derive.optimizers builds into the step graph, so the result is that graph's,
bit for bit, whatever the number of tensors. It runs in place, a cache-sized chunk at a time (the scratch is two chunks,
not two more copies of the parameters).

A refused step must leave the parameters and state as they were. Before updating, a bound from the norms of the
parameters, state and gradients (one BLAS dot product each) shows that every new value will be usable (finite,
and no larger than sqrt(the dtype's largest value), as TrainingSession requires); only when it cannot show it
(a NaN or infinite gradient, values near the overflow range, eps 0) is a copy of the parameters and state kept
for the step, checked after it, and put back if the step is refused. Memory: parameters, state and gradients once
each, plus two chunks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgetrain.core import fastpaths
from edgetrain.core.kernels import KERNELS
from edgetrain.graph.record import OptimizerRecord, optimizer_record

SUPPORTED = ("SGD", "Adam", "AdamW")


def fusable(optimizer: OptimizerRecord, dtypes: Sequence[np.dtype]) -> bool:
    """Whether this optimizer can run fused (clipping across dtypes would need the graph's casts)."""
    if optimizer.type not in SUPPORTED:
        return False
    return not (optimizer.clip_grad_norm is not None and len(set(dtypes)) > 1)


CHUNK = (
    1 << 15
)  # elements per chunk of the update (128 KiB of float32 per stream: the working set stays in L2)
MARGIN = 0.25  # the bound must stay under this fraction of the usable limit (covers rounding in the norms)
# a carried bound grows by this each step: the update's float rounding (a few ulps per value)
SLACK = 1 + 1e-6
# elements of a dtype group the SGD update runs over whole (1 MiB of float32 per buffer: cache-sized)
WHOLE = 1 << 18


class _Group:
    """The parameters of one dtype: their flat buffers (parameters, each kind of state and gradients once, two
    chunk-sized scratch buffers) and each tensor's view into each."""

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
        self.params = np.zeros(off, dtype)
        self.state = {k: np.zeros(off, dtype) for k in kinds}
        self.grad = np.zeros(off, dtype)
        self.s1, self.s2 = np.zeros(min(off, CHUNK), dtype), np.zeros(min(off, CHUNK), dtype)
        self.chunks = [(a, min(a + CHUNK, off)) for a in range(0, off, CHUNK)]
        self.limit = float(np.sqrt(np.finfo(dtype).max)) if np.dtype(dtype).kind == "f" else math.inf

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return {n: flat[a:b].reshape(shape) for n, (a, b, shape) in self.slices.items()}

    def norm(self, flat: np.ndarray) -> float:
        """An upper bound of max |x| (the 2-norm), inf when it overflows or any value is not finite."""
        sq = float(np.dot(flat, flat)) if flat.size else 0.0
        return math.sqrt(sq) if math.isfinite(sq) else math.inf


class FusedOptimizer:
    """Owns the parameters and optimizer state of a session as flat buffers; see the module docstring.

    params: parameter name -> (shape, dtype), in the artifact's order; state_roles: state name -> (kind, weight)
    with kind "momentum", "exp_avg", "exp_avg_sq" or "step"; initial: name -> initial value (params and state)."""

    def __init__(
        self,
        config: OptimizerRecord | Mapping[str, Any],
        params: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        state_roles: Mapping[str, tuple[str, str]],
        initial: Mapping[str, np.ndarray],
        *,
        rewrites_gradients: bool = True,
    ):
        """rewrites_gradients: the caller writes every gradient before each update, so the update may use the
        gradient buffers as its scratch (fastpaths "update_whole"); False keeps them as they are."""
        self.config = config if isinstance(config, OptimizerRecord) else optimizer_record(dict(config))
        self.kind = self.config.type
        by_dtype: dict[np.dtype, list[str]] = {}
        for name, (_, dtype) in params.items():
            by_dtype.setdefault(np.dtype(dtype), []).append(name)
        kinds = sorted({k for k, _ in state_roles.values() if k != "step"})
        shapes = {n: tuple(s) for n, (s, _) in params.items()}
        self.groups = [_Group(dt, names, shapes, kinds) for dt, names in by_dtype.items()]
        self.state_name = {(k, w): n for n, (k, w) in state_roles.items()}  # (kind, weight) -> state name
        self.step_name = next((n for n, (k, _) in state_roles.items() if k == "step"), None)
        self.step_value = np.zeros((), np.float32)
        self._views = self._collect()
        self._grads: dict[str, np.ndarray] = {}
        for g in self.groups:
            self._grads.update(g.views(g.grad))
        self.backups = 0  # steps that needed a copy kept (the bound could not show the step usable)
        # fastpaths "update_bound": the norms of the parameters and state are carried from step to step as the
        # bounds the last step proved (see _bounds), not read again from memory; only the gradients' are.
        self._carry = fastpaths.enabled("update_bound")
        self._known: list[dict[str, float] | None] = [None] * len(self.groups)
        self._whole = rewrites_gradients and fastpaths.enabled("update_whole")
        self.load(initial)

    def _collect(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for g in self.groups:
            out.update(g.views(g.params))
            for kind, buf in g.state.items():
                for w, v in g.views(buf).items():
                    name = self.state_name.get((kind, w))
                    if name is not None:
                        out[name] = v
        return out

    # ---- what the session sees -----------------------------------------------------------------------------
    def values(self) -> dict[str, np.ndarray]:
        """Every parameter and state tensor by name: views into the buffers (the step counter as a 0-d array).
        Write into them (np.copyto), never rebind them."""
        out = dict(self._views)
        if self.step_name is not None:
            out[self.step_name] = self.step_value
        return out

    def gradients(self) -> dict[str, np.ndarray]:
        """Parameter -> the view its gradient must be written into (the same views on every call)."""
        return dict(self._grads)

    def load(self, values: Mapping[str, np.ndarray]) -> None:
        """Copies the given parameters and state into the buffers."""
        self._known = [None] * len(self.groups)  # the carried norms no longer bound them
        current = self.values()
        for name, v in values.items():
            if name == self.step_name:
                self.step_value = np.array(v, np.float32).reshape(())
            elif name in current:
                np.copyto(current[name], v)

    # ---- the update ----------------------------------------------------------------------------------------
    def update(self, lr: float) -> list[str]:
        """Updates the parameters and state in place from the gradients; returns [] when every new value is
        usable, else the names that are not, with the parameters and state put back as they were."""
        if self.config.clip_grad_norm is not None:
            self._clip()
        bounds = [self._bounds(k, g, lr) for k, g in enumerate(self.groups)]
        safe = all(b is not None for b in bounds)
        self._known = bounds if safe and self._carry else [None] * len(self.groups)
        kept = None
        if not safe:  # the bound cannot vouch for the step: keep what a refusal puts back
            self.backups += 1
            kept = [(g.params.copy(), {k: b.copy() for k, b in g.state.items()}) for g in self.groups]
        step_next = None
        for g in self.groups:
            if self.kind == "SGD":
                if not (self._whole and self._sgd_whole(g, lr)):
                    for a, b in g.chunks:
                        self._sgd(g, lr, a, b)
            else:
                step_next, consts = self._adam_consts(g, lr)
                for a, b in g.chunks:
                    self._adam(g, consts, a, b)
        if kept is not None:
            bad = [n for g in self.groups for n in self._unusable(g)]
            if bad:
                for g, (params, state) in zip(self.groups, kept):
                    np.copyto(g.params, params)
                    for k, b in state.items():
                        np.copyto(g.state[k], b)
                return bad
        if self.step_name is not None:
            self.step_value = step_next if step_next is not None else self.step_value + np.float32(1)
        return []

    def _bounds(self, k: int, g: _Group, lr: float) -> dict[str, float] | None:
        """Bounds of the 2-norms of the parameters and state this step makes when they show every new value
        surely usable, else None. From the norms the last step carried (fastpaths "update_bound"), and when those
        are too loose to show it, from the buffers themselves."""
        known = self._known[k]
        if known is not None:
            found = self._bounded(g, lr, known)
            if found is not None:
                return found
        now = {"params": g.norm(g.params), **{kind: g.norm(b) for kind, b in g.state.items()}}
        return self._bounded(g, lr, now)

    def _bounded(self, g: _Group, lr: float, norms: Mapping[str, float]) -> dict[str, float] | None:
        """Bounds of max |x| (and of the 2-norm) of every value this step makes, from the 2-norms of the
        parameters and state (norms) and of the gradients, carried through the update's arithmetic (as in _sgd and
        _adam), when all are under MARGIN of the usable limit; else None. Each bound is grown by SLACK for the
        rounding of the update's float arithmetic, so that it still bounds the values the update rounded."""
        c = self.config
        cap = MARGIN * g.limit
        lr = abs(float(lr))
        w, grad = norms["params"], g.norm(g.grad)
        wd = abs(float(c.weight_decay or 0.0))
        if self.kind == "SGD":
            d = grad + wd * w
            new = {}
            if c.momentum:
                m = abs(float(c.momentum))
                damp = max(1.0, abs(1.0 - float(c.dampening or 0.0)))  # v' = d on a first step
                v = m * norms["momentum"] + damp * d
                d = d + m * v if c.nesterov else v
                if not v < cap:
                    return None
                new["momentum"] = v * SLACK
            new["params"] = (w + lr * d) * SLACK
            return new if new["params"] < cap else None
        b1, b2 = (float(b) for b in c.betas)
        eps = float(c.eps)
        d = grad + (0.0 if self.kind == "AdamW" else wd * w)
        m = b1 * norms["exp_avg"] + (1 - b1) * d
        v = b2 * norms["exp_avg_sq"] + (1 - b2) * d * d
        t = float(self.step_value) + 1
        bc1 = 1 - b1**t
        if not (m < cap and v < cap and eps > 0 and bc1 > 0):
            return None
        step = lr / bc1 * m / eps  # m' / (sqrt(v' / bc2) + eps) <= m' / eps
        new_w = (w * (1 + lr * wd) + step) * SLACK
        return {"params": new_w, "exp_avg": m * SLACK, "exp_avg_sq": v * SLACK} if new_w < cap else None

    def _unusable(self, g: _Group) -> list[str]:
        # One BLAS dot product per buffer: x.x is not finite when any value is NaN or infinite, or when a value is
        # so large (|x| > sqrt(max)) that products of such values overflow: the same bound the session's checks
        # use, found in a fraction of their time. Only then are the tensors looked at one by one, to name them.
        bad = []
        together = np.isfinite(np.dot(g.params, g.params))
        if not together:
            views = g.views(g.params)
            bad += [n for n, v in views.items() if not usable(v)]
        for kind, buf in g.state.items():
            # SGD's new parameters are w - lr * (an expression of the new momentum): a momentum that is not
            # finite makes them not finite (lr 0 too: 0 * inf is NaN), so checking them has checked it
            if self.kind == "SGD" and not bad:
                continue
            if not np.isfinite(np.dot(buf, buf)):
                views = g.views(buf)
                bad += [self.state_name.get((kind, w), w) for w, v in views.items() if not usable(v)]
        if not bad and not together:
            bad.append("the parameters together (their squared norm overflows)")
        return bad

    def _clip(self) -> None:
        # as edgetrain.derive.optimizers._clip_by_global_norm: each gradient's ReduceSumSquare (the same kernel), their
        # Sum, Sqrt, coef = min(max_norm / (total + 1e-6), 1), every gradient times coef
        max_norm = float(self.config.clip_grad_norm)
        grads = [v for g in self.groups for v in g.views(g.grad).values()]
        sq = KERNELS["ReduceSumSquare"].fn
        squares = [sq(v, keepdims=0) for v in grads]
        total = squares[0] if len(squares) == 1 else KERNELS["Sum"].fn(*squares)
        total = np.sqrt(total)
        t = total.dtype.type
        coef = np.minimum(np.divide(t(max_norm), np.add(total, t(1e-6))), t(1.0))
        for g in self.groups:
            np.multiply(g.grad, coef, out=g.grad)

    def _sgd(self, g: _Group, lr: float, a: int, b: int) -> None:
        # as edgetrain.derive.optimizers.SGD.make: d = g + w * wd; v' = v * m + d * (1 - damp) (v' = d on the first
        # step when damp != 0); d = d + v' * m (Nesterov) or v'; w' = w - d * lr. Elements [a, b) in place.
        c = self.config
        t = g.dtype.type
        w, d = g.params[a:b], g.grad[a:b]
        s1, s2 = g.s1[: b - a], g.s2[: b - a]
        if c.weight_decay:
            np.multiply(w, t(c.weight_decay), out=s1)
            np.add(d, s1, out=s1)
            d = s1
        if c.momentum:
            v = g.state["momentum"][a:b]
            np.multiply(v, t(c.momentum), out=v)
            if c.dampening:
                first = float(self.step_value) == 0.0
                np.multiply(d, t(1.0 - c.dampening), out=s2)
                np.add(v, s2, out=v)
                if first:
                    np.copyto(v, d)
            else:
                np.add(v, d, out=v)
            if c.nesterov:
                np.multiply(v, t(c.momentum), out=s2)
                np.add(d, s2, out=s1)
                d = s1
            else:
                d = v
        np.multiply(d, t(np.float32(lr)), out=s2)
        np.subtract(w, s2, out=w)

    def _sgd_whole(self, g: _Group, lr: float) -> bool:
        # _sgd's arithmetic, in its order, over whole buffers (fastpaths "update_whole"): a small model pays per
        # call more than per byte, and plain SGD is then two calls per dtype, w - (g * lr), the product written
        # over the gradient. Only where the buffers stay cache-sized (WHOLE) and without dampening (whose first
        # step keeps d beside v'); w * wd and Nesterov's v' * m still go through the chunk-sized scratch.
        c = self.config
        if g.size > WHOLE or c.dampening:
            return False
        t = g.dtype.type
        w, d = g.params, g.grad
        if c.weight_decay:
            wd = t(c.weight_decay)
            for a, b in g.chunks:  # d = g + w * wd, over the gradient
                s = g.s1[: b - a]
                np.multiply(w[a:b], wd, out=s)
                np.add(d[a:b], s, out=d[a:b])
        if c.momentum:
            m = t(c.momentum)
            v = g.state["momentum"]
            np.multiply(v, m, out=v)
            np.add(v, d, out=v)
            if c.nesterov:
                for a, b in g.chunks:  # d = d + v' * m, over the gradient
                    s = g.s1[: b - a]
                    np.multiply(v[a:b], m, out=s)
                    np.add(d[a:b], s, out=d[a:b])
            else:
                d = v
        np.multiply(d, t(np.float32(lr)), out=g.grad)
        np.subtract(w, g.grad, out=w)
        return True

    def _adam_consts(self, g: _Group, lr: float) -> tuple[np.ndarray, tuple]:
        # the step's scalars, once per update: t = step + 1, 1 - b1^t, 1 - b2^t (Pow, as the graph's), lr
        c = self.config
        t = g.dtype.type
        b1, b2 = (float(x) for x in c.betas)
        step_next = np.add(self.step_value, np.float32(1))
        ts = np.asarray(step_next).astype(g.dtype)
        pow_ = KERNELS["Pow"].fn
        one = np.asarray(t(1.0))
        bc1 = np.subtract(one, pow_(np.asarray(t(b1)), ts))
        bc2 = np.subtract(one, pow_(np.asarray(t(b2)), ts))
        lr_t = t(np.float32(lr))
        decay = None
        if c.weight_decay and self.kind == "AdamW":
            decay = np.subtract(one, np.multiply(lr_t, t(c.weight_decay)))
        return step_next, (t(b1), t(1 - b1), t(b2), t(1 - b2), bc2, t(c.eps), np.divide(lr_t, bc1), decay)

    def _adam(self, g: _Group, consts: tuple, a: int, b: int) -> None:
        # as edgetrain.derive.optimizers.Adam.make: m' = m b1 + d (1 - b1); v' = v b2 + d d (1 - b2); t = step + 1;
        # w' = w (1 - lr wd, AdamW) - (lr / (1 - b1^t)) * (m' / (sqrt(v' / (1 - b2^t)) + eps)). [a, b) in place.
        c = self.config
        b1, one_b1, b2, one_b2, bc2, eps, lr_bc1, decay = consts
        w, d = g.params[a:b], g.grad[a:b]
        s1, s2 = g.s1[: b - a], g.s2[: b - a]
        if c.weight_decay and decay is None:
            np.multiply(w, g.dtype.type(c.weight_decay), out=s1)
            np.add(d, s1, out=s1)
            d = s1
        m, v = g.state["exp_avg"][a:b], g.state["exp_avg_sq"][a:b]
        np.multiply(m, b1, out=m)
        np.multiply(d, one_b1, out=s2)
        np.add(m, s2, out=m)
        np.multiply(d, d, out=s2)
        np.multiply(s2, one_b2, out=s2)
        np.multiply(v, b2, out=v)
        np.add(v, s2, out=v)
        np.divide(v, bc2, out=s2)
        np.sqrt(s2, out=s2)
        np.add(s2, eps, out=s2)
        np.divide(m, s2, out=s2)
        np.multiply(lr_bc1, s2, out=s2)
        if decay is not None:
            np.multiply(w, decay, out=w)
        np.subtract(w, s2, out=w)


def usable(a: np.ndarray) -> bool:
    """Whether a parameter is finite and no larger than sqrt(the dtype's largest value): beyond that, the product
    of two such values overflows, so the next forward pass could not be finite (an update of lr 1e30 gets there
    in one step, with a finite loss)."""
    cap = float(np.sqrt(np.finfo(a.dtype).max)) if a.dtype.kind == "f" else np.inf
    return a.size == 0 or bool(-cap <= float(a.min()) and float(a.max()) <= cap)


def finite(a: np.ndarray) -> bool:
    """Whether every element is finite, in one pass and no temporary the size of `a`: a float64 sum of float32
    values cannot overflow, and NaN or infinity anywhere makes it non-finite."""
    return bool(np.isfinite(np.sum(a, dtype=np.float64)))
