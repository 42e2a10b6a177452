"""An .npz archive -> NpzDataView: each array read by our own bounded reader (zip directory and .npy header
checked before anything is allocated or inflated), never with pickle."""

from __future__ import annotations

import io
import math
import os
import struct
import tokenize
import zipfile
import zlib

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import (
    NPY_MAX_HEADER,
    NPZ_MAX_BYTES,
    NPZ_MAX_MEMBERS,
    allocate,
    limit_argument,
    read_into,
    size_text,
)
from .views import ArrayDataView

NPY_MAGIC = b"\x93NUMPY"
_KINDS = "biuf"  # bool, integers, floats: what a feature or a label can be
_COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}  # what np.savez writes
_MAX_DIMS = 32  # numpy 1.24's limit (2.x allows 64)


def _npz_dtypes(dtype, stored: np.dtype) -> tuple[np.dtype | None, np.dtype | None]:
    """The dtypes x and float y become (None: as stored) for NpzDataView's `dtype` argument."""
    if dtype is None:
        return None, None
    if isinstance(dtype, str) and dtype == "auto":
        # floats become float32, the runtime's type; integers and bools are data (token ids, pixels) whose
        # exact values matter, so they stay as stored until a Preprocess that knows the model casts them
        return (np.dtype(np.float32) if stored.kind == "f" else None), np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ConfigError(f"NpzDataView dtype must be 'auto', None or a numpy dtype, got {dtype!r}") from e
    if dt.kind not in _KINDS:
        raise ConfigError(f"NpzDataView dtype must be a numeric dtype (bool, integer, float), got {dt}")
    return dt, dt


class NpzDataView(ArrayDataView):
    """x = archive[x_key], y = archive[y_key]. Never loads Python objects: object arrays are refused.

    dtype="auto" (the default): float x becomes float32; integer and bool x stay as stored (token ids stay
    int64, uint8 images stay uint8: casting is the job of a Preprocess, which knows the model). None keeps x
    as stored; a dtype casts x. y: integers become int64 class labels; floats become float32 (the dtype
    given, when one is; None keeps them).

    Each array is read by a bounded reader: its .npy header (shape, dtype) must agree with the size the zip
    directory records, and its data must fit `max_bytes` (default NPZ_MAX_BYTES, 1 GiB; DataLimitError beyond),
    all checked before anything that size is allocated or inflated. Object, structured and text arrays and
    members that are not .npy arrays are refused; NaN or inf in x or float y is refused, naming the sample.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        x_key: str = "x",
        y_key: str = "y",
        *,
        dtype="auto",
        num_classes: int | None = None,
        max_bytes: int = NPZ_MAX_BYTES,
    ):
        path = os.fspath(path)
        _npz_dtypes(dtype, np.dtype(np.float32))  # a bad argument fails before the file is read
        max_bytes = limit_argument(max_bytes)
        for name, key in (("x_key", x_key), ("y_key", y_key)):
            if not isinstance(key, str):
                raise ConfigError(f"NpzDataView {name} must be a str, got {key!r}")
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        x, y = read_npz(path, (x_key, y_key), max_bytes=max_bytes)
        xt, yt = _npz_dtypes(dtype, x.dtype)
        x = _cast(x, xt, path, x_key)
        if yt is not None and y.dtype.kind == "f":
            y = _cast(y, yt, path, y_key)
        super().__init__(x, y, num_classes=num_classes, source=path)


def _cast(a: np.ndarray, dt: np.dtype | None, path: str, key: str) -> np.ndarray:
    """a as dt; a finite float that the new dtype cannot hold (1e39 in float32 becomes inf) is refused."""
    if dt is None or a.dtype == dt:
        return a
    if dt.kind == "f" and a.dtype.kind == "f" and a.size and a.ndim:
        big = np.finfo(dt).max
        if a.max() > big or a.min() < -big:  # two passes, no temporary; NaN compares False
            over = (np.abs(a) > big) & np.isfinite(a)  # inf itself is named by the finite check, later
            rows = np.flatnonzero(over.reshape(len(a), -1).any(axis=1))
            if rows.size:
                i = int(rows[0])
                value = a[i].reshape(-1)[np.flatnonzero(over[i].reshape(-1))[0]]
                raise DataError(
                    f"{path}: array {key!r} holds {float(value):g} (sample {i}), beyond {dt} (largest "
                    f"{float(big):g}): it would become inf; scale the data, or pass dtype=None to keep {a.dtype}",
                    path,
                )
    try:
        return a.astype(dt, copy=False)
    except MemoryError as e:
        raise DataLimitError(f"{path}: not enough memory to cast {key!r} to {dt} ({e})", path) from None


def read_npz(path: str, keys, *, max_bytes: int = NPZ_MAX_BYTES) -> list[np.ndarray]:
    """The arrays `keys` of the .npz at `path` (np.savez's names: "x" is the member x.npy), each read within
    the bounds the archive declares and `max_bytes`. DataError naming the file and member for anything else."""
    try:
        with open(path, "rb") as f:
            if f.read(6) == NPY_MAGIC:
                raise DataError(
                    f"{path}: one .npy array, not an .npz archive (np.savez(path, x=x, y=y) is)", path
                )
        _check_member_count(path)
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            arrays = {n[:-4] if n.endswith(".npy") else n for n in names}
            missing = [k for k in keys if k not in names and k + ".npy" not in names]
            if missing:
                raise DataError(
                    f"{path}: no array named {' or '.join(map(repr, missing))}; the archive holds "
                    f"{sorted(arrays)[:20]}{' ...' if len(arrays) > 20 else ''} (choose with x_key= and y_key=)",
                    path,
                )
            # as np.load does: a member named exactly `key` first, else key.npy
            return [_read_member(zf, path, k if k in names else k + ".npy", max_bytes) for k in keys]
    except DataError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error, struct.error) as e:
        raise DataError(f"{path}: cannot read as an .npz (zip) archive: {e}", path) from e
    except (ValueError, NotImplementedError, RuntimeError, OverflowError) as e:
        # zipfile's own refusals of a damaged directory (a bad name encoding, a negative seek, an encrypted or
        # unknown member); our own errors were re-raised above
        raise DataError(f"{path}: a damaged or unsupported .npz (zip) archive: {e}", path) from e


def _check_member_count(path: str) -> None:
    """Refuses an archive whose end-of-directory record declares more members than NPZ_MAX_MEMBERS, before
    zipfile lists them (each costs a few hundred bytes of Python objects: ~10x the directory's size)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            tail_len = min(size, 22 + 0xFFFF)
            f.seek(size - tail_len)
            tail = f.read(tail_len)
            pos = tail.rfind(b"PK\x05\x06")
            if pos < 0 or len(tail) - pos < 22:
                return  # zipfile says what is wrong
            total = int.from_bytes(tail[pos + 10 : pos + 12], "little")
            if total == 0xFFFF and pos >= 20 and tail[pos - 20 : pos - 16] == b"PK\x06\x07":  # zip64
                f.seek(min(int.from_bytes(tail[pos - 12 : pos - 4], "little"), size))
                record = f.read(40)
                if record[:4] == b"PK\x06\x06" and len(record) == 40:
                    total = int.from_bytes(record[32:40], "little")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
    if total > NPZ_MAX_MEMBERS:
        raise DataLimitError(
            f"{path}: the zip directory declares {total} members, more than the {NPZ_MAX_MEMBERS} an .npz of "
            f"arrays is read with (np.savez(path, x=x, y=y) writes 2)",
            path,
            limit=NPZ_MAX_MEMBERS,
            needed=total,
        )


def _read_member(zf: zipfile.ZipFile, path: str, name: str, max_bytes: int) -> np.ndarray:
    info = zf.getinfo(name)
    where = f"{path}: member {name!r}"
    if info.flag_bits & 0x1:
        raise DataError(f"{where} is encrypted; np.savez writes plain members", path)
    if info.compress_type not in _COMPRESSIONS:
        raise DataError(
            f"{where} is compressed with method {info.compress_type}; an .npz holds stored or deflated members "
            f"(np.savez, np.savez_compressed)",
            path,
        )
    with zf.open(info) as f:
        shape, fortran, dtype, offset = _read_header(f, where, path)
        nbytes = math.prod(shape) * dtype.itemsize
        declared = f"shape {list(shape)} {dtype.name}, {size_text(nbytes)}"
        if nbytes > max_bytes:
            raise DataLimitError(
                f"{where}: its .npy header declares {declared}, more than the {size_text(max_bytes)} allowed; "
                f"refused before reading it (pass max_bytes= to allow more)",
                path,
                limit=max_bytes,
                needed=nbytes,
            )
        if offset + nbytes != info.file_size:
            raise DataError(
                f"{where}: its .npy header declares {declared} (+ a {offset}-byte header), but the zip directory "
                f"says the member holds {info.file_size} bytes: a damaged or crafted archive",
                path,
            )
        buf = allocate(nbytes, path, f"member {name!r} ({declared})")
        got = read_into(f, buf)  # zipfile never returns more than the directory's size, and checks the crc
        if got < nbytes or f.read(1):
            raise DataError(
                f"{where}: truncated: its data ends after {got} of the {nbytes} bytes its header declares",
                path,
            )
    arr = buf.view(dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _read_header(f, where: str, path: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, header size) of the .npy array at the start of stream f, checked."""
    pre = f.read(8)
    if pre[:6] != NPY_MAGIC or len(pre) < 8:
        raise DataError(
            f"{where} is not a .npy array (it starts with {pre[:8]!r}); NpzDataView reads arrays saved by "
            f"np.savez(path, x=x, y=y)",
            path,
        )
    major = pre[6]
    if major not in (1, 2):
        raise DataError(
            f"{where}: .npy format version {major}.{pre[7]} is not read here (versions 1.0 and 2.0 hold plain "
            f"numeric arrays; version 3 exists only for structured arrays with non-Latin-1 field names)",
            path,
        )
    length_bytes = f.read(2 if major == 1 else 4)
    if len(length_bytes) != (2 if major == 1 else 4):
        raise DataError(f"{where}: truncated .npy header", path)
    length = int.from_bytes(length_bytes, "little")
    if length > NPY_MAX_HEADER:
        raise DataError(
            f"{where}: a .npy header of {length} bytes; a numeric array's header is under 200 (numpy refuses "
            f"more than {NPY_MAX_HEADER})",
            path,
        )
    header = f.read(length)
    if len(header) != length:
        raise DataError(f"{where}: truncated .npy header ({len(header)} of {length} bytes)", path)
    reader = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = reader(io.BytesIO(length_bytes + header))
    except (
        ValueError,
        SyntaxError,
        TypeError,
        KeyError,
        MemoryError,
        RecursionError,
        tokenize.TokenError,
    ) as e:
        # numpy parses the dict with ast.literal_eval (after tokenizing it) and names what is wrong
        raise DataError(f"{where}: a damaged .npy header ({e})", path) from None
    if dtype.hasobject:
        raise DataError(
            f"{where} holds Python objects (dtype {dtype}), which are never loaded (unpickling runs code): save "
            f"numbers, e.g. np.savez(path, x=x.astype(np.float32), y=y.astype(np.int64))",
            path,
        )
    if dtype.names is not None or dtype.subdtype is not None:
        raise DataError(
            f"{where} is a structured array (dtype {dtype}); save each field as its own plain numeric array",
            path,
        )
    if dtype.kind not in _KINDS:
        raise DataError(
            f"{where}: dtype {dtype} is not numeric; features and labels are bool, integers or floats", path
        )
    if len(shape) > _MAX_DIMS or not all(isinstance(d, int) and 0 <= d < 2**62 for d in shape):
        raise DataError(f"{where}: .npy header declares an impossible shape {shape}", path)
    return tuple(shape), bool(fortran), dtype, 8 + len(length_bytes) + length
