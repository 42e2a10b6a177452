"""Outside bytes -> memory, never more than the format declares or a ceiling allows: the loaders' ceilings and the
bounded stream reads (exact, capped) that every decompression goes through.

A ceiling is a default: each reader takes `max_bytes=` to raise (or lower) it. Hitting one raises DataLimitError
(a MemoryError too) naming the file, the limit and what was asked, before anything that size is allocated.
"""

from __future__ import annotations

import io
import numbers
import os

import numpy as np

from .errors import ConfigError, DataError, DataLimitError

# an idx .gz is inflated into memory (its header declares the exact size); a raw idx file is memory-mapped and
# needs no ceiling: its size on disk bounds it
IDX_GZ_MAX_BYTES = 1 << 30
# one array of an .npz (x or y), stored or deflated: the header's shape x itemsize must fit it
NPZ_MAX_BYTES = 1 << 30
# members in an .npz's zip directory (each costs a few hundred bytes of Python objects to list)
NPZ_MAX_MEMBERS = 10_000
# a .npy header is a short dict literal; numpy's own reader refuses more than 10,000 bytes
NPY_MAX_HEADER = 10_000
# the text of a CSV file (raw, or once inflated): parsing holds it and the float32 table, 2-4 times its size
CSV_MAX_BYTES = 256 << 20
# the columns of a CSV table (MNIST as CSV has 785; a 96 x 96 RGB image flattened 27,649)
CSV_MAX_COLUMNS = 1 << 20

CHUNK = 1 << 20  # bytes inflated per read: the most a stream ever holds beyond its destination


def limit_argument(max_bytes, what: str = "max_bytes") -> int:
    """A ceiling given by keyword: a non-negative integer (ConfigError otherwise)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral) or max_bytes < 0:
        raise ConfigError(f"{what} must be a number of bytes >= 0, got {max_bytes!r}")
    return int(max_bytes)


def size_text(n: int) -> str:
    """A byte count for messages: exact, with a readable unit beside it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n} bytes ({n / scale:.1f} {unit})"
    return f"{n} bytes"


def allocate(nbytes: int, path: str, what: str) -> np.ndarray:
    """A uint8 buffer of nbytes for `what` of `path`; a DataLimitError (naming both) when memory refuses it."""
    try:
        return np.empty(nbytes, dtype=np.uint8)
    except (MemoryError, ValueError, OverflowError) as e:  # ValueError: 'array is too big' on 32-bit builds
        raise DataLimitError(
            f"{path}: not enough memory for {what}: {size_text(nbytes)} could not be allocated ({e})",
            path,
            needed=nbytes,
        ) from None


def read_into(stream, buf: np.ndarray) -> int:
    """Fills `buf` (uint8) from `stream` chunk by chunk; returns how many bytes came (less: the stream ended)."""
    view = memoryview(buf)
    done, total = 0, buf.size
    while done < total:
        data = stream.read(min(CHUNK, total - done))
        if not data:
            break
        view[done : done + len(data)] = data
        done += len(data)
    return done


def read_capped(stream, limit: int) -> tuple[bytes, bool]:
    """(the stream's bytes, False), or (what was read, True) as soon as it holds more than `limit` bytes: never
    inflates more than limit + one chunk."""
    out = io.BytesIO()
    total = 0
    while True:
        data = stream.read(min(CHUNK, limit + 1 - total))
        if not data:
            return out.getvalue(), False
        total += len(data)
        if total > limit:
            return b"", True
        out.write(data)


def gzip_declared_size(path: str) -> int | None:
    """The gzip trailer's ISIZE (the last member's inflated size mod 2**32), or None for a file too short.

    It is a lower bound of what the file inflates to unless the file is damaged (gzip checks it at the end), so
    an ISIZE above a ceiling refuses a bomb without inflating it; a small one proves nothing (streams are capped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < 18:  # a 10-byte header and an 8-byte trailer at least
                return None
            f.seek(-4, os.SEEK_END)
            return int.from_bytes(f.read(4), "little")
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
