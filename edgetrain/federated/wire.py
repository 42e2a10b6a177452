"""A reply's parameters as they arrive, decoded and checked against the global model before the door lets them near
an aggregate (numpy alone; no flwr).

A Flower Array declares a dtype and a shape beside its bytes, and the bytes are an .npy file (np.save's, the
`numpy.ndarray` serialization) with a dtype and a shape of their own. Nothing makes the two agree, and Flower's
aggregation reads the bytes: a device that declares its bias's shape but carries a matrix stalls the round (the
aggregation fails), one that carries a single value is broadcast into the global model. So the door trusts neither:
the declared dtype and shape must be the global model's, and so must the .npy header's (read within a bound before
anything else), with the body exactly the bytes that shape and dtype take and every value finite. The values are
read in place from the bytes (nothing allocated for them), and it is these the round aggregates.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from edgetrain.core.errors import FeedError

NPY_MAGIC = b"\x93NUMPY"
NUMPY_STYPE = "numpy.ndarray"  # Flower's SType.NUMPY: the bytes are what np.save writes
NPY_MAX_HEADER = 4096  # a parameter's .npy header is about 120 bytes; numpy's own reader stops at 10,000


class RefusedReply(FeedError):
    """A reply the door leaves out of its round; the message says what in it is at fault."""


def carried(name: str, array: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The values a Flower Array carries for parameter `name`, whose global model is of `shape` and `dtype`: its
    declared serialization, dtype and shape, then its bytes (decode). RefusedReply naming what does not fit."""
    stype = getattr(array, "stype", None)
    if stype != NUMPY_STYPE:
        raise RefusedReply(
            f"parameter '{name}' comes serialized as {_shown(stype)}, not as {NUMPY_STYPE} (np.save's bytes, as "
            "Flower's Array.from_numpy_ndarray writes them)"
        )
    declared = _declared_shape(getattr(array, "shape", None))
    if declared != tuple(shape):
        shown = list(declared) if declared is not None else _shown(getattr(array, "shape", None))
        raise RefusedReply(f"parameter '{name}' of shape {shown}, not {list(shape)}")
    kind = getattr(array, "dtype", None)
    if kind != np.dtype(dtype).name:
        raise RefusedReply(f"parameter '{name}' of dtype {_shown(kind)}, not {np.dtype(dtype).name}")
    return decode(name, getattr(array, "data", None), shape, dtype, declared=True)


def decode(name: str, data: Any, shape: tuple[int, ...], dtype: str, *, declared: bool = False) -> np.ndarray:
    """The values of the .npy bytes `data` that must hold parameter `name` as the global model has it (`shape`,
    `dtype`, the machine's byte order): the header read within NPY_MAX_HEADER and checked, the body exactly
    shape x itemsize bytes, every value finite. A read-only array over `data`; RefusedReply otherwise (declared:
    the reply declared the right shape and dtype beside the bytes, and the message says so)."""
    if not isinstance(data, (bytes, bytearray)):
        raise RefusedReply(f"parameter '{name}' carries {type(data).__name__}, not bytes")
    want = np.dtype(dtype)
    got_shape, fortran, got_dtype, offset = _header(name, data)
    if got_dtype != want:
        raise RefusedReply(_lie(name, "dtype", _dtype_text(want), _dtype_text(got_dtype), declared))
    if got_shape != tuple(shape):
        raise RefusedReply(_lie(name, "shape", str(list(shape)), str(list(got_shape)), declared))
    count = math.prod(shape)
    body, need = len(data) - offset, count * want.itemsize
    if body != need:
        raise RefusedReply(
            f"parameter '{name}' carries {body} bytes of values after its .npy header; its shape {list(shape)} of "
            f"{want.name} takes {need}"
        )
    flat = np.frombuffer(data, dtype=want, count=count, offset=offset)
    values = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(values.size - np.count_nonzero(finite))
        raise RefusedReply(f"parameter '{name}' holds {bad} non-finite values (NaN or infinity)")
    return values


def _header(name: str, data: bytes | bytearray) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order, dtype, the header's size in bytes) of the .npy bytes, read within NPY_MAX_HEADER."""
    where = f"parameter '{name}'"
    if bytes(data[:6]) != NPY_MAGIC or len(data) < 10:
        raise RefusedReply(f"{where} carries no .npy array (its bytes start {bytes(data[:8])!r})")
    major, minor = data[6], data[7]
    if major not in (1, 2) or minor != 0:
        raise RefusedReply(f"{where}: .npy format version {major}.{minor}; np.save writes 1.0 (2.0 at most)")
    size = 2 if major == 1 else 4
    length = int.from_bytes(data[8 : 8 + size], "little")
    if length > NPY_MAX_HEADER or 8 + size + length > len(data):
        raise RefusedReply(
            f"{where}: an .npy header of {length} bytes in {len(data)} (a parameter's takes about 120, at most "
            f"{NPY_MAX_HEADER} are read)"
        )
    reader = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = reader(io.BytesIO(bytes(data[8 : 8 + size + length])))
    except (
        Exception
    ) as e:  # numpy parses the device's header (ast, and tokenize for old files): any error is its
        raise RefusedReply(f"{where}: a damaged .npy header ({type(e).__name__}: {str(e)[:200]})") from None
    return tuple(shape), bool(fortran), dtype, 8 + size + length


def _lie(name: str, what: str, want: str, got: str, declared: bool) -> str:
    if declared:  # what the reply said of its array was right: the bytes are not that
        return f"parameter '{name}' declares {what} {want} (the global model's) but carries values of {what} {got}"
    return f"parameter '{name}' carries values of {what} {got}, not {want} (the global model's)"


def _dtype_text(dtype: np.dtype) -> str:
    """'<f4 (float32)', '>f4 (float32, big-endian)': the .npy descr and what it is."""
    order = ", big-endian" if dtype.byteorder == ">" else ""
    return f"{dtype.str} ({dtype.name}{order})"


def _declared_shape(shape: Any) -> tuple[int, ...] | None:
    """A declared shape as a tuple of whole numbers, or None when it is not one."""
    if not isinstance(shape, (tuple, list)):
        return None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _shown(value: Any) -> str:
    """A value a device sent, for a message: a plain word as it is, anything else as its repr, cut short."""
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["NPY_MAX_HEADER", "NUMPY_STYPE", "RefusedReply", "carried", "decode"]
