"""Elementwise kernels (broadcast inputs -> one output): arithmetic, math, activations, logic, Where, Cast."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

from ...errors import ExecutionError, ShapeError, UnsupportedError
from .registry import kernel

# ONNX TensorProto.DataType <-> numpy, for the types numpy has (STRING is an object array of str).
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}
NUMPY_TO_ONNX: dict[np.dtype, int] = {dt: code for code, dt in ONNX_TO_NUMPY.items()}
_ONNX_TYPE_NAMES = {
    0: "UNDEFINED",
    1: "FLOAT",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "STRING",
    9: "BOOL",
    10: "FLOAT16",
    11: "DOUBLE",
    12: "UINT32",
    13: "UINT64",
    14: "COMPLEX64",
    15: "COMPLEX128",
    16: "BFLOAT16",
    17: "FLOAT8E4M3FN",
    18: "FLOAT8E4M3FNUZ",
    19: "FLOAT8E5M2",
    20: "FLOAT8E5M2FNUZ",
    21: "UINT4",
    22: "INT4",
    23: "FLOAT4E2M1",
    24: "FLOAT8E8M0",
    25: "UINT2",
    26: "INT2",
    27: "FLOAT6E2M3",
    28: "FLOAT6E3M2",
}
_SUPPORTED_TYPES = ", ".join(_ONNX_TYPE_NAMES[c] for c in sorted(ONNX_TO_NUMPY))
_ROUND_MODES = ("up", "down", "nearest")


# ----------------------------------------------------------------------------------------------------------
# helpers


def _arr(r) -> np.ndarray:
    # ufuncs return numpy scalars for 0-d operands; kernels always return arrays.
    return r if type(r) is np.ndarray else np.asarray(r)


def _check_broadcast(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        shown = " and ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(
            f"{op}: input shapes {shown} do not broadcast together (numpy-style broadcasting: "
            "trailing dimensions must be equal or 1)"
        ) from None


def _binary(op: str, f: Callable, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    # Broadcasting is checked only when numpy fails, so the common path costs nothing extra.
    try:
        return _arr(f(a, b, out=out))
    except ValueError:
        _check_broadcast(op, a.shape, b.shape)
        raise


def _unary(f: Callable, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return _arr(f(x, out=out))


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
# binary arithmetic


@kernel("Add")
def add(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Add", np.add, a, b, out)


@kernel("Sub")
def sub(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Sub", np.subtract, a, b, out)


@kernel("Mul")
def mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Mul", np.multiply, a, b, out)


def _no_zero_divisor(op: str, b: np.ndarray) -> None:
    if not b.all():
        raise ExecutionError(f"{op}: integer division by zero (the divisor B has a zero element)")


@kernel("Div")
def div(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    if a.dtype.kind == "f":
        with np.errstate(divide="ignore", invalid="ignore"):
            return _binary("Div", np.true_divide, a, b, out)
    _no_zero_divisor("Div", b)
    if a.dtype.kind == "u":
        return _binary("Div", np.floor_divide, a, b, out)
    # C semantics (truncation toward zero): a - fmod(a, b) is an exact multiple of b, so // is exact.
    r = _binary("Div", np.fmod, a, b, None)
    q = _arr(np.subtract(a, r, out=out))
    return np.floor_divide(q, b, out=q)


@kernel("Mod")
def mod(a: np.ndarray, b: np.ndarray, *, fmod: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    if fmod not in (0, 1):
        raise UnsupportedError(
            f"Mod: attribute fmod={fmod!r} is not supported; use 0 (sign of the divisor) "
            "or 1 (C fmod, sign of the dividend)"
        )
    # np.remainder follows the spec's fmod=0 rules (incl. floats: -0, inf, nan cases); np.fmod is C fmod.
    f = np.fmod if fmod else np.remainder
    if a.dtype.kind in "iu":
        _no_zero_divisor("Mod", b)
        return _binary("Mod", f, a, b, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _binary("Mod", f, a, b, out)


def _empty_broadcast(op: str, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.empty(_check_broadcast(op, a.shape, b.shape), dtype)


def _pow_half(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    # numpy turns x ** 0.5 (scalar exponent) into sqrt, which differs from C's pow at -0 and -inf.
    with np.errstate(invalid="ignore"):
        r = _arr(np.sqrt(x, out=out))
    r += 0.0  # pow(-0, 0.5) = +0
    if r.size and np.fmin.reduce(x, axis=None) == -np.inf:
        r[np.isneginf(x)] = np.inf  # pow(-inf, 0.5) = +inf
    return r


@kernel("Pow")
def pow_(x: np.ndarray, y: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """x ** y with the output dtype of x whatever the exponent's dtype (computed in the wider of the two)."""
    if x.dtype.kind == "f":
        if y.size == 1 and y.ndim <= x.ndim and y.dtype.kind in "fiu" and float(y.reshape(-1)[0]) == 0.5:
            return _pow_half(x, out)
        if y.dtype.kind != "f" or y.dtype.itemsize <= x.dtype.itemsize:
            y = y.astype(x.dtype, copy=False)
        elif out is None:  # wider float exponent: numpy computes in it, then casts into x's dtype
            out = _empty_broadcast("Pow", x, y, x.dtype)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _binary("Pow", np.power, x, y, out)
    if y.dtype.kind in "iu" and (y.dtype.kind == "u" or y.min(initial=0) >= 0):
        # exact integer power in x's type, wrapping on overflow (exponents beyond x's range overflow anyway)
        return _binary("Pow", np.power, x, y.astype(x.dtype, copy=False), out)
    # Integer base with negative or float exponents: C's (T)pow(double, double), truncating toward zero.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = _binary("Pow", np.power, x.astype(np.float64), y.astype(np.float64), None)
        if out is None:
            return r.astype(x.dtype)
        np.copyto(out, r, casting="unsafe")
    return out


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


# ----------------------------------------------------------------------------------------------------------
# variadic


def _variadic(op: str, f: Callable, xs: tuple[np.ndarray, ...], out: np.ndarray | None) -> np.ndarray:
    if len(xs) == 1:
        if out is None:
            return xs[0].copy()
        np.copyto(out, xs[0])
        return out
    if out is None:
        if len(xs) == 2:
            return _binary(op, f, xs[0], xs[1], None)
        try:
            shape = np.broadcast(*xs).shape  # ~5x cheaper than np.broadcast_shapes
        except ValueError:
            _check_broadcast(op, *(x.shape for x in xs))
            raise
        out = np.empty(shape, xs[0].dtype)
    f(xs[0], xs[1], out=out)
    for x in xs[2:]:
        f(out, x, out=out)
    return out


@kernel("Sum")
def sum_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Sum", np.add, (x, *xs), out)


@kernel("Max")
def max_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Max", np.maximum, (x, *xs), out)  # NaN propagates, as onnxruntime


@kernel("Min")
def min_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Min", np.minimum, (x, *xs), out)


@kernel("Mean")
def mean(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    r = _variadic("Mean", np.add, (x, *xs), out)
    if xs:
        np.true_divide(r, len(xs) + 1, out=r)  # a Python int keeps float16/32 (no promotion)
    return r


# ----------------------------------------------------------------------------------------------------------
# unary math


@kernel("Neg")
def neg(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.negative, x, out)


@kernel("Abs")
def abs_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.absolute, x, out)


@kernel("Exp")
def exp(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _unary(np.exp, x, out)


@kernel("Log")
def log(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf, log(<0) = nan
        return _unary(np.log, x, out)


@kernel("Sqrt")
def sqrt(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _unary(np.sqrt, x, out)


@kernel("Reciprocal")
def reciprocal(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return _unary(np.reciprocal, x, out)


@kernel("Floor")
def floor(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.floor, x, out)


@kernel("Ceil")
def ceil(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.ceil, x, out)


@kernel("Round")
def round_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.rint, x, out)  # halves to even


@kernel("Sign")
def sign(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.sign, x, out)


@kernel("Sin")
def sin(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # sin(inf) = nan
        return _unary(np.sin, x, out)


@kernel("Cos")
def cos(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _unary(np.cos, x, out)


@kernel("Tan")
def tan(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _unary(np.tan, x, out)


@kernel("IsNaN")
def isnan(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.isnan, x, out)


@kernel("IsInf")
def isinf(
    x: np.ndarray, *, detect_negative: int = 1, detect_positive: int = 1, out: np.ndarray | None = None
) -> np.ndarray:
    if detect_negative and detect_positive:
        return _unary(np.isinf, x, out)
    if detect_positive:
        return _arr(np.isposinf(x, out=out))
    if detect_negative:
        return _arr(np.isneginf(x, out=out))
    if out is None:
        return np.zeros(x.shape, np.bool_)
    out.fill(False)
    return out


@kernel("Identity")
def identity(x: np.ndarray) -> np.ndarray:
    return x  # no copy: the input itself


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


@kernel("Relu")
def relu(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _arr(np.maximum(x, 0, out=out))


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


@kernel("Tanh")
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


# ----------------------------------------------------------------------------------------------------------
# Clip


def _bound(x: np.ndarray, b: np.ndarray | None, name: str) -> np.ndarray | None:
    if b is None:
        return None
    if b.size != 1:
        raise ShapeError(f"Clip: input '{name}' must be a scalar (0-d) tensor, got shape {b.shape}")
    return b.reshape(()).astype(x.dtype, copy=False)


@kernel("Clip")
def clip(
    x: np.ndarray,
    min: np.ndarray | None = None,
    max: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """min(max(x, min), max): when min > max everything becomes max, as the spec says; NaN stays NaN."""
    lo, hi = _bound(x, min, "min"), _bound(x, max, "max")
    if lo is None and hi is None:
        if out is None:
            return x.copy()
        np.copyto(out, x)
        return out
    if hi is None:
        return _arr(np.maximum(x, lo, out=out))
    if lo is None:
        return _arr(np.minimum(x, hi, out=out))
    if x.size < 4096:  # np.clip's Python wrapper costs more than a second pass over a small tensor
        r = _arr(np.maximum(x, lo, out=out))
        return np.minimum(r, hi, out=r)
    if out is None:
        return np.clip(x, lo, hi)
    np.clip(x, lo, hi, out=out)  # np.clip does not return a 0-d out itself
    return out


# ----------------------------------------------------------------------------------------------------------
# comparison and logic


def _is_text(a: np.ndarray) -> bool:
    return a.dtype.kind in "OUS"


@kernel("Equal")
def equal(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    if _is_text(a) or _is_text(b):
        _check_broadcast("Equal", a.shape, b.shape)
        r = np.asarray(a == b, dtype=np.bool_)  # numpy 1.x has no np.equal loop for str arrays
        if out is None:
            return r
        np.copyto(out, r)
        return out
    return _binary("Equal", np.equal, a, b, out)


@kernel("Greater")
def greater(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Greater", np.greater, a, b, out)


@kernel("Less")
def less(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Less", np.less, a, b, out)


@kernel("GreaterOrEqual")
def greater_or_equal(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("GreaterOrEqual", np.greater_equal, a, b, out)


@kernel("LessOrEqual")
def less_or_equal(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("LessOrEqual", np.less_equal, a, b, out)


@kernel("Not")
def not_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.logical_not, x, out)


@kernel("And")
def and_(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("And", np.logical_and, a, b, out)


@kernel("Or")
def or_(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Or", np.logical_or, a, b, out)


@kernel("Xor")
def xor(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Xor", np.logical_xor, a, b, out)


@kernel("Where")
def where(
    condition: np.ndarray, x: np.ndarray, y: np.ndarray, *, out: np.ndarray | None = None
) -> np.ndarray:
    try:
        if out is None:
            return _arr(np.where(condition, x, y))
        np.copyto(out, y)
        np.copyto(out, x, where=condition)
    except ValueError:
        _check_broadcast("Where", condition.shape, x.shape, y.shape)
        raise
    return out


# ----------------------------------------------------------------------------------------------------------
# Cast


def _target_dtype(to: int) -> np.dtype:
    dt = ONNX_TO_NUMPY.get(to)
    if dt is None:
        name = _ONNX_TYPE_NAMES.get(to, "an unknown type")
        raise UnsupportedError(
            f"Cast: attribute to={to} ({name}) is not supported; supported target types: {_SUPPORTED_TYPES}"
        )
    return dt


def _format_number(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "NaN"
        if v in (math.inf, -math.inf):
            return "INF" if v > 0 else "-INF"
        return f"{v:.8g}"  # onnxruntime's format for float16/float/double alike
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _to_text(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "S":
        items = [s.decode() for s in x.ravel().tolist()]
    elif _is_text(x):
        items = [str(s) for s in x.ravel().tolist()]
    else:
        items = [_format_number(v) for v in x.ravel().tolist()]
    r = np.empty(len(items), dtype=object)
    r[:] = items
    return r.reshape(x.shape)


# Prefixes the C library's strtod / strtoll accept (onnxruntime parses "100.5" as int 100, "1.5f" as 1.5).
_FLOAT_PREFIX = re.compile(r"\s*[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)", re.IGNORECASE)
_INT_PREFIX = re.compile(r"\s*[+-]?\d+")


def _parse(s, pattern: re.Pattern, kind: str):
    if isinstance(s, bytes):
        s = s.decode()
    s = str(s)
    if kind == "f":
        try:
            return float(s)
        except ValueError:
            pass
    m = pattern.match(s)
    if m is None:
        what = "a number" if kind == "f" else "an integer"
        raise UnsupportedError(
            f"Cast: cannot parse the string {s!r} as {what}; supported: decimal or "
            "scientific notation, INF, -INF, NaN (integer and bool targets read a leading "
            "integer)"
        )
    return float(m.group()) if kind == "f" else int(m.group())


def _from_text(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    items = x.ravel().tolist()
    if dt.kind == "f":
        r = np.array([_parse(s, _FLOAT_PREFIX, "f") for s in items], dtype=np.float64).astype(dt)
    elif dt.kind == "b":
        r = np.array([_parse(s, _INT_PREFIX, "i") != 0 for s in items], dtype=np.bool_)
    else:  # out-of-range integers wrap, like every other cast to a fixed-point type
        mask = (1 << (8 * dt.itemsize)) - 1
        r = np.array([_parse(s, _INT_PREFIX, "i") & mask for s in items], dtype=f"u{dt.itemsize}").astype(dt)
    return r.reshape(x.shape)


def _cast(x: np.ndarray, dt: np.dtype, round_mode: str, out: np.ndarray | None, op: str) -> np.ndarray:
    if round_mode not in _ROUND_MODES:
        raise UnsupportedError(
            f"{op}: attribute round_mode={round_mode!r} is not supported; use one of "
            f"{', '.join(_ROUND_MODES)}"
        )
    if dt.kind == "O":
        r = _to_text(x)
    elif _is_text(x):
        r = _from_text(x, dt)
    else:
        # float -> int is C truncation; nan/inf/out of range are undefined in the spec: no warnings for them.
        with np.errstate(invalid="ignore", over="ignore"):
            if out is None:
                return x.astype(dt)
            np.copyto(out, x, casting="unsafe")
            return out
    if out is None:
        return r
    out[...] = r
    return out


@kernel("Cast")
def cast(
    x: np.ndarray, *, to: int, saturate: int = 1, round_mode: str = "up", out: np.ndarray | None = None
) -> np.ndarray:
    """Cast to the ONNX type `to`; saturate and round_mode only concern float8 types, which numpy lacks."""
    return _cast(x, _target_dtype(to), round_mode, out, "Cast")


@kernel("CastLike")
def cast_like(
    x: np.ndarray,
    target_type: np.ndarray,
    *,
    saturate: int = 1,
    round_mode: str = "up",
    out: np.ndarray | None = None,
) -> np.ndarray:
    dt = np.dtype(object) if _is_text(target_type) else target_type.dtype
    if dt not in NUMPY_TO_ONNX:
        raise UnsupportedError(
            f"CastLike: target_type of dtype {dt} is not supported; supported: {_SUPPORTED_TYPES}"
        )
    return _cast(x, dt, round_mode, out, "CastLike")
