"""What a sample store file holds: its format's name and version, its schema (the tables as a store makes them and
SQLite's own bookkeeping a store may also hold), and samples <-> rows (an array's dtype, shape, bytes and crc32,
encoded for writing and checked after reading).

Format (version 1), readable with any SQLite tool:
  meta(key, value)        format = 'edgetrain.sample-store', version = '1'
  samples(id, created, y_dtype, y_shape, y, y_crc)      id: INTEGER PRIMARY KEY AUTOINCREMENT (never reused)
  sample_x(id, x_dtype, x_shape, x, x_crc)              x in its own table: ids and labels are read without it
An array is its dtype's numpy name ('uint8', 'float32'), its shape as a JSON list and its bytes, little-endian in
C order; crc is zlib.crc32 of dtype + shape + bytes. Nothing is pickled. A file whose schema holds anything else
(a trigger, a view, an index, another table, one of these defined otherwise) is not opened: a trigger could drop a
sample add() has acknowledged.
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np

from .errors import DataError

FORMAT = "edgetrain.sample-store"
VERSION = 1
APPLICATION_ID = 0x45545353  # "ETSS" at offset 68 of the SQLite header: tools like `file` can tell what it is
_X_KINDS, _Y_KINDS = "biufc", "biuf"

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # AUTOINCREMENT: an id is never given to a second sample after a delete, so the split (by id) and any id the
    # app shows the user keep naming one sample forever
    "CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, y_dtype TEXT NOT NULL, "
    "y_shape TEXT NOT NULL, y BLOB NOT NULL, y_crc INTEGER NOT NULL)",
    # x, large, lives apart (small columns first): listing ids and labels never reads a page of an image
    "CREATE TABLE sample_x (id INTEGER PRIMARY KEY, x_dtype TEXT NOT NULL, x_shape TEXT NOT NULL, "
    "x BLOB NOT NULL, x_crc INTEGER NOT NULL)",
)
_COLUMNS = {
    "samples": {"id", "created", "y_dtype", "y_shape", "y", "y_crc"},
    "sample_x": {"id", "x_dtype", "x_shape", "x", "x_crc"},
}


def _words(sql) -> str | None:
    """SQL text with its whitespace runs made single spaces (how a definition is compared)."""
    return " ".join(sql.split()) if isinstance(sql, str) else None


# What sqlite_master of a store holds, name -> (table, definition): its tables as _SCHEMA makes them, and SQLite's
# own bookkeeping (AUTOINCREMENT's counter, meta's primary-key index, the statistics of ANALYZE, which a tool may run)
_OWN_TABLES = {
    **{s.split()[2]: (s.split()[2], _words(s)) for s in _SCHEMA},
    "sqlite_sequence": ("sqlite_sequence", "CREATE TABLE sqlite_sequence(name,seq)"),
    "sqlite_stat1": ("sqlite_stat1", "CREATE TABLE sqlite_stat1(tbl,idx,stat)"),
    "sqlite_stat4": ("sqlite_stat4", "CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)"),
}
_OWN_INDEXES = {"sqlite_autoindex_meta_1": ("meta", None)}


# -- arrays <-> rows -----------------------------------------------------------------------------------------
def _encode(a: np.ndarray, kinds: str, what: str, path: str) -> tuple[str, str, bytes, int]:
    dt = a.dtype
    if dt.kind not in kinds or (dt.kind in "fc" and dt.itemsize > 8 * (1 + (dt.kind == "c"))):
        allowed = "bool, integers, floats" + (", complex" if "c" in kinds else "")
        extra = (
            " (long double differs between x86-64 and aarch64: cast to float64)" if dt.kind in "fc" else ""
        )
        raise DataError(f"{path}: {what} of dtype {dt} cannot be stored{extra}; stored are: {allowed}", path)
    le = np.ascontiguousarray(a, dtype=dt.newbyteorder("<"))
    shape = json.dumps(list(a.shape), separators=(",", ":"))
    data = le.tobytes()
    return dt.name, shape, data, zlib.crc32(data, zlib.crc32(f"{dt.name}{shape}".encode()))


def _sample(x, y, path: str) -> tuple[tuple, tuple]:
    """(x, y) -> the two rows' values; labels: integers become an int64 class, floats stay as given."""
    try:
        x, y = np.asarray(x), np.asarray(y)
    except ValueError as e:  # a ragged list
        raise DataError(f"{path}: a sample must be a numeric array ({e})", path) from None
    if y.dtype.kind in "biu":
        y = y.astype(np.int64)
    return _encode(x, _X_KINDS, "x", path), _encode(y, _Y_KINDS, "label y", path)


class _Damaged(Exception):
    """A stored array that is not what was written (its words go into the DataError naming the sample)."""


# the dtype names a store holds: what _encode writes (numpy's names; no object, text, void or long double), in a
# table, so that a name from the file never reaches np.dtype()
_DTYPES = {
    np.dtype(t).name: np.dtype(t).newbyteorder("<")
    for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
}
_MAX_SHAPE_TEXT = 400  # '[' + 32 dimensions of 10 digits + commas: a shape is short
_MAX_DIMS = 32  # numpy 1.24's limit
_LAYOUTS: dict[tuple, tuple[np.dtype, tuple[int, ...]]] = {}


def _layout(dtype, shape, kinds: str) -> tuple[np.dtype, tuple[int, ...]]:
    key = (dtype, shape, kinds)
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        if dtype is None and shape is None:
            raise _Damaged("nothing stored")
        dt = _DTYPES.get(dtype) if isinstance(dtype, str) else None
        if dt is None or dt.kind not in kinds:
            raise _Damaged(f"dtype {str(dtype)[:40]!r} is not one a store holds")
        if not isinstance(shape, str) or len(shape) > _MAX_SHAPE_TEXT:
            raise _Damaged(f"shape {str(shape)[:40]!r} is not a short JSON list")
        try:
            dims = json.loads(shape)
        except (ValueError, RecursionError):
            dims = None
        if not (
            isinstance(dims, list)
            and len(dims) <= _MAX_DIMS
            and all(type(d) is int and 0 <= d < 2**31 for d in dims)
        ):
            raise _Damaged(f"shape {shape[:40]!r} is not a list of up to {_MAX_DIMS} sizes")
        _LAYOUTS[key] = dt, tuple(dims)
    return _LAYOUTS[key]


def _check(dtype, shape, data, crc, kinds: str) -> tuple[np.dtype, tuple[int, ...]]:
    """A stored array's layout, after checking that its bytes are those written (size and crc)."""
    dt, dims = _layout(dtype, shape, kinds)
    if not isinstance(data, bytes) or len(data) != dt.itemsize * math.prod(dims):
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise _Damaged(f"{size} bytes for {dt.name} {list(dims)}")
    if type(crc) is not int or zlib.crc32(data, zlib.crc32(f"{dtype}{shape}".encode())) != crc:
        raise _Damaged("crc32")
    return dt, dims


def _short(value) -> str:
    """A value read from a file, for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _native(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder("="), copy=False)
