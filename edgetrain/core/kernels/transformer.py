"""Kernels of edgetrain's fused transformer ops (numpy only), the training step's fast paths that
edgetrain.graph.fuse writes: GELU keeping its CDF for the backward (GeluTraining, GeluGrad), LayerNorm's backward in
a few calls (LayerNormGrad), and softmax attention with its backward (SoftmaxAttention, SoftmaxAttentionGrad). Each
has an ONNX function body in standard ops (edgetrain.derive.autodiff.rules.transformer)."""

from __future__ import annotations

import math

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ir import Node, TensorInfo

# the Erf kernel's coefficients and chunk size: GeluTraining's Y is then the Gelu kernel's, bit for bit
from .activations import _CHUNK, _ERF, _horner
from .registry import PRIVATE_DOMAIN, kernel

_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _float_work(op: str, x: np.ndarray) -> np.ndarray:
    """x as float32/float64 (float16 computes in float32, as the standard kernels do)."""
    if x.dtype.kind != "f":
        raise UnsupportedError(f"{op}: input of dtype {x.dtype} is not supported; use float16, 32 or 64")
    return x if x.dtype.itemsize >= 4 else x.astype(np.float32)


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


# ---------------------------------------------------------------------------------------------------- GELU
def _erf_split(x: np.ndarray, out: np.ndarray) -> None:
    """erf(x) into out, bit for bit the Erf kernel's (activations._erf_body), in a third of its time: that kernel
    evaluates both of its branches on every element and blends them, so its exp runs everywhere; here the small
    branch runs on every element (overflowing harmlessly where |x| >= cut) and the large one, exp included, only
    on the elements at or beyond cut (about 1 in 6 of a GELU's inputs), whose results then replace the small
    branch's. Each element goes through the same operations as there; NaN stays in the small branch's NaN."""
    c = _ERF[x.dtype]
    with np.errstate(over="ignore", invalid="ignore"):
        small = _horner(x * x, c.small)
        small *= x
        np.add(small, x, out=out)
    a = np.abs(x)
    big = np.flatnonzero(a >= c.cut)
    if not big.size:
        return
    ab = np.minimum(a[big], c.top)
    s = ab * c.p
    s += c.q
    s /= ab + c.k
    large = _horner(s, c.large)
    np.multiply(ab, ab, out=ab)
    np.negative(ab, out=ab)
    np.exp(ab, out=ab)
    large *= ab
    np.subtract(1, large, out=large)
    large *= np.sign(x[big])  # the blend weight there: +-1
    out[big] = large


def _same_as_x(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    return [TensorInfo(infos[0].dtype, tuple(infos[0].shape))] * len(node.outputs)


@kernel("GeluTraining", domain=PRIVATE_DOMAIN, shape=_same_as_x)
def gelu_training(x: np.ndarray, *, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Y, CDF): Y = Gelu(x) (approximate='none') and CDF = Phi(x) = (1 + erf(x / sqrt 2)) / 2, which the backward
    reads instead of computing erf again. Y is the Gelu kernel's to the bit: it computes ((erf + 1) * x) * 0.5,
    this ((erf + 1) * 0.5) * x, and a product by 0.5 is exact."""
    w = _float_work("GeluTraining", x)
    xf = _flat(w)
    cdf = np.empty_like(xf)
    into_out = out is not None and out.dtype == w.dtype and out.flags.c_contiguous
    y = out.reshape(-1) if into_out else np.empty_like(xf)
    half, c = w.dtype.type(0.5), w.dtype.type(_SQRT1_2)
    with np.errstate(invalid="ignore"):  # -inf * 0 = nan, as the spec's formula says
        for i in range(0, xf.size, _CHUNK):  # chunks stay in cache through the ~30 passes of erf
            xc, cc = xf[i : i + _CHUNK], cdf[i : i + _CHUNK]
            _erf_split(xc * c, cc)
            cc += 1
            cc *= half
            np.multiply(cc, xc, out=y[i : i + _CHUNK])
    cdf = cdf.reshape(x.shape).astype(x.dtype, copy=False)
    if into_out:
        return out, cdf
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    if out is not None:
        np.copyto(out, y)
        y = out
    return y, cdf


def _gelu_grad_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy, y = infos[0], infos[1]
    return [TensorInfo(dy.dtype, tuple(np.broadcast_shapes(dy.shape, y.shape)))]


@kernel("GeluGrad", domain=PRIVATE_DOMAIN, inplace=(0,), shape=_gelu_grad_shape)
def gelu_grad(dy: np.ndarray, y: np.ndarray, cdf: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """dX = dY * (CDF + x * exp(-x^2 / 2) / sqrt(2 pi)), Gelu's slope Phi(x) + x phi(x), from the forward's Y and
    CDF: x = Y / CDF (within 2 float32 ulps; 0 where CDF is 0, below x = -13, where the slope is 0 to float32), so
    the step keeps Y (which the next layer's weight gradient keeps anyway) and CDF instead of X and Y: no more
    memory than the plain path's."""
    if not dy.shape == y.shape == cdf.shape:
        raise ShapeError(f"GeluGrad: dY {dy.shape}, Y {y.shape} and CDF {cdf.shape} must have one shape")
    w = _float_work("GeluGrad", y)
    yf, cf, df = _flat(w), _flat(cdf.astype(w.dtype, copy=False)), _flat(dy.astype(w.dtype, copy=False))
    into_out = out is not None and out.dtype == w.dtype and out.flags.c_contiguous
    dx = out.reshape(-1) if into_out else np.empty_like(yf)
    x, t = (np.empty(min(_CHUNK, yf.size), w.dtype) for _ in range(2))
    mh, k = w.dtype.type(-0.5), w.dtype.type(_INV_SQRT_2PI)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for i in range(0, yf.size, _CHUNK):
            cc = cf[i : i + _CHUNK]
            xc, tc = x[: cc.size], t[: cc.size]
            np.equal(cc, 0, out=tc, casting="unsafe")  # 1 where CDF is 0: Y is 0 there, so x = 0 / 1
            tc += cc
            np.divide(yf[i : i + _CHUNK], tc, out=xc)
            np.multiply(xc, xc, out=tc)
            tc *= mh
            np.exp(tc, out=tc)
            tc *= xc
            tc *= k
            tc += cc
            np.multiply(tc, df[i : i + _CHUNK], out=dx[i : i + _CHUNK])
    if into_out:
        return out
    return dx.reshape(y.shape).astype(dy.dtype, copy=False)


# ----------------------------------------------------------------------------------------------- LayerNorm
def _layer_norm_grad_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    x = infos[1]
    ax = int(node.attrs.get("axis", -1)) % len(x.shape)
    inner = TensorInfo(x.dtype, tuple(x.shape[ax:]))
    return [TensorInfo(x.dtype, tuple(x.shape)), inner, inner][: len(node.outputs)]


@kernel("LayerNormGrad", domain=PRIVATE_DOMAIN, shape=_layer_norm_grad_shape)
def layer_norm_grad(
    dy: np.ndarray,
    x: np.ndarray,
    scale: np.ndarray,
    mean: np.ndarray,
    inv_std: np.ndarray,
    *,
    axis: int = -1,
    noutputs: int,
    out: np.ndarray | None = None,
):
    """(dX, dScale, dB) of y = (x - mean) * inv_std * scale + B over the axes from `axis` on, with the forward's
    Mean and InvStdDev: xhat = (x - mean) * inv_std, g = dy * scale,
    dX = inv_std * (g - mean(g) - xhat * mean(g * xhat)) per row; dScale = sum(dy * xhat), dB = sum(dy) over the
    rows (with the inner shape; the autodiff sums them down to Scale's and B's shapes)."""
    if x.dtype not in (np.float32, np.float64) or dy.dtype != x.dtype or dy.shape != x.shape:
        raise UnsupportedError(
            f"LayerNormGrad: X {x.dtype}{list(x.shape)} and dY {dy.dtype}{list(dy.shape)} must be float32 or "
            "float64 alike, of one shape"
        )
    ax = axis % x.ndim
    inner = x.shape[ax:]
    rows, n = math.prod(x.shape[:ax]), math.prod(inner)
    x2, dy2 = x.reshape(rows, n), dy.reshape(rows, n)
    m, s = (
        mean.reshape(rows, 1).astype(x.dtype, copy=False),
        inv_std.reshape(rows, 1).astype(x.dtype, copy=False),
    )
    xhat = np.subtract(x2, m)
    xhat *= s
    g = np.multiply(dy2, np.broadcast_to(scale, inner).reshape(1, n).astype(x.dtype, copy=False))
    inv_n = x.dtype.type(1 / n) if n else x.dtype.type(0)
    a = np.add.reduce(g, axis=1, keepdims=True)
    a *= inv_n
    b = np.einsum("ij,ij->i", g, xhat)[:, None]  # row sums of g * xhat without the product's temporary
    b *= inv_n
    into_out = out is not None and out.dtype == x.dtype and out.flags.c_contiguous
    dx = out.reshape(rows, n) if into_out else np.empty((rows, n), x.dtype)
    np.multiply(xhat, b, out=dx)
    np.subtract(g, dx, out=dx)
    dx -= a
    dx *= s
    results = [out if into_out else dx.reshape(x.shape)]
    if out is not None and not into_out:
        np.copyto(out, results[0], casting="unsafe")
        results[0] = out
    if noutputs > 1:
        np.multiply(dy2, xhat, out=g)  # g is dead: the products for dScale go there
        results.append(np.add.reduce(g, axis=0).reshape(inner))
    if noutputs > 2:
        results.append(np.add.reduce(dy2, axis=0).reshape(inner))
    return tuple(results) if noutputs > 1 else results[0]


# ----------------------------------------------------------------------------------------------- attention
def _batch(*infos: TensorInfo) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*(tuple(i.shape[:-2]) for i in infos)))


def _attention_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    q, kt, v = infos[:3]
    scores = _batch(q, kt, v) + (q.shape[-2], kt.shape[-1])
    mask = infos[3] if len(infos) > 3 else None
    if mask is not None:
        scores = tuple(np.broadcast_shapes(scores, tuple(mask.shape)))
    y = scores[:-1] + (v.shape[-1],)
    return [TensorInfo(q.dtype, y), TensorInfo(q.dtype, scores)][: len(node.outputs)]


def _check_attention(op: str, q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or kt.ndim < 2 or v.ndim < 2 or q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        raise ShapeError(
            f"{op}: Q {list(q.shape)}, K^T {list(kt.shape)} and V {list(v.shape)} do not fit softmax(Q K^T) V "
            "(Q [..., n, d], K^T [..., d, m], V [..., m, dv])"
        )
    if not q.dtype == kt.dtype == v.dtype or q.dtype.kind != "f" or q.dtype.itemsize < 4:
        raise UnsupportedError(f"{op}: Q, K^T and V must be float32 or float64 alike, got {q.dtype}")


@kernel("SoftmaxAttention", domain=PRIVATE_DOMAIN, shape=_attention_shape)
def attention(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scale: float = 1.0,
    noutputs: int,
    out: np.ndarray | None = None,
):
    """(Y, P): P = softmax(Q K^T * scale + mask) over the last axis, Y = P V; P is kept for the backward. The same
    numpy calls as the plain MatMul, Mul, Add, Softmax and MatMul kernels, in their order."""
    _check_attention("SoftmaxAttention", q, kt, v)
    s = np.matmul(q, kt)
    if scale != 1.0:
        s *= s.dtype.type(scale)
    if mask is not None:
        s = np.add(s, mask) if np.broadcast_shapes(s.shape, mask.shape) != s.shape else np.add(s, mask, out=s)
    s -= np.max(s, axis=-1, keepdims=True)
    np.exp(s, out=s)
    # the Softmax kernel's row sums (einsum's), so that P is its result to the bit
    s /= np.einsum("ij->i", s.reshape(-1, s.shape[-1])).reshape(s.shape[:-1] + (1,))
    y = np.matmul(s, v, out=out if out is not None and out.shape == s.shape[:-1] + v.shape[-1:] else None)
    if out is not None and y is not out:
        np.copyto(out, y)
        y = out
    return (y, s) if noutputs > 1 else y


def _attention_grad_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy, q, kt, v, p = infos[:5]
    b = tuple(p.shape[:-2])
    n, d, m, dv = q.shape[-2], q.shape[-1], kt.shape[-1], v.shape[-1]
    shapes = [b + (n, d), b + (d, m), b + (m, dv), tuple(p.shape)]
    return [TensorInfo(q.dtype, s) for s in shapes][: len(node.outputs)]


def _t(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(-1, -2)


@kernel("SoftmaxAttentionGrad", domain=PRIVATE_DOMAIN, shape=_attention_grad_shape)
def attention_grad(
    dy: np.ndarray,
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    p: np.ndarray,
    *,
    scale: float = 1.0,
    noutputs: int,
):
    """(dQ, dK^T, dV, dZ) of Y = softmax(Z) V, Z = Q K^T * scale + mask, from the forward's P = softmax(Z):
    dP = dY V^T, dZ = P * (dP - sum(dP * P)) (the mask's gradient), dS = dZ * scale, dQ = dS K, dK^T = Q^T dS,
    dV = P^T dY; with the batch axes of P (the autodiff sums them down to each input's)."""
    _check_attention("SoftmaxAttentionGrad", q, kt, v)
    dz = np.matmul(dy, _t(v))
    dz -= np.einsum("...ij,...ij->...i", dz, p)[..., None]  # row sums of dP * P without its temporary
    dz *= p
    if scale == 1.0:
        ds = dz
    elif noutputs > 3:  # dZ is an output (a mask that trains): dS gets its own memory
        ds = dz * dz.dtype.type(scale)
    else:
        ds = dz
        ds *= dz.dtype.type(scale)
    results = [np.matmul(ds, _t(kt)), np.matmul(_t(q), ds), np.matmul(_t(p), dy), dz]
    return tuple(results[:noutputs]) if noutputs > 1 else results[0]
