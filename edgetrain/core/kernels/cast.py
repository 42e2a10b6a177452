"""Cast kernels (array, ONNX type code or like-tensor -> array of that dtype) and the ONNX <-> numpy dtype tables."""

from __future__ import annotations

import math
import re

import numpy as np

from edgetrain.core.errors import UnsupportedError

from ._util import _is_text
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


def onnx_type(dtype: np.dtype) -> int:
    """The ONNX element type (TensorProto's number) of a numpy dtype: a Cast's `to`."""
    return int(NUMPY_TO_ONNX[np.dtype(dtype)])
