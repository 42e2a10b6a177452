"""onnxruntime's com.microsoft quantized ops besides the products (those are in qproducts.py), as onnxruntime's
quantizer writes them: QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu (the last two by a table of the
256 codes), QLinearGlobalAveragePool, QLinearSoftmax, QLinearConcat. Rounding and saturation as in quantized.py."""

from __future__ import annotations

import numpy as np

from edgetrain.core.errors import ModelError, ShapeError, UnsupportedError
from edgetrain.core.ops import MICROSOFT_DOMAIN as MS

from .quantized import F32, QTYPES, _qtype, _saturate, _scalar, _zero_point, quantize
from .registry import kernel


def _binary(op: str, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp, combine) -> np.ndarray:
    dtype = _qtype(op, "A", a.dtype, QTYPES[:2])
    if b.dtype != dtype:
        raise ModelError(f"{op}: A is {dtype.name} and B is {b.dtype.name}; they take one type")
    za = _zero_point(op, "A_zero_point", _scalar(op, "A_zero_point", a_zp), dtype)
    zb = _zero_point(op, "B_zero_point", _scalar(op, "B_zero_point", b_zp), dtype)
    zc = _zero_point(op, "C_zero_point", _scalar(op, "C_zero_point", c_zp), dtype)
    sa, sb, sc = (
        np.asarray(_scalar(op, w, s), F32)
        for w, s in (("A_scale", a_scale), ("B_scale", b_scale), ("C_scale", c_scale))
    )
    xa, xb = (a.astype(np.int32) - za).astype(F32), (b.astype(np.int32) - zb).astype(F32)
    return _saturate(combine(xa, sa, xb, sb, sc), zc, dtype)


@kernel("QLinearAdd", domain=MS)
def qlinear_add(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None) -> np.ndarray:
    return _binary(
        "QLinearAdd",
        A,
        A_scale,
        A_zero_point,
        B,
        B_scale,
        B_zero_point,
        C_scale,
        C_zero_point,
        lambda xa, sa, xb, sb, sc: xa * (sa / sc) + xb * (sb / sc),
    )


@kernel("QLinearMul", domain=MS)
def qlinear_mul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None) -> np.ndarray:
    return _binary(
        "QLinearMul",
        A,
        A_scale,
        A_zero_point,
        B,
        B_scale,
        B_zero_point,
        C_scale,
        C_zero_point,
        lambda xa, sa, xb, sb, sc: xa * xb * (sa * sb / sc),
    )


def _lookup(op: str, x, x_scale, x_zp, y_scale, y_zp, fn) -> np.ndarray:
    """onnxruntime's table ops: each of the 256 codes dequantized, mapped by fn in float32, quantized."""
    dtype = _qtype(op, "X", x.dtype, QTYPES[:2])
    zx = _zero_point(op, "X_zero_point", _scalar(op, "X_zero_point", x_zp), dtype)
    zy = _zero_point(op, "Y_zero_point", _scalar(op, "Y_zero_point", y_zp), dtype)
    codes = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, dtype=np.int32)
    deq = np.asarray(_scalar(op, "X_scale", x_scale), F32) * (codes - zx).astype(F32)
    with np.errstate(over="ignore"):
        table = quantize(fn(deq).astype(F32), _scalar(op, "Y_scale", y_scale), zy, dtype)
    return table[x.astype(np.int32) - int(np.iinfo(dtype).min)]


@kernel("QLinearSigmoid", domain=MS)
def qlinear_sigmoid(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None) -> np.ndarray:
    return _lookup(
        "QLinearSigmoid",
        X,
        X_scale,
        X_zero_point,
        Y_scale,
        Y_zero_point,
        lambda v: F32(1) / (F32(1) + np.exp(-v)),
    )


@kernel("QLinearLeakyRelu", domain=MS)
def qlinear_leaky_relu(
    X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, *, alpha: float = 0.01
) -> np.ndarray:
    a = F32(alpha)
    return _lookup(
        "QLinearLeakyRelu",
        X,
        X_scale,
        X_zero_point,
        Y_scale,
        Y_zero_point,
        lambda v: np.where(v >= 0, v, v * a),
    )


@kernel("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool(
    x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last: int = 0
) -> np.ndarray:
    op = "QLinearGlobalAveragePool"
    dtype = _qtype(op, "X", x.dtype, QTYPES[:2])
    if x.ndim < 3:
        raise ShapeError(f"{op}: its input has rank {x.ndim}; it takes [N, C, spatial...] (rank 3 or more)")
    zx = _zero_point(op, "x_zero_point", _scalar(op, "x_zero_point", x_zero_point), dtype)
    zy = _zero_point(op, "y_zero_point", _scalar(op, "y_zero_point", y_zero_point), dtype)
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    size = int(np.prod([x.shape[k] for k in axes]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(zx) * size
    scale = np.asarray(_scalar(op, "x_scale", x_scale), F32) / (
        np.asarray(_scalar(op, "y_scale", y_scale), F32) * F32(size)
    )
    return _saturate(acc.astype(np.int32).astype(F32) * scale, zy, dtype)


@kernel("QLinearSoftmax", domain=MS)
def qlinear_softmax(
    X, X_scale, x_zero_point, y_scale, y_zero_point, *, axis: int = -1, opset: int = 13
) -> np.ndarray:
    """onnxruntime's own algorithm (not dequantize-softmax-quantize): exp of each code's distance below the row's
    maximum from a float table, sums in float32 in order, floor(1 / y_scale) as the output's scale."""
    op = "QLinearSoftmax"
    dtype = _qtype(op, "X", X.dtype, QTYPES[:2])
    if opset < 13:
        raise UnsupportedError(
            f"{op}: opset={opset} (softmax over the flattened trailing axes) is not supported; use 13"
        )
    if not -X.ndim <= axis < X.ndim:
        raise ShapeError(f"{op}: axis={axis} is out of range for an input of rank {X.ndim}")
    xs = float(np.asarray(_scalar(op, "X_scale", X_scale), F32))
    ys = F32(np.floor(F32(1) / np.asarray(_scalar(op, "y_scale", y_scale), F32)))
    zy = int(_zero_point(op, "y_zero_point", _scalar(op, "y_zero_point", y_zero_point), dtype))
    x = np.moveaxis(X, axis, -1)
    d = x.shape[-1]
    # in double, as onnxruntime: log(FLT_MAX / d) less 5 bits of headroom, so that the float32 sums stay finite
    shift = max(0.0, float(np.log(float(np.finfo(F32).max / F32(d)))) - 5.0) / xs
    table = np.exp((np.arange(256, dtype=np.float64) - 255 + shift) * xs).astype(F32)  # code distance 255 - k
    q = x.astype(np.int32)
    dist = q - q.max(axis=-1, keepdims=True) + 255  # table index, as both of onnxruntime's loops compute it
    e = table[dist]
    total = np.cumsum(e, axis=-1, dtype=F32)[..., -1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.rint((e * ys) / total).astype(np.int64) + zy
    info = np.iinfo(dtype)
    y = np.clip(v, info.min, info.max).astype(dtype)
    return np.moveaxis(y, -1, axis)


@kernel("QLinearConcat", domain=MS)
def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis: int) -> np.ndarray:
    op = "QLinearConcat"
    if len(inputs) % 3 or not inputs:
        raise ModelError(f"{op}: after Y_scale and Y_zero_point it takes (X, X_scale, X_zero_point) triples")
    dtype = _qtype(op, "Y_zero_point", Y_zero_point.dtype, QTYPES[:2])
    zy = _zero_point(op, "Y_zero_point", _scalar(op, "Y_zero_point", Y_zero_point), dtype)
    parts = []
    for k in range(0, len(inputs), 3):
        x, s, z = inputs[k : k + 3]
        same = (
            np.array_equal(np.asarray(s, F32), np.asarray(Y_scale, F32))
            and z is not None
            and int(z) == int(zy)
        )
        parts.append(x if same else _lookup(op, x, s, z, Y_scale, Y_zero_point, lambda v: v))
    try:
        return np.concatenate(parts, axis=axis)
    except ValueError as e:  # numpy's AxisError is one
        raise ShapeError(f"{op}: its inputs cannot be joined on axis {axis} ({e})") from None
