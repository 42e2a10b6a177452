"""The one file format of edgetrain (numpy only): (kind, JSON header, named tensors) <-> a `.etrain` artifact or a
`.etck` checkpoint file.

Layout of format version 1 (all integers little-endian)::

    offset 0   8 bytes   magic b"\\x89ETR\\r\\n\\x1a\\n" (PNG-style: catches 7-bit and CRLF/LF text-mode damage)
           8   uint32    format version (1)
          12   uint32    kind code (1 artifact, 2 checkpoint)
          16   uint64    header length H
          24   H bytes   header: zlib-compressed UTF-8 JSON, sorted keys, compact separators:
                         {"header": <the caller's dict>,
                          "tensors": {name: {"dtype": "float32", "shape": [..], "offset": o, "nbytes": n}}}
                         zero padding to a multiple of 64 = D, the start of the data section
           D+o n bytes   each tensor's raw bytes, C order, little-endian (bool: one byte), in the order given;
                         o (relative to D) is a multiple of 64, gaps are zero bytes
           end-32        SHA-256 of every byte before it

The writer is deterministic (same inputs, byte-identical file) and atomic (temp file, fsync, os.replace, fsync of
the directory); temporary files a killed writer left beside a file are removed on its next write or read. The reader
maps the file once and returns read-only zero-copy views; it never loads Python objects. It trusts nothing before
the checksum: the checksum is verified before the header is parsed, the header is bounded (its length, what it
inflates to, its JSON nesting and item count), and every tensor table entry is checked (dtype, shape, byte count,
offset, place in the data section) before an array is made. A bad file raises ArtifactError (ArtifactLimitError,
a MemoryError too, when it asks for more than a bound), a file-system failure StorageError (MissingFileError for a
missing file), each naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from .atomic import _replace_atomically, remove_stale_temporaries
from .declared import DTYPES, _fail, _inflate, declared_nbytes, parse_json, short
from .errors import ArtifactError, ArtifactLimitError, MissingFileError, StorageError
from .mapped import _CHUNK, CHECKSUM_BYTES, _checksum_matches, _close

MAGIC = b"\x89ETR\r\n\x1a\n"
CURRENT_VERSION = 1
SUPPORTED_VERSIONS = (1,)  # every version ever written; the reader dispatches on it (see _READERS)
KINDS = {
    "artifact": 1,
    "checkpoint": 2,
    "adapters": 3,
}  # kind name -> code in the preamble; add kinds, never renumber
SUFFIXES = {"artifact": ".etrain", "checkpoint": ".etck", "adapters": ".etad"}
ALIGN = 64
_PREAMBLE = struct.Struct("<8sIIQ")  # magic, version, kind code, header length: 24 bytes
# The most header bytes a file may have, compressed and inflated (JSON text). A real header is far smaller (a
# ResNet-50 training artifact's: 77 KB compressed, 0.6 MB of JSON); a caller can raise it (max_header_bytes=).
MAX_HEADER_BYTES = 64 << 20
# A file whose checksum fails is not trusted further: its header is parsed only to say whether it was cut short,
# and only when it is at most this big (larger, the message is the checksum's).
_DIAGNOSIS_BYTES = 8 << 20


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _kind_name(code: int) -> str | None:
    return next((k for k, c in KINDS.items() if c == code), None)


def _describe_kind(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({SUFFIXES.get(kind, '?')})"


# ---- writing -------------------------------------------------------------------------------------------------
def _le_dtype(dtype: np.dtype, name: str, path: str) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in DTYPES or dt.fields is not None:
        raise ArtifactError(
            f"cannot write '{path}': tensor '{name}' has dtype {dt}, which edgetrain files do not store; "
            f"supported: {', '.join(sorted(DTYPES))}"
        )
    return dt.newbyteorder("<")


def _tensor_bytes(array: np.ndarray, dtype: np.dtype):
    """The raw bytes of one tensor (C order, little-endian) as memoryviews; copies only when the array is not
    already contiguous little-endian."""
    flat = np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8)
    view = memoryview(flat)
    for start in range(0, len(view), 64 * _CHUNK):
        yield view[start : start + 64 * _CHUNK]


def _layout(path: str, kind: str, header: Any, tensors: Mapping[str, Any]):
    """(preamble + header bytes, [(array, dtype, absolute offset, nbytes)], total size) for the writer."""
    if kind not in KINDS:
        raise ArtifactError(f"cannot write '{path}': unknown kind '{kind}'; kinds: {', '.join(KINDS)}")
    if not isinstance(header, dict):
        raise ArtifactError(f"cannot write '{path}': the header must be a dict, not {type(header).__name__}")
    if not isinstance(tensors, Mapping):
        raise ArtifactError(
            f"cannot write '{path}': tensors must be a mapping of name -> array, not {type(tensors).__name__}"
        )
    table: dict[str, dict[str, Any]] = {}
    items = []
    end = 0
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise ArtifactError(f"cannot write '{path}': tensor names must be strings, got {name!r}")
        try:
            a = np.asarray(t)
        except Exception as e:
            raise ArtifactError(
                f"cannot write '{path}': tensor '{name}' cannot be made an array: {type(e).__name__}: {e}"
            ) from e
        dt = _le_dtype(a.dtype, name, path)
        offset, nbytes = _align(end), a.size * dt.itemsize
        table[name] = {
            "dtype": dt.name,
            "shape": [int(d) for d in a.shape],
            "offset": offset,
            "nbytes": nbytes,
        }
        items.append((a, dt, offset, nbytes))
        end = offset + nbytes
    try:
        text = json.dumps(
            {"header": header, "tensors": table},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")
        # Programs are repetitive JSON (op names, value names): compressed, a header costs ~1/6 of its text.
        text = zlib.compress(text, 9)
    except (TypeError, ValueError, UnicodeError) as e:
        raise ArtifactError(
            f"cannot write '{path}': the header is not JSON-able ({e}); use str keys, and int, float (finite), "
            "str, bool, None, lists and dicts of them"
        ) from e
    head = _PREAMBLE.pack(MAGIC, CURRENT_VERSION, KINDS[kind], len(text)) + text
    data_start = _align(len(head))
    head += bytes(data_start - len(head))
    placed = [(a, dt, data_start + off, n) for a, dt, off, n in items]
    return head, placed, data_start + end + CHECKSUM_BYTES


def write_container(
    path: str | os.PathLike, *, kind: str, header: dict, tensors: Mapping[str, np.ndarray]
) -> int:
    """Writes one edgetrain file atomically and returns its size in bytes.

    kind: "artifact", "checkpoint" or "adapters"; header: a JSON-able dict; tensors: name -> array (numeric
    dtypes), stored in the order given. The same inputs give a byte-identical file. A crash or error at any point
    leaves the previous file at path untouched and no temporary file behind (a killed process may leave a
    `.*.tmp`, which the next write or read of path removes). A file-system failure is a StorageError naming path."""
    path = os.fspath(path)
    head, placed, total = _layout(path, kind, header, tensors)

    def fill(f: BinaryIO) -> None:
        h = hashlib.sha256()

        def put(b) -> None:
            f.write(b)
            h.update(b)

        put(head)
        pos = len(head)
        for a, dt, offset, nbytes in placed:
            put(bytes(offset - pos))
            for chunk in _tensor_bytes(a, dt):
                put(chunk)
            pos = offset + nbytes
        f.write(h.digest())
        assert f.tell() == total, f"wrote {f.tell()} bytes for '{path}', the layout says {total}"

    _replace_atomically(path, fill, f"the {kind}")
    return total


# ---- reading -------------------------------------------------------------------------------------------------
def _looks_like(data: bytes) -> str:
    """A guess at what a file that is not ours is, from its first bytes."""
    if b"ETR" in data[:8]:
        return (
            "it has the edgetrain signature but with altered bytes: it was copied or written in text mode "
            "(line endings converted, 8th bit stripped); copy the original again in binary mode"
        )
    guesses = [
        (b"\x89PNG", "a PNG image"),
        (b"PK\x03\x04", "a zip archive (a PyTorch .pt or numpy .npz file?)"),
        (b"\x93NUMPY", "a numpy .npy file"),
        (b"\x80", "a Python pickle"),
        (b"\x7fELF", "an executable"),
        (b"\x89HDF", "an HDF5 (Keras .h5) file"),
    ]
    for prefix, what in guesses:
        if data.startswith(prefix):
            return f"it looks like {what}"
    # An ONNX ModelProto starts with field 1 (ir_version, a varint: 0x08) and then another protobuf field.
    if (
        len(data) >= 3
        and data[0] == 0x08
        and data[1] < 0x80
        and data[2] in (0x12, 0x1A, 0x22, 0x2A, 0x3A, 0x42)
    ):
        return (
            "it looks like an ONNX model; make a training artifact from it with `edgetrain convert` "
            "(or run it with edgetrain.InferenceSession)"
        )
    if data[:1] in (b"{", b"["):
        return "it looks like JSON text"
    if all(32 <= c < 127 or c in (9, 10, 13) for c in data):
        return "it looks like text"
    return f"its first bytes are {data[:16]!r}"


def _open(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError as e:
        raise MissingFileError(
            f"cannot read '{path}': no such file; check the path (cwd is {os.getcwd()})",
            path=path,
            errno=e.errno,
            strerror=e.strerror,
        ) from None
    except IsADirectoryError as e:
        raise StorageError(
            f"cannot read '{path}': it is a directory, not an edgetrain file",
            path=path,
            errno=e.errno,
            strerror=e.strerror,
        ) from None
    except OSError as e:
        raise StorageError.of(e, path, "cannot read") from e


def _preamble(f: BinaryIO, path: str, size: int) -> tuple[int, int, int]:
    """(version, kind code, header length); errors for empty, foreign, truncated and newer files."""
    data = f.read(_PREAMBLE.size)
    if not data:
        raise _fail(path, "is empty (0 bytes): truncated, not a complete edgetrain file; write it again")
    if data[:8] != MAGIC[: len(data[:8])]:
        raise _fail(path, f"is not an edgetrain artifact or checkpoint: {_looks_like(data)}")
    if len(data) < _PREAMBLE.size:
        raise _fail(
            path,
            f"is truncated: it ends after {size} bytes, inside the {_PREAMBLE.size}-byte preamble; write it again",
        )
    _, version, kind_code, hlen = _PREAMBLE.unpack(data)
    if version > CURRENT_VERSION:
        raise _fail(
            path,
            f"was written in format {version}, which is newer than this edgetrain reads ({CURRENT_VERSION}); "
            "upgrade edgetrain",
        )
    if version not in _READERS:
        raise _fail(
            path, f"is corrupt: its format version field says {version}, which no edgetrain ever wrote"
        )
    return version, kind_code, hlen


Entry = tuple[
    str, np.dtype, tuple[int, ...], int, int
]  # name, dtype, shape, offset in the data section, nbytes


def _entry(name: str, e: Any) -> Entry:
    """One tensor table entry, checked; ValueError saying what is wrong."""
    if not isinstance(e, dict):
        raise ValueError(f"it is {short(e)}, not an object")
    missing = [k for k in ("dtype", "shape", "offset", "nbytes") if k not in e]
    if missing:
        raise ValueError(f"it lacks '{missing[0]}'")
    dtype, shape, offset, nbytes = e["dtype"], e["shape"], e["offset"], e["nbytes"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(
            f"it has the dtype {short(dtype)}; edgetrain files store {', '.join(sorted(DTYPES))}"
        )
    dt = np.dtype(dtype).newbyteorder("<")
    size = declared_nbytes(shape, dt.itemsize)
    if type(offset) is not int or offset < 0 or offset % ALIGN:
        raise ValueError(f"it has the offset {short(offset)}, not an int >= 0 and a multiple of {ALIGN}")
    if type(nbytes) is not int or nbytes != size:
        raise ValueError(
            f"it says {short(nbytes)} bytes, but its shape {short(shape)} of {dtype} makes {size}"
        )
    return name, dt, tuple(shape), offset, nbytes


def _parse_table(path: str, raw: bytes, max_header: int) -> tuple[dict, list[Entry]]:
    """(caller's header, tensors sorted by offset); the offsets must be exactly the writer's layout (each tensor
    at the next multiple of ALIGN after the one before), so that any damage to the table shows as corruption and
    no two tensors share a byte."""
    top = parse_json(path, _inflate(path, raw, max_header), what="header", max_bytes=max_header)
    if not (
        isinstance(top, dict) and isinstance(top.get("header"), dict) and isinstance(top.get("tensors"), dict)
    ):
        raise _fail(path, "is corrupt: its header lacks the 'header' and 'tensors' entries")
    entries = []
    for name, e in top["tensors"].items():
        try:
            entries.append(_entry(name, e))
        except ValueError as err:
            raise _fail(
                path, f"is corrupt: its tensor table entry for {short(name)} is wrong: {err}"
            ) from None
    entries.sort(key=lambda t: t[3])
    end = 0
    for name, _, _, offset, nbytes in entries:
        if offset != _align(end):
            raise _fail(
                path,
                f"is corrupt: the tensor table places {short(name)} inconsistently ({offset=}, {nbytes=}; "
                f"the tensor before it ends at {end})",
            )
        end = offset + nbytes
    return top["header"], entries


def _size_problem(path: str, size: int, data_start: int, entries: list[Entry]) -> ArtifactError | None:
    """The error when the file is shorter or longer than its tensor table says, else None."""
    data_len = entries[-1][3] + entries[-1][4] if entries else 0
    expected = data_start + data_len + CHECKSUM_BYTES
    if size < expected:
        cut = next(((n, o, b) for n, _, _, o, b in entries if data_start + o + b > size), None)
        where = (
            f"tensor {short(cut[0])} needs bytes {data_start + cut[1]}..{data_start + cut[1] + cut[2]}"
            if cut
            else f"its {CHECKSUM_BYTES}-byte checksum should end at byte {expected}"
        )
        return _fail(
            path,
            f"is truncated: {where} but the file ends at byte {size} (a complete file is {expected} bytes); "
            "the write or copy was cut short: write or copy it again",
        )
    if size > expected:
        return _fail(
            path,
            f"is corrupt: it has {size - expected} bytes after its end at byte {expected} (appended to, or two "
            "files joined?)",
        )
    return None


def _checksum_failure(path: str, mm: mmap.mmap, size: int, hlen: int, max_header: int) -> ArtifactError:
    """The error for a file whose checksum does not match: truncation or extra bytes when its table (parsed for
    the message only, within a smaller bound: _DIAGNOSIS_BYTES) says so, an undecodable header, else the
    checksum."""
    bound = min(max_header, _DIAGNOSIS_BYTES)
    try:
        if hlen > bound:
            raise ArtifactLimitError("too large to diagnose")
        _, entries = _parse_table(path, mm[_PREAMBLE.size : _PREAMBLE.size + hlen], bound)
    except ArtifactLimitError:
        entries = None
    except ArtifactError as e:
        return e
    if entries is not None:
        problem = _size_problem(path, size, _align(_PREAMBLE.size + hlen), entries)
        if problem is not None:
            return problem
    return _fail(
        path,
        "is corrupt: its SHA-256 checksum does not match its contents (damaged on disk or in transfer); "
        "copy it again or re-create it",
    )


def _read_v1(f: BinaryIO, path: str, size: int, hlen: int, verify: bool, max_header: int):
    """Format 1: see the module docstring. Returns (caller's header, tensors). Nothing in the header is read
    before the checksum is verified (verify=True); either way every size is bounded before it is used."""
    if hlen > max_header:
        raise ArtifactLimitError(
            f"'{path}' declares a {hlen}-byte header, more than the {max_header} edgetrain reads "
            "(max_header_bytes=); the file is corrupt or hostile (a real header is a few MB at most)",
            limit=max_header,
            needed=hlen,
            path=path,
        )
    if _PREAMBLE.size + hlen > size:
        raise _fail(
            path,
            f"is truncated: its header should be {hlen} bytes but only {size - _PREAMBLE.size} bytes follow the "
            "preamble; write or copy it again",
        )
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if verify and not _checksum_matches(mm, size):
            raise _checksum_failure(path, mm, size, hlen, max_header)
        header, entries = _parse_table(path, mm[_PREAMBLE.size : _PREAMBLE.size + hlen], max_header)
        data_start = _align(_PREAMBLE.size + hlen)
        problem = _size_problem(path, size, data_start, entries)
        if problem is not None:
            raise problem
    except BaseException:
        _close(mm)
        raise
    tensors: dict[str, np.ndarray] = {}
    for name, dt, shape, offset, nbytes in entries:
        if nbytes:
            a = np.frombuffer(mm, dtype=dt, count=nbytes // dt.itemsize, offset=data_start + offset).reshape(
                shape
            )
        else:
            a = np.zeros(shape, dt)
            a.flags.writeable = False
        tensors[name] = a
    if not any(nbytes for *_, nbytes in entries):
        _close(mm)
    return header, tensors


_READERS = {1: _read_v1}
assert tuple(_READERS) == SUPPORTED_VERSIONS and CURRENT_VERSION in SUPPORTED_VERSIONS


def read_container(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    verify: bool = True,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Reads an edgetrain file: (the header dict given to write_container, {name: array}).

    The arrays are read-only views of one memory map of the file (zero-copy; the map lives as long as they do),
    in the order written. kind, when given, must match the file's; verify checks the SHA-256 checksum (reading the
    file once, in chunks) before anything else is read; verify=False skips it (faster; damage inside a tensor then
    goes unnoticed) but bounds and checks the header all the same. max_header_bytes bounds the header, compressed
    and inflated. Temporary files that killed writers of path left are removed first. Reads every format version
    listed in SUPPORTED_VERSIONS. A bad file is an ArtifactError (ArtifactLimitError past a bound), a missing or
    unreadable one a StorageError (MissingFileError)."""
    path = os.fspath(path)
    if kind is not None and kind not in KINDS:
        raise ArtifactError(f"cannot read '{path}': unknown kind '{kind}'; kinds: {', '.join(KINDS)}")
    remove_stale_temporaries(path)
    with _open(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            version, kind_code, hlen = _preamble(f, path, size)
            header, tensors = _READERS[version](f, path, size, hlen, verify, max_header_bytes)
        except StorageError:
            raise
        except OSError as e:  # an I/O error midway, a file that cannot be mapped
            raise StorageError.of(e, path, "cannot read") from e
    found = _known_kind(path, kind_code)
    if kind is not None and found != kind:
        raise _fail(
            path,
            f"is {_describe_kind(found)}, not {_describe_kind(kind)}; pass "
            f"{'a training artifact made by `edgetrain convert`' if kind == 'artifact' else 'a checkpoint file'}",
        )
    return header, tensors


def _known_kind(path: str, kind_code: int) -> str:
    found = _kind_name(kind_code)
    if found is None:
        raise _fail(
            path,
            f"is of kind code {kind_code}, which this edgetrain does not know "
            f"({', '.join(f'{k}={c}' for k, c in KINDS.items())}); upgrade edgetrain",
        )
    return found


def file_kind(path: str | os.PathLike) -> str:
    """The kind of the edgetrain file at path ("artifact" or "checkpoint"), from its 24-byte preamble alone (no
    header read, no checksum); the errors read_container gives for a file that is none (missing, foreign,
    truncated, of a newer format or an unknown kind)."""
    path = os.fspath(path)
    with _open(path) as f:
        try:
            _, kind_code, _ = _preamble(f, path, os.fstat(f.fileno()).st_size)
        except StorageError:
            raise
        except OSError as e:
            raise StorageError.of(e, path, "cannot read") from e
    return _known_kind(path, kind_code)


def inspect_container(path: str | os.PathLike, *, max_header_bytes: int = MAX_HEADER_BYTES) -> dict[str, Any]:
    """What a file holds, without verifying or mapping tensors: format version, kind, sizes, header, and the
    tensor table (for `edgetrain inspect` and size reports). The header is bounded as read_container bounds it."""
    path = os.fspath(path)
    with _open(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            version, kind_code, hlen = _preamble(f, path, size)
            if hlen > max_header_bytes:
                raise ArtifactLimitError(
                    f"'{path}' declares a {hlen}-byte header, more than the {max_header_bytes} edgetrain reads "
                    "(max_header_bytes=)",
                    limit=max_header_bytes,
                    needed=hlen,
                    path=path,
                )
            if _PREAMBLE.size + hlen > size:
                raise _fail(
                    path, f"is truncated: its header should be {hlen} bytes, the file has {size} in all"
                )
            header, entries = _parse_table(path, f.read(hlen), max_header_bytes)
        except StorageError:
            raise
        except OSError as e:  # an I/O error midway, a file that cannot be mapped
            raise StorageError.of(e, path, "cannot read") from e
    data_start = _align(_PREAMBLE.size + hlen)
    tensor_bytes = sum(e[4] for e in entries)
    return {
        "version": version,
        "kind": _kind_name(kind_code) or f"unknown ({kind_code})",
        "size": size,
        "preamble_bytes": _PREAMBLE.size,
        "header_bytes": hlen,
        "data_start": data_start,
        "tensor_bytes": tensor_bytes,
        "padding_bytes": size - _PREAMBLE.size - hlen - tensor_bytes - CHECKSUM_BYTES,
        "checksum_bytes": CHECKSUM_BYTES,
        "header": header,
        "tensors": {
            n: {"dtype": dt.name, "shape": list(s), "offset": data_start + o, "nbytes": b}
            for n, dt, s, o, b in entries
        },
    }
