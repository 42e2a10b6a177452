"""Elementwise kernels (broadcast inputs -> one output): arithmetic, unary math, logic, Where, Clip, Identity."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgetrain.core.errors import ExecutionError, ShapeError, UnsupportedError

from ._util import _arr, _is_text, _unary
from .cast import NUMPY_TO_ONNX as NUMPY_TO_ONNX  # re-exported: the dtype tables' former home
from .cast import ONNX_TO_NUMPY as ONNX_TO_NUMPY  # re-exported
from .registry import kernel

# ----------------------------------------------------------------------------------------------------------
# helpers


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


# ----------------------------------------------------------------------------------------------------------
# binary arithmetic


@kernel("Add", inplace=True)
def add(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Add", np.add, a, b, out)


@kernel("Sub", inplace=True)
def sub(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Sub", np.subtract, a, b, out)


@kernel("Mul", inplace=True)
def mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Mul", np.multiply, a, b, out)


def _no_zero_divisor(op: str, b: np.ndarray) -> None:
    if not b.all():
        raise ExecutionError(f"{op}: integer division by zero (the divisor B has a zero element)")


@kernel("Div", inplace=(0,))
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


@kernel("Mod", inplace=True)
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


@kernel("Sum", inplace=(0, 1))
def sum_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Sum", np.add, (x, *xs), out)


@kernel("Max", inplace=(0, 1))
def max_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Max", np.maximum, (x, *xs), out)  # NaN propagates, as onnxruntime


@kernel("Min", inplace=(0, 1))
def min_(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return _variadic("Min", np.minimum, (x, *xs), out)


@kernel("Mean", inplace=(0, 1))
def mean(x: np.ndarray, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    r = _variadic("Mean", np.add, (x, *xs), out)
    if xs:
        np.true_divide(r, len(xs) + 1, out=r)  # a Python int keeps float16/32 (no promotion)
    return r


# ----------------------------------------------------------------------------------------------------------
# unary math


@kernel("Neg", inplace=True)
def neg(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.negative, x, out)


@kernel("Abs", inplace=True)
def abs_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.absolute, x, out)


@kernel("Exp", inplace=True)
def exp(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _unary(np.exp, x, out)


@kernel("Log", inplace=True)
def log(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf, log(<0) = nan
        return _unary(np.log, x, out)


@kernel("Sqrt", inplace=True)
def sqrt(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _unary(np.sqrt, x, out)


@kernel("Reciprocal", inplace=True)
def reciprocal(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return _unary(np.reciprocal, x, out)


@kernel("Floor", inplace=True)
def floor(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.floor, x, out)


@kernel("Ceil", inplace=True)
def ceil(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.ceil, x, out)


@kernel("Round", inplace=True)
def round_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.rint, x, out)  # halves to even


@kernel("Sign", inplace=True)
def sign(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.sign, x, out)


@kernel("Sin", inplace=True)
def sin(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # sin(inf) = nan
        return _unary(np.sin, x, out)


@kernel("Cos", inplace=True)
def cos(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return _unary(np.cos, x, out)


@kernel("Tan", inplace=True)
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


@kernel("Identity", view="reshape")
def identity(x: np.ndarray) -> np.ndarray:
    return x  # no copy: the input itself


# ----------------------------------------------------------------------------------------------------------
# Clip


def _bound(x: np.ndarray, b: np.ndarray | None, name: str) -> np.ndarray | None:
    if b is None:
        return None
    if b.size != 1:
        raise ShapeError(f"Clip: input '{name}' must be a scalar (0-d) tensor, got shape {b.shape}")
    return b.reshape(()).astype(x.dtype, copy=False)


@kernel("Clip", inplace=(0,))
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


@kernel("Not", inplace=True)
def not_(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _unary(np.logical_not, x, out)


@kernel("And", inplace=True)
def and_(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("And", np.logical_and, a, b, out)


@kernel("Or", inplace=True)
def or_(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _binary("Or", np.logical_or, a, b, out)


@kernel("Xor", inplace=True)
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
