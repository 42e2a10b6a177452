"""Quantized products (integer tensors -> exact integer sums, then int32, float or requantized results, as
onnxruntime computes them; see quantized.py): the dynamic MatMulInteger and ConvInteger, the QOperator QLinearConv
and QLinearMatMul, and the com.microsoft QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import ShapeError
from edgetrain.core.ops import MICROSOFT_DOMAIN as MS

from . import conv
from .quantized import (
    F32,
    QTYPES,
    _along,
    _centered,
    _int32,
    _qtype,
    _requantize,
    _scalar,
    _zero_point,
    dynamic_params,
    quantize,
)
from .registry import kernel

# -------------------------------------------------------------------------------- dynamic


def _row_zp(a_shape: tuple[int, ...]):
    """A per-row zero point of a matrix product's A (1-D of M) as a column."""
    return lambda z: z.reshape(-1, 1) if z.ndim == 1 and z.size > 1 and len(a_shape) >= 2 else z


def _int_matmul(op: str, a, b, a_zp, b_zp) -> np.ndarray:
    """(a - a_zp) @ (b - b_zp), exact, as float64."""
    _qtype(op, "A", a.dtype, QTYPES[:2])
    _qtype(op, "B", b.dtype, QTYPES[:2])
    x = _centered(op, "A", a, a_zp, _row_zp(a.shape))
    w = _centered(op, "B", b, b_zp)
    try:
        return np.asarray(np.matmul(x, w))
    except ValueError as e:
        raise ShapeError(
            f"{op}: A {list(a.shape)} and B {list(b.shape)} cannot be multiplied ({e})"
        ) from None


@kernel("MatMulInteger")
def matmul_integer(
    A: np.ndarray,
    B: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    return _int32(_int_matmul("MatMulInteger", A, B, a_zero_point, b_zero_point))


def _int_conv(op: str, x, w, x_zp, w_zp, attrs) -> np.ndarray:
    """conv(x - x_zp, w - w_zp), exact, as float64 (padding holds x_zp: zero once it is taken off)."""
    _qtype(op, "x", x.dtype, QTYPES[:2])
    _qtype(op, "w", w.dtype, QTYPES[:2])
    xc = _centered(op, "x", x, _scalar(op, "x's zero point", x_zp))
    per_m = lambda z: z.reshape((-1,) + (1,) * (w.ndim - 1)) if z.ndim == 1 and z.size > 1 else z.reshape(())  # noqa: E731
    wc = _centered(op, "w", w, w_zp, per_m)
    return conv.conv(xc, wc, **attrs)


@kernel("ConvInteger")
def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    attrs = dict(
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return _int32(_int_conv("ConvInteger", x, w, x_zero_point, w_zero_point, attrs))


# -------------------------------------------------------------------------------- QOperator


def _out_scale(op: str, a_scale, b_scale, y_scale, alpha: float = 1.0) -> np.ndarray:
    """onnxruntime's output scale, (alpha * a * b) / y in float32, per output channel when b's is."""
    s = F32(alpha) * np.asarray(a_scale, F32) * np.asarray(b_scale, F32)
    return s if y_scale is None else s / np.asarray(_scalar(op, "y_scale", y_scale), F32)


@kernel("QLinearConv")
def qlinear_conv(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> np.ndarray:
    op = "QLinearConv"
    attrs = dict(
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    acc = _int_conv(op, x, w, x_zero_point, w_zero_point, attrs)
    m, nd = w.shape[0], acc.ndim - 2
    if B is not None:
        _qtype(op, "B", B.dtype, (np.dtype(np.int32),))
        acc += B.astype(np.float64).reshape((m,) + (1,) * nd)
    dtype = _qtype(op, "y_zero_point", y_zero_point.dtype, QTYPES[:2])
    ws = _along(op, "w_scale", w_scale, (m,), 0).reshape((-1,) + (1,) * nd if np.size(w_scale) > 1 else ())
    scale = _out_scale(op, _scalar(op, "x_scale", x_scale), ws, y_scale)
    return _requantize(
        acc, scale, _zero_point(op, "y_zero_point", _scalar(op, "y_zp", y_zero_point), dtype), dtype
    )


def _col_scale(op: str, what: str, s: np.ndarray, n: int) -> np.ndarray:
    return _along(op, what, s, (n,), 0)


@kernel("QLinearMatMul")
def qlinear_matmul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
) -> np.ndarray:
    op = "QLinearMatMul"
    acc = _int_matmul(op, a, b, _scalar(op, "a_zero_point", a_zero_point), b_zero_point)
    dtype = _qtype(op, "y_zero_point", y_zero_point.dtype, QTYPES[:2])
    scale = _out_scale(
        op, _scalar(op, "a_scale", a_scale), _col_scale(op, "b_scale", b_scale, b.shape[-1]), y_scale
    )
    return _requantize(
        acc, scale, _zero_point(op, "y_zero_point", _scalar(op, "y_zp", y_zero_point), dtype), dtype
    )


# -------------------------------------------------------------------------------- com.microsoft


@kernel("QGemm", domain=MS)
def qgemm(
    A: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    B: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    C: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    op = "QGemm"
    if A.ndim != 2 or B.ndim != 2:
        raise ShapeError(f"{op}: A {list(A.shape)} and B {list(B.shape)} must be matrices")
    a, b = (A.T if transA else A), (B.T if transB else B)
    acc = _int_matmul(op, a, b, _scalar(op, "a_zero_point", a_zero_point), b_zero_point)
    if C is not None:
        _qtype(op, "C", C.dtype, (np.dtype(np.int32),))
        acc += C.astype(np.float64)
    scale = _out_scale(
        op, _scalar(op, "a_scale", a_scale), _col_scale(op, "b_scale", b_scale, b.shape[1]), y_scale, alpha
    )
    if y_scale is None:  # float output
        return _int32(acc).astype(F32) * scale
    dtype = _qtype(
        op, "y_zero_point", np.dtype(y_zero_point.dtype) if y_zero_point is not None else np.uint8, QTYPES[:2]
    )
    zp = _zero_point(op, "y_zero_point", _scalar(op, "y_zp", y_zero_point), dtype)
    return _requantize(acc, scale, zp, dtype)


@kernel("MatMulIntegerToFloat", domain=MS)
def matmul_integer_to_float(
    A: np.ndarray,
    B: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    op = "MatMulIntegerToFloat"
    acc = _int32(_int_matmul(op, A, B, a_zero_point, b_zero_point)).astype(F32)
    y = acc * (np.asarray(_scalar(op, "a_scale", a_scale), F32) * np.asarray(b_scale, F32))
    return y if bias is None else y + bias.astype(F32)


@kernel("DynamicQuantizeMatMul", domain=MS)
def dynamic_quantize_matmul(
    A: np.ndarray,
    B: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    scale, zp = dynamic_params(A)
    a = quantize(A, scale, np.asarray(zp, np.int32), np.dtype(np.uint8))
    return matmul_integer_to_float(a, B, np.asarray(scale), b_scale, np.asarray(zp), b_zero_point, bias)
