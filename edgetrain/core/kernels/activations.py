"""Activation kernels (one input -> same-shape output): Relu family, Sigmoid, Tanh, Gelu and Erf, PRelu."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from ._util import _arr, _unary
from .registry import kernel

# ----------------------------------------------------------------------------------------------------------
# helpers


# Multi-pass kernels run over flat chunks of _CHUNK elements, so that their temporaries are small and stay in
# L2 cache: several times faster than whole-array passes on 1M-element float32 tensors.
_CHUNK = 32768


def _f32(v: float) -> float:
    # ONNX FLOAT attributes are 32-bit: round as onnxruntime does, then keep a Python float (a numpy float64
    # scalar would promote float32 data under NEP 50).
    return float(np.float32(v))


def _chunked(body: Callable, x: np.ndarray, out: np.ndarray | None, *args) -> np.ndarray:
    """out = body(x) for an elementwise body(x_chunk, out_chunk, *args) that works in place on 1-D float32 or
    float64 chunks. float16 runs in float32 (one rounding at the end, as onnxruntime). 0-d inputs are safe."""
    if out is None:
        out = np.empty(x.shape, x.dtype)
    dst = out if out.flags.c_contiguous else np.empty(x.shape, out.dtype)
    xf, of = x.reshape(-1), dst.reshape(-1)  # reshape copies a non-contiguous x once
    n = xf.size
    for i in range(0, n, _CHUNK) if n > _CHUNK else (0,):
        xc, oc = (xf[i : i + _CHUNK], of[i : i + _CHUNK]) if n > _CHUNK else (xf, of)
        if xc.dtype == np.float16:
            t = np.empty(xc.shape, np.float32)
            body(xc.astype(np.float32), t, *args)
            np.copyto(oc, t, casting="unsafe")
        else:
            body(xc, oc, *args)
    if dst is not out:
        np.copyto(out, dst)
    return out


# ----------------------------------------------------------------------------------------------------------
# erf: piecewise approximations fitted (minimax, Lawson) against a 40-digit reference.
#   |x| < cut:  erf(x) = x + x * Q(x^2)                      (x + ... keeps the leading term exact)
#   |x| >= cut: erf(x) = sign(x) * (1 - exp(-x^2) * R(s)),   s = (p|x| + q) / (|x| + K) in [-1, 1], |x| <= top
# Both branches run on the whole array and are blended arithmetically: masks/np.where cost ~10 passes each.
# Measured max error against math.erf: float32 1.2 ulp; float64 3 ulp (relative 5e-16).


class _ErfCoeffs:
    def __init__(self, dt, cut, top, p, q, k, small, large):
        t = np.dtype(dt).type
        self.cut, self.top, self.p, self.q, self.k = t(cut), t(top), t(p), t(q), t(k)
        self.small = [t(c) for c in small]
        self.large = [t(c) for c in large]


_ERF = {
    np.dtype(np.float32): _ErfCoeffs(
        np.float32,
        1.0,
        4.0,
        3.0,
        -6.0,
        2.0,
        [
            0.12837916573230257,
            -0.3761262583947619,
            0.11283585267468357,
            -0.02685381591696887,
            0.005188334183993436,
            -0.000801024461882341,
            7.854015466413366e-05,
        ],
        [
            0.255395678032573,
            -0.14239528472602647,
            0.02685080146764997,
            -0.0029254605885442654,
            4.6023913413852384e-05,
            2.9672660522617193e-05,
        ],
    ),
    np.dtype(np.float64): _ErfCoeffs(
        np.float64,
        0.75,
        6.0,
        2.0476190476190474,
        -4.285714285714286,
        2.0,
        [
            0.12837916709551256,
            -0.3761263890318125,
            0.11283791670788085,
            -0.0268661706063602,
            0.005223977181929323,
            -0.0008548298075831552,
            0.0001205418118928181,
            -1.4897122761831779e-05,
            1.60303268153236e-06,
            -1.2655783057989996e-07,
        ],
        [
            0.24581080438402098,
            -0.1986998921800608,
            0.05382333879889685,
            -0.008545561137841579,
            0.00023459022574962552,
            0.00017016628823442827,
            -1.1850193501687689e-05,
            -5.477062840649674e-06,
            2.1477748578728079e-07,
            2.3296994232164933e-07,
            1.563737180036657e-08,
            -6.7965741744462645e-09,
            -1.256019018566281e-09,
        ],
    ),
}


def _horner(t: np.ndarray, coeffs: list) -> np.ndarray:
    r = t * coeffs[-1]
    r += coeffs[-2]
    for c in coeffs[-3::-1]:
        r *= t
        r += c
    return r


def _erf_body(x: np.ndarray, out: np.ndarray) -> None:
    c = _ERF[x.dtype]
    # Blend weights: w = sign(x) in the large region, else 0; the small region gets 1 - |w|. Each branch is
    # exactly 0 outside its region, so the sum loses nothing; NaN gets w = 0, stays NaN via the small branch.
    w = np.greater_equal(x, c.cut, out=np.empty_like(x))
    w -= np.less_equal(x, -c.cut, out=np.empty_like(x))
    xs = np.clip(x, -c.cut, c.cut)
    xs *= 1 - np.abs(w)
    small = _horner(xs * xs, c.small)
    small *= xs
    small += xs
    a = np.abs(x)
    np.minimum(a, c.top, out=a)  # below cut, R is evaluated off its range but stays finite: weight 0
    s = a * c.p
    s += c.q
    d = a + c.k
    s /= d
    large = _horner(s, c.large)
    np.multiply(a, a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    large *= a
    np.subtract(1, large, out=large)
    large *= w
    np.add(small, large, out=out)


@kernel("Erf")
def erf(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    if x.dtype.kind != "f":
        raise UnsupportedError(
            f"Erf: input of dtype {x.dtype} is not supported; use float16, float32 or float64"
        )
    return _chunked(_erf_body, x, out)


# ----------------------------------------------------------------------------------------------------------
# activations


@kernel("Relu", inplace=True)
def relu(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _arr(np.maximum(x, 0, out=out))


def _relu_grad_shape(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    dy, y = infos[0], infos[1]
    return [TensorInfo(dy.dtype, tuple(np.broadcast_shapes(dy.shape, y.shape)))]


@kernel("ReluGrad", domain=PRIVATE_DOMAIN, inplace=(0,), shape=_relu_grad_shape)
def relu_grad(dy: np.ndarray, y: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """dy * [y > 0], the gradient of Relu from its output, in one call (the step graph spells it Greater, Cast,
    Mul: the same products, dy times 1.0 or 0.0)."""
    return _arr(np.multiply(dy, np.greater(y, 0), out=out))


# Lean specializations (the interpreter's fastpaths "lean_kernels"; see kernels/math.py): the same numpy calls
# without the wrappers; ReluGrad's mask goes into scratch the program keeps (a fresh mask of a large activation
# is a fresh mapping of memory, page faults included, on every step) when it is small enough to keep.
_MASK_SCRATCH = 1 << 20  # bytes of bool mask a program keeps for its ReluGrads, shared by them all


def _relu_lean(node: Node, infos, consts, out, shared):
    x = infos[0]
    if x.dtype.kind != "f" or not x.shape:
        return None
    maximum = np.maximum
    return lambda x: maximum(x, 0, out=out)


def _relu_grad_lean(node: Node, infos, consts, out, shared):
    dy, y = infos
    if dy.dtype.kind != "f" or y.dtype.kind != "f" or dy.shape != y.shape or not dy.shape:
        return None
    size = math.prod(y.shape)
    mask = None
    if size <= _MASK_SCRATCH:
        flat = shared.get("relu_grad_mask")
        if flat is None or flat.size < size:
            flat = shared["relu_grad_mask"] = np.empty(max(size, 0 if flat is None else flat.size), bool)
        mask = flat[:size].reshape(y.shape)
    greater, multiply = np.greater, np.multiply
    return lambda dy, y: multiply(dy, greater(y, 0, out=mask), out=out)


relu.lean = _relu_lean
relu_grad.lean = _relu_grad_lean


def _leaky_relu_body(x, out, alpha):
    np.multiply(x, alpha, out=out)
    # max(x, alpha*x) is leaky relu for alpha <= 1 (any sign), min(x, alpha*x) for alpha > 1.
    (np.maximum if alpha <= 1 else np.minimum)(x, out, out=out)


@kernel("LeakyRelu")
def leaky_relu(x: np.ndarray, *, alpha: float = 0.01, out: np.ndarray | None = None) -> np.ndarray:
    return _chunked(_leaky_relu_body, x, out, _f32(alpha))


def _sigmoid_body(x, out):
    # exp(min(x, 0)) / (1 + exp(-|x|)): no overflow anywhere, full relative accuracy in both tails.
    den = np.abs(x)
    np.negative(den, out=den)
    np.exp(den, out=den)
    den += 1
    np.minimum(x, 0, out=out)
    np.exp(out, out=out)
    out /= den


@kernel("Sigmoid")
def sigmoid(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _chunked(_sigmoid_body, x, out)


@kernel("Tanh", inplace=True)
def tanh(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.tanh, x, out)


def _hard_sigmoid_body(x, out, alpha, beta):
    np.multiply(x, alpha, out=out)
    out += beta
    np.minimum(out, 1, out=out)
    np.maximum(out, 0, out=out)


@kernel("HardSigmoid")
def hard_sigmoid(
    x: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5, out: np.ndarray | None = None
) -> np.ndarray:
    return _chunked(_hard_sigmoid_body, x, out, _f32(alpha), _f32(beta))


_ONE_SIXTH = _f32(1 / 6)  # the spec's alpha of HardSigmoid inside HardSwish, a float attribute


def _hard_swish_body(x, out):
    _hard_sigmoid_body(x, out, _ONE_SIXTH, 0.5)
    out *= x


@kernel("HardSwish")
def hard_swish(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf * 0 = nan, as the spec's formula says
        return _chunked(_hard_swish_body, x, out)


def _elu_body(x, out, alpha, gamma=1.0):
    # max(x, 0) + alpha * expm1(min(x, 0)): no overflow, and no masks (np.where costs ~10 arithmetic passes).
    np.minimum(x, 0, out=out)
    np.expm1(out, out=out)
    out *= alpha
    out += np.maximum(x, 0)
    if gamma != 1.0:
        out *= gamma


@kernel("Elu")
def elu(x: np.ndarray, *, alpha: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    return _chunked(_elu_body, x, out, _f32(alpha))


@kernel("Selu")
def selu(
    x: np.ndarray,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
    out: np.ndarray | None = None,
) -> np.ndarray:
    return _chunked(_elu_body, x, out, _f32(alpha), _f32(gamma))


def _celu_body(x, out, alpha):
    # The spec's max(0, x) + min(0, alpha * expm1(x / alpha)); for alpha > 0, min(x, 0) / alpha gives the
    # same values without overflowing exp.
    np.true_divide(np.minimum(x, 0) if alpha > 0 else x, alpha, out=out)
    np.expm1(out, out=out)
    out *= alpha
    np.minimum(out, 0, out=out)
    out += np.maximum(x, 0)


@kernel("Celu")
def celu(x: np.ndarray, *, alpha: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    alpha = _f32(alpha)
    if alpha == 0:
        raise UnsupportedError(
            "Celu: attribute alpha=0.0 is not supported (the formula divides by alpha); use a nonzero alpha"
        )
    with np.errstate(over="ignore"):  # only for alpha < 0, where the spec's value itself is -inf
        return _chunked(_celu_body, x, out, alpha)


def _softplus_body(x, out):
    # max(x, 0) + log1p(exp(-|x|)): exact in both tails (softplus(-100) = 3.7e-44), never overflows.
    t = np.abs(x)
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.log1p(t, out=t)
    np.maximum(x, 0, out=out)
    out += t


@kernel("Softplus")
def softplus(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _chunked(_softplus_body, x, out)


def _softsign_body(x, out):
    np.abs(x, out=out)
    out += 1
    np.true_divide(x, out, out=out)


@kernel("Softsign")
def softsign(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # inf / inf = nan, as the spec's formula says
        return _chunked(_softsign_body, x, out)


def _thresholded_relu_body(x, out, alpha):
    keep = np.greater(x, alpha)
    if np.isfinite(x).all():
        np.multiply(x, keep, out=out)
        out += 0.0  # -0.0 (a negative x times False) reads +0.0, as onnxruntime
    else:  # nan * 0 and -inf * 0 would read nan: the slow masked copy only for such inputs
        out.fill(0)
        np.copyto(out, x, where=keep)


@kernel("Shrink")
def shrink(x: np.ndarray, *, bias: float = 0.0, lambd: float = 0.5) -> np.ndarray:
    """y = x - bias where x > lambd, x + bias where x < -lambd, else 0, in x's dtype. The attributes are float32
    (ONNX FLOAT). float16 and integers are computed in float32 and cast back (integers toward zero), as onnxruntime
    does; float64 in float64, as the spec says (onnxruntime rounds it through float32)."""
    work = x if x.dtype == np.float64 else x.astype(np.float32)
    b, lam = work.dtype.type(_f32(bias)), work.dtype.type(_f32(lambd))
    y = np.where(work < -lam, work + b, np.where(work > lam, work - b, work.dtype.type(0)))
    return y.astype(x.dtype, copy=False)


@kernel("ThresholdedRelu")
def thresholded_relu(x: np.ndarray, *, alpha: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    return _chunked(_thresholded_relu_body, x, out, _f32(alpha))


def _mish_body(x, out):
    _softplus_body(x, out)
    np.tanh(out, out=out)
    out *= x


@kernel("Mish")
def mish(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf * 0 = nan, as the spec's formula says
        return _chunked(_mish_body, x, out)


_SQRT1_2 = 1 / math.sqrt(2)
_GELU_C1 = math.sqrt(2 / math.pi)
_GELU_C3 = _GELU_C1 * 0.044715


def _gelu_erf_body(x, out):
    _erf_body(x * x.dtype.type(_SQRT1_2), out)
    out += 1
    out *= x
    out *= 0.5


def _gelu_tanh_body(x, out):
    np.multiply(x, x, out=out)
    out *= _GELU_C3
    out += _GELU_C1
    out *= x
    np.tanh(out, out=out)
    out += 1
    out *= x
    out *= 0.5


@kernel("Gelu")
def gelu(x: np.ndarray, *, approximate: str = "none", out: np.ndarray | None = None) -> np.ndarray:
    # -inf * 0 = nan, as the spec's formula says; x**3 overflows only where tanh saturates anyway.
    if approximate == "none":
        with np.errstate(invalid="ignore"):
            return _chunked(_gelu_erf_body, x, out)
    if approximate == "tanh":
        with np.errstate(invalid="ignore", over="ignore"):
            return _chunked(_gelu_tanh_body, x, out)
    raise UnsupportedError(
        f"Gelu: attribute approximate={approximate!r} is not supported; use 'none' or 'tanh'"
    )


@kernel("PRelu")
def prelu(x: np.ndarray, slope: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """slope * x where x < 0, else x; slope broadcasts unidirectionally to x."""
    if out is None:
        out = np.empty(x.shape, x.dtype)
    # max(x, 0) + slope * min(x, 0): no masks (np.where/copyto(where=) are ~10x slower than arithmetic).
    np.minimum(x, 0, out=out)
    try:
        np.multiply(out, slope, out=out)
    except ValueError:
        raise ShapeError(
            f"PRelu: slope of shape {slope.shape} does not broadcast unidirectionally to X of "
            f"shape {x.shape} (slope's trailing dimensions must equal X's or be 1)"
        ) from None
    out += np.maximum(x, 0)
    return out
