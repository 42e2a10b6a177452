"""Softmax kernels (numpy only): Softmax, LogSoftmax, Hardmax, and edgetrain's fused SoftmaxCrossEntropy and
SoftmaxCrossEntropyGrad (domain com.edgetrain) with their lean specializations (see math.py)."""

from __future__ import annotations

import numpy as np

from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from .math import _axis, _blas_info, _store, _work_dtype
from .reductions import _sum
from .registry import kernel


def _shifted(op: str, x: np.ndarray, axis: int, out: np.ndarray | None) -> tuple[np.ndarray, int]:
    """x - max(x, axis) in the work dtype (into out when it has that dtype), and the axis normalised."""
    ax = _axis(op, axis, x.ndim)
    w = _work_dtype(x.dtype)
    xw = x if x.dtype == w else x.astype(w)
    m = np.max(xw, axis=ax, keepdims=True) if x.size else 0
    return np.subtract(xw, m, out=out if out is not None and out.dtype == w else None), ax


@kernel("Softmax")
def softmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    y, ax = _shifted("Softmax", x, axis, out)
    np.exp(y, out=y)
    y /= _sum(y, (ax,), True)
    return _store(y, x.dtype, out)


@kernel("LogSoftmax")
def log_softmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    y, ax = _shifted("LogSoftmax", x, axis, out)
    y -= np.log(_sum(np.exp(y), (ax,), True))
    return _store(y, x.dtype, out)


def _ce_weights(target: np.ndarray, c: int, dtype, label_smoothing: float, ignore_index) -> tuple:
    """(the smoothed one-hot target rows [n, c], the kept rows as 0/1 or None) of a cross-entropy."""
    n = target.shape[0]
    keep = None if ignore_index is None else (target != ignore_index)
    idx = target if keep is None else np.where(keep, target, 0)
    w = np.zeros((n, c), dtype)
    w[np.arange(n), idx] = 1
    if label_smoothing:
        w *= dtype.type(1.0 - label_smoothing)
        w += dtype.type(label_smoothing / c)
    return w, None if keep is None else keep.astype(dtype)


def _plain_ce(x: np.ndarray, label_smoothing: float, ignore_index) -> bool:
    """No smoothing, no ignored rows, float32/64 logits, rows at all: the case the short paths below take."""
    return (
        not label_smoothing
        and ignore_index is None
        and x.dtype.kind == "f"
        and x.dtype.itemsize >= 4
        and len(x) > 0
    )


def _shifted_rows(x: np.ndarray) -> np.ndarray:
    """x [n, c] minus each row's maximum (keepdims=True would cost more than the whole subtraction)."""
    return x - np.maximum.reduce(x, axis=1)[:, None]


def _softmax_cross_entropy_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    x = infos[0]
    reduced = node.attrs.get("reduction", "mean") in ("mean", "sum")
    return [TensorInfo(x.dtype, () if reduced else tuple(x.shape[:1]))]


@kernel("SoftmaxCrossEntropy", domain=PRIVATE_DOMAIN, shape=_softmax_cross_entropy_shape)
def softmax_cross_entropy(
    x: np.ndarray,
    target: np.ndarray,
    *,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
) -> np.ndarray:
    """The cross-entropy of logits x [n, c] against class labels [n] as CrossEntropyLoss builds it in standard ops
    (log-softmax, smoothed one-hot, the rows an ignore_index leaves out), in a few numpy calls."""
    if _plain_ce(x, label_smoothing, ignore_index):
        # the plain case in eight calls: log-sum-exp of the shifted rows minus each row's picked logit
        y = _shifted_rows(x)
        lse = np.log(np.add.reduce(np.exp(y), axis=1))
        nll = lse - y[np.arange(len(y)), target]
        total = np.add.reduce(nll)
        return np.asarray(total / x.dtype.type(len(nll)) if reduction == "mean" else total, x.dtype)
    logp = log_softmax(x, axis=1)
    w, keep = _ce_weights(target, x.shape[1], logp.dtype, label_smoothing, ignore_index)
    nll = -np.einsum("nc,nc->n", w, logp)
    if keep is None:
        total = nll.sum(dtype=nll.dtype)
        return np.asarray(total / nll.dtype.type(len(nll)) if reduction == "mean" else total, x.dtype)
    total = np.dot(nll, keep)
    return np.asarray(total / keep.sum(dtype=keep.dtype) if reduction == "mean" else total, x.dtype)


@kernel("SoftmaxCrossEntropyGrad", domain=PRIVATE_DOMAIN, shape=lambda node, infos: [infos[0]])
def softmax_cross_entropy_grad(
    x: np.ndarray,
    target: np.ndarray,
    dloss: np.ndarray,
    *,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """d loss / d x = dloss * (softmax(x) - smoothed one-hot) / (rows counted), left-out rows 0."""
    if _plain_ce(x, label_smoothing, ignore_index):
        p = np.exp(_shifted_rows(x), out=out)
        n = len(p)
        scale = np.asarray(dloss, p.dtype) / (p.dtype.type(n) if reduction == "mean" else p.dtype.type(1))
        np.multiply(p, np.divide(scale, np.add.reduce(p, axis=1))[:, None], out=p)
        p[np.arange(n), target] -= scale
        return p
    p = np.exp(log_softmax(x, axis=1))
    w, keep = _ce_weights(target, x.shape[1], p.dtype, label_smoothing, ignore_index)
    np.subtract(p, w, out=p)
    count = len(p) if keep is None else keep.sum(dtype=p.dtype)
    scale = np.asarray(dloss, p.dtype) / (p.dtype.type(count) if reduction == "mean" else p.dtype.type(1))
    if keep is not None:
        p *= keep[:, None]
    return _store(np.multiply(p, scale, out=p), x.dtype, out)


@kernel("Hardmax")
def hardmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    ax = _axis("Hardmax", axis, x.ndim)
    y = np.zeros_like(x) if out is None else out
    if out is not None:
        y.fill(0)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=ax), ax), 1, axis=ax)
    return y


# -------------------------------------------------------------------------------- lean specializations (see math.py)
# elements: scratch a specialization keeps per program stays this small (256 KiB of float32)
_LEAN_SCRATCH = 1 << 16


class _CrossEntropyRows:
    """What SoftmaxCrossEntropy's specialization leaves for its gradient's, in one program: exp(x - row max) and
    its row sums, which the plain gradient kernel computes again from the same logits with the same calls. The
    loss node runs before its gradient node in every run of the step (the gradient reads the loss's seed), so
    the gradient always finds them of this run."""

    def __init__(self, n: int, c: int, dtype: np.dtype):
        self.e = np.empty((n, c), dtype)
        self.s = np.empty(n, dtype)
        self.rows = np.arange(n)
        self.n = dtype.type(n)


def _ce_lean_ok(node: Node, infos) -> bool:
    x, t = infos[0], infos[1]
    at = node.attrs
    plain = not at.get("label_smoothing", 0.0) and at.get("ignore_index") is None
    return (
        plain
        and at.get("reduction", "mean") in ("mean", "sum")
        and _blas_info(x)
        and x.shape[0] > 0
        and len(t.shape) == 1
        and x.shape[0] * x.shape[1] <= _LEAN_SCRATCH
    )


def _softmax_cross_entropy_lean(node: Node, infos, consts, out, shared):
    if not _ce_lean_ok(node, infos):
        return None
    x = infos[0]
    rows = shared[("SoftmaxCrossEntropy", node.inputs[0], node.inputs[1])] = _CrossEntropyRows(
        *x.shape, x.dtype
    )
    e, s, ar, n = rows.e, rows.s, rows.rows, rows.n
    mean = node.attrs.get("reduction", "mean") == "mean"
    maxr, sub, exp, addr, log, asarray, dt = (
        np.maximum.reduce,
        np.subtract,
        np.exp,
        np.add.reduce,
        np.log,
        np.asarray,
        x.dtype,
    )

    def softmax_cross_entropy_lean(x, target):
        # softmax_cross_entropy's plain case; x[i, t] - max_i is the very subtraction that gives y[i, t] there
        m = maxr(x, axis=1)
        sub(x, m[:, None], out=e)
        exp(e, out=e)
        nll = log(addr(e, axis=1, out=s)) - (x[ar, target] - m)
        total = addr(nll)
        return asarray(total / n if mean else total, dt)

    return softmax_cross_entropy_lean


def _softmax_cross_entropy_grad_lean(node: Node, infos, consts, out, shared):
    rows = shared.get(("SoftmaxCrossEntropy", node.inputs[0], node.inputs[1]))
    if rows is None or not _ce_lean_ok(node, infos) or out is None or out.dtype != infos[0].dtype:
        return None
    e, s, ar = rows.e, rows.s, rows.rows
    count = rows.n if node.attrs.get("reduction", "mean") == "mean" else infos[0].dtype.type(1)
    mul, div, asarray, dt = np.multiply, np.divide, np.asarray, infos[0].dtype
    seed = consts[2]  # the loss's seed is a constant of the step: its scale is computed once
    fixed = None if seed is None else asarray(seed, dt) / count

    def softmax_cross_entropy_grad_lean(x, target, dloss):
        # softmax_cross_entropy_grad's plain case on the loss's exp and row sums
        scale = asarray(dloss, dt) / count if fixed is None else fixed
        mul(e, div(scale, s)[:, None], out=out)
        out[ar, target] -= scale
        return out

    return softmax_cross_entropy_grad_lean


softmax_cross_entropy.lean = _softmax_cross_entropy_lean
softmax_cross_entropy_grad.lean = _softmax_cross_entropy_grad_lean
