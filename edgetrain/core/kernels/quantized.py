"""Quantized kernels (integer tensors with float scales and zero points -> arrays), as onnxruntime computes them:
QDQ (QuantizeLinear, DequantizeLinear), dynamic (DynamicQuantizeLinear, MatMulInteger, ConvInteger), QOperator
(QLinearConv, QLinearMatMul) and the com.microsoft ops onnxruntime's quantizer writes (QGemm, QLinearAdd, ...).

Rounding is half to even (np.rint), results saturate to the integer type's range. Integer products are exact: the
operands (at most 16 bits after their zero points are taken off) are multiplied and summed in float64, whose 53
bits hold every partial sum of an int8 product of any practical length, through BLAS, then wrap to int32 as
onnxruntime's int32 accumulators do. Requantizing follows onnxruntime's MLAS: float32(int32 sum) * float32
scale, clamped to the output range less its zero point, rounded, plus the zero point.

This module holds the helpers every quantized kernel uses, the QDQ pair, fake quantization (QAT) and
DynamicQuantizeLinear; the integer products are in qproducts.py, onnxruntime's other com.microsoft ops in
qcontrib.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import ModelError, UnsupportedError
from edgetrain.core.ops import PRIVATE_DOMAIN

from .registry import kernel

F32 = np.float32
# the integer element types of quantized tensors (int32 only as DequantizeLinear's input, bias-like)
QTYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
# ONNX TensorProto element types an output_dtype attribute may name
_ONNX_DTYPES = {
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    1: np.float32,
    10: np.float16,
}
_WHAT = "int8, uint8, int16 or uint16"


def _qtype(op: str, what: str, dtype: np.dtype, allowed: Sequence[np.dtype] = QTYPES) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in allowed:
        names = ", ".join(np.dtype(t).name for t in allowed)
        raise UnsupportedError(f"{op}: {what} is {dtype.name}; edgetrain runs quantized tensors of {names}")
    return dtype


def _zero_point(op: str, what: str, zp: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """The zero point as int32 (0 when omitted); ModelError when its type is not the quantized tensor's."""
    if zp is None:
        return np.zeros((), np.int32)
    if zp.dtype != dtype:
        raise ModelError(
            f"{op}: {what} is {zp.dtype.name}, but the tensor it belongs to is {np.dtype(dtype).name}; a zero "
            "point has its tensor's integer type"
        )
    return zp.astype(np.int32)


def _along(
    op: str, what: str, p: np.ndarray, shape: tuple[int, ...], axis: int | None, block_size: int = 0
) -> np.ndarray:
    """A scale or zero point shaped to broadcast against a tensor of `shape`: per tensor (one value), per channel
    (1-D along axis) or per block (block_size > 0: the tensor's shape with axis cut into blocks)."""
    p = np.asarray(p)
    if p.size == 1 and not block_size:
        return p.reshape(())
    rank = len(shape)
    if axis is None:
        raise ModelError(f"{op}: {what} has {p.size} values; this input takes one (a per-tensor scale)")
    if not -rank <= axis < rank:
        raise ModelError(f"{op}: axis={axis} is out of range for an input of rank {rank}")
    ax = axis % rank
    if block_size:
        blocks = -(-shape[ax] // block_size)
        want = shape[:ax] + (blocks,) + shape[ax + 1 :]
        if p.shape != want:
            raise ModelError(
                f"{op}: {what} has shape {list(p.shape)}; with block_size={block_size} on axis {axis} of an "
                f"input of shape {list(shape)} it must be {list(want)}"
            )
        return np.repeat(p, block_size, axis=ax)[(slice(None),) * ax + (slice(0, shape[ax]),)]
    if p.ndim != 1 or p.shape[0] != shape[ax]:
        raise ModelError(
            f"{op}: {what} has shape {list(p.shape)}, but axis {axis} of its input (shape {list(shape)}) has "
            f"{shape[ax]} channels; a per-channel {what} is 1-D with one value per channel"
        )
    return p.reshape((1,) * ax + (p.shape[0],) + (1,) * (rank - ax - 1))


def _saturate(v: np.ndarray, zp: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rounded float32 values v (before the zero point) as integers of dtype: clamped to the range less the zero
    point first, as MLAS does (so NaN and infinities saturate rather than wrap), then shifted by it."""
    info = np.iinfo(dtype)
    lo, hi = (info.min - zp).astype(F32), (info.max - zp).astype(F32)
    with np.errstate(invalid="ignore"):
        v = np.rint(np.clip(np.nan_to_num(v, nan=0.0), lo, hi))
        return (v.astype(np.int32) + zp).astype(dtype)


def quantize(x: np.ndarray, scale, zp: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """saturate(round(x / scale) + zp), in float32 as onnxruntime divides."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.divide(x.astype(F32, copy=False), np.asarray(scale, F32))
    return _saturate(v, zp, dtype)


def dequantize(q: np.ndarray, scale, zp: np.ndarray) -> np.ndarray:
    """(q - zp) * scale in float32."""
    return (q.astype(np.int32) - zp).astype(F32) * np.asarray(scale, F32)


def _requantize(acc: np.ndarray, scale, zp: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An exact integer sum (float64) as onnxruntime's requantization of its int32 accumulator."""
    return _saturate(_int32(acc).astype(F32) * np.asarray(scale, F32), zp, dtype)


def _int32(acc: np.ndarray) -> np.ndarray:
    """Exact integer values (float64) as int32, wrapping as an int32 accumulator would."""
    return acc.astype(np.int64).astype(np.int32)


def _centered(op: str, what: str, q: np.ndarray, zp: np.ndarray | None, shape_zp=None) -> np.ndarray:
    """q - zp in float64, exact (the operand of an integer product)."""
    z = np.zeros((), np.int32) if zp is None else _zero_point(op, f"{what}'s zero point", zp, q.dtype)
    if shape_zp is not None:
        z = shape_zp(z)
    return q.astype(np.float64) - z


def _scalar(op: str, what: str, p: np.ndarray | None) -> np.ndarray:
    if p is not None and np.size(p) != 1:
        raise ModelError(f"{op}: {what} has {np.size(p)} values; onnxruntime takes one here (per tensor)")
    return p if p is None else np.asarray(p).reshape(())


# -------------------------------------------------------------------------------- QDQ


@kernel("QuantizeLinear")
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
    saturate: int = 1,  # only float8 outputs saturate optionally; integers always do
) -> np.ndarray:
    op = "QuantizeLinear"
    if precision not in (0, 1):
        raise UnsupportedError(
            f"{op}: precision={precision} is not supported; use 0 (the scale's) or 1 (float)"
        )
    if y_zero_point is not None:
        dtype = _qtype(op, "y_zero_point", y_zero_point.dtype)
        if output_dtype and np.dtype(_ONNX_DTYPES.get(output_dtype, np.void)) != dtype:
            raise ModelError(
                f"{op}: output_dtype={output_dtype} is not the type of y_zero_point ({dtype.name})"
            )
    else:
        dtype = _qtype(op, f"output_dtype={output_dtype}", _ONNX_DTYPES.get(output_dtype or 2, np.void))
    _qtype(op, "x", x.dtype, tuple(np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int32)))
    s = _along(op, "y_scale", y_scale, x.shape, axis, block_size)
    zp = np.zeros((), np.int32)
    if y_zero_point is not None:
        zp = _along(op, "y_zero_point", y_zero_point.astype(np.int32), x.shape, axis, block_size)
    return quantize(x, s, zp, dtype)


@kernel("DequantizeLinear")
def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """(x - zero point) * scale. Into out (the planned buffer) with no temporary of the tensor's size: a frozen
    int8 weight is dequantized on the fly each step."""
    op = "DequantizeLinear"
    _qtype(op, "x", x.dtype, (*QTYPES, np.dtype(np.int32)))
    dtype = _qtype(op, "x_scale", x_scale.dtype, (np.dtype(np.float32), np.dtype(np.float16)))
    if output_dtype and np.dtype(_ONNX_DTYPES.get(output_dtype, np.void)) != dtype:
        raise UnsupportedError(
            f"{op}: output_dtype={output_dtype} differs from x_scale's type ({dtype.name})"
        )
    zp = _zero_point(op, "x_zero_point", x_zero_point, x.dtype)
    if x.dtype == np.int32 and np.any(zp):
        raise ModelError(f"{op}: an int32 input takes no zero point but 0 (the spec's int32 form)")
    s = _along(op, "x_scale", x_scale, x.shape, axis, block_size)
    if x_zero_point is not None:
        zp = _along(op, "x_zero_point", zp, x.shape, axis, block_size)
    if x.dtype == np.int32:  # int32 - 0: no int32 wrap
        return (x.astype(F32) * s.astype(F32)).astype(dtype, copy=False)
    if dtype != F32:
        return dequantize(x, s, zp).astype(dtype, copy=False)
    res = out if out is not None else np.empty(x.shape, F32)
    np.subtract(x, zp, out=res, casting="unsafe")  # exact: small integers, computed in chunks
    np.multiply(res, s.astype(F32, copy=False), out=res)
    return res


# -------------------------------------------------------------------------------- fake quantization (QAT)


def _fake_params(
    op: str, x: np.ndarray, scale, zero_point, axis: int
) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    dtype = _qtype(op, "zero_point", zero_point.dtype)
    _qtype(op, "x", x.dtype, (np.dtype(np.float32),))
    s = _along(op, "scale", np.asarray(scale, F32), x.shape, axis)
    z = _along(op, "zero_point", zero_point.astype(np.int32), x.shape, axis)
    return s, z, dtype


def _same(node, infos):
    return [infos[0]]


def _grid(
    op: str, x: np.ndarray, scale, zero_point, axis: int, out: np.ndarray | None = None, qrange=(None, None)
) -> tuple[np.ndarray, F32, F32, np.ndarray]:
    """(round(x / scale) in float32 (in out, when given), the least and greatest values of the grid less the zero
    point, the scale as it broadcasts against x). qrange: the integer range, when narrower than the type's (the
    7-bit weights of onnxruntime's reduce_range)."""
    s, z, dtype = _fake_params(op, x, scale, zero_point, axis)
    info = np.iinfo(dtype)
    qmin = info.min if qrange[0] is None else max(int(qrange[0]), info.min)
    qmax = info.max if qrange[1] is None else min(int(qrange[1]), info.max)
    lo, hi = (F32(qmin) - z.astype(F32)), (F32(qmax) - z.astype(F32))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.divide(x, s, dtype=F32) if out is None else np.divide(x, s, out=out)
    np.rint(v, out=v)
    return v, lo, hi, s


@kernel("FakeQuantize", domain=PRIVATE_DOMAIN, inplace=(0,), shape=_same)
def fake_quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
    *,
    axis: int = 1,
    qmin: int | None = None,
    qmax: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear with one scale and zero point (float32 in, float32 out), as onnxruntime
    runs the pair: the value a float master weight or an activation takes on its integer grid. Computed in float32
    without the integer round trip: clip(round(x / scale), qmin - zp, qmax - zp) * scale is the same number (the
    bounds are integers, so clipping before or after rounding agrees). A NaN stays NaN (the pair gives 0): the
    step's non-finite check reports it. qmin/qmax narrow the integer range (reduce_range's 7-bit weights)."""
    v, lo, hi, s = _grid("FakeQuantize", x, scale, zero_point, axis, out, (qmin, qmax))
    np.clip(v, lo, hi, out=v)
    v *= s
    return v


@kernel("FakeQuantizeGrad", domain=PRIVATE_DOMAIN, inplace=(0,), shape=lambda node, infos: [infos[1]])
def fake_quantize_grad(
    dy: np.ndarray,
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
    *,
    axis: int = 1,
    qmin: int | None = None,
    qmax: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The straight-through estimator with clipping (PyTorch's fake_quantize backward): dy where round(x / scale)
    + zero_point lies in the integer range, 0 where the quantization saturates (and for NaN)."""
    v, lo, hi, _ = _grid("FakeQuantizeGrad", x, scale, zero_point, axis, None, (qmin, qmax))
    keep = v >= lo
    keep &= v <= hi
    return np.multiply(dy, keep, out=out) if out is not None else np.multiply(dy, keep, dtype=dy.dtype)


# -------------------------------------------------------------------------------- dynamic


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """onnxruntime's uint8 scale and zero point of x: its range widened to hold 0, over 255 steps (scale 1 when
    the range is empty, where the spec's formula would divide by zero)."""
    lo = min(F32(np.min(x)) if x.size else F32(0), F32(0))
    hi = max(F32(np.max(x)) if x.size else F32(0), F32(0))
    scale = F32(1) if hi == lo else F32(F32(hi - lo) / F32(255))
    zp = np.rint(np.clip(F32(0) - F32(lo / scale), F32(0), F32(255)))
    return scale, np.uint8(zp)


@kernel("DynamicQuantizeLinear")
def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _qtype("DynamicQuantizeLinear", "x", x.dtype, (np.dtype(np.float32),))
    if not np.isfinite(x).all():
        raise ModelError("DynamicQuantizeLinear: its input holds NaN or infinite values; no scale fits them")
    scale, zp = dynamic_params(x)
    y = quantize(x, scale, np.asarray(zp, np.int32), np.dtype(np.uint8))
    return y, np.asarray(scale, F32), np.asarray(zp, np.uint8)
