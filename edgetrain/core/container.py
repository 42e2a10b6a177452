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
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO

import numpy as np

from .errors import ArtifactError, ArtifactLimitError, MissingFileError, StorageError

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
CHECKSUM_BYTES = 32
_PREAMBLE = struct.Struct("<8sIIQ")  # magic, version, kind code, header length: 24 bytes
# Fixed-size numeric dtypes only: no Python objects, strings, datetimes or platform-sized long double.
DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)
_CHUNK = 1 << 20
# The most header bytes a file may have, compressed and inflated (JSON text). A real header is far smaller (a
# ResNet-50 training artifact's: 77 KB compressed, 0.6 MB of JSON); a caller can raise it (max_header_bytes=).
MAX_HEADER_BYTES = 64 << 20
# JSON costs up to ~40x its text in Python objects ("[[],[],...]"), so the header's items (values and containers)
# are bounded too, at max_header_bytes // HEADER_BYTES_PER_ITEM (1M by default; ResNet-50's header has 60k, ~10 B
# each): a hostile header costs at most a few hundred MB however it is built.
HEADER_BYTES_PER_ITEM = 64
# A file whose checksum fails is not trusted further: its header is parsed only to say whether it was cut short,
# and only when it is at most this big (larger, the message is the checksum's).
_DIAGNOSIS_BYTES = 8 << 20
MAX_JSON_DEPTH = 64  # nesting of the header's JSON; real headers nest 6 deep
MAX_DIMS = 32  # numpy 1.24's limit on an array's dimensions


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


def _temp_name(directory: str, base: str) -> str:
    return os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _temp_pattern(base: str) -> re.Pattern:
    """The temporary files of _temp_name for base: .BASE.PID.HEX8.tmp."""
    return re.compile(rf"\.{re.escape(base)}\.(\d{{1,10}})\.[0-9a-f]{{8}}\.tmp")


def _writer_alive(pid: int) -> bool:
    """Whether process pid may still be writing (signal 0 asks without signalling). A pid that is ours, exists or
    cannot be asked about counts as alive: only a temporary file whose writer is certainly gone is removed."""
    if pid == os.getpid():
        return True
    if not 0 < pid < 2**31:
        return False  # no process ever had it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process, alive
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Removes the temporary files that writers of path killed midway left beside it (.NAME.PID.HEX.tmp, see
    _replace_atomically) whose writer process is gone; a live writer's (ours, or another process's) stays.
    Returns the paths removed. Best effort: a file that cannot be listed or removed is left. POSIX only (elsewhere
    a process cannot be asked whether it lives without being signalled). A writer in another PID namespace
    sharing the folder (another container) would look gone: do not share checkpoint folders across them."""
    if os.name != "posix":
        return []
    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = _temp_pattern(base)
    removed = []
    try:
        with os.scandir(directory) as entries:
            stale = [
                e.path
                for e in entries
                if e.name.startswith(f".{base}.")
                and (m := pattern.fullmatch(e.name))
                and not _writer_alive(int(m.group(1)))
            ]
    except OSError:
        return []
    for tmp in stale:
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except OSError:
            pass
    return removed


def _create_temp(path: str) -> tuple[int, str]:
    """A new file beside path (same directory, so os.replace is atomic), created with the usual permissions.
    OSError (a missing, read-only or forbidden folder) propagates: the caller names path."""
    directory, base = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = _temp_name(directory, base)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise ArtifactError(f"cannot write '{path}': could not create a temporary file in {directory}")


def _fsync_dir(path: str) -> None:
    """Makes the rename durable; some systems (Windows) cannot open a directory, which is fine there."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace_atomically(path: str, fill: Callable[[BinaryIO], None], what: str = "") -> None:
    """fill() writes a temp file beside path, which is fsynced and renamed over path, and the directory fsynced:
    a crash at any instant leaves the old file or the new one, whole. On an error the temp file is removed. A
    file-system failure (missing, read-only or forbidden folder, full disk) is a StorageError naming path (not
    the temp file); `what` names the kind of file in its message ("the checkpoint"). Temporary files of path
    that killed writers left are removed first."""
    doing = f"cannot write {what}".rstrip()
    remove_stale_temporaries(path)
    try:
        fd, tmp = _create_temp(path)
    except OSError as e:
        raise StorageError.of(e, path, doing) from e
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise StorageError.of(e, path, doing) from e
        raise
    _fsync_dir(path)


def atomic_write(path: str | os.PathLike, data: bytes) -> int:
    """Writes bytes to path atomically (see _replace_atomically); returns the size. A file-system failure is a
    StorageError naming path."""
    _replace_atomically(os.fspath(path), lambda f: f.write(data))
    return len(data)


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


def _fail(path: str, what: str) -> ArtifactError:
    return ArtifactError(f"'{path}' {what}")


def short(value: Any, n: int = 60) -> str:
    """repr(value), cut to about n characters: messages quote what a hostile file holds without its megabytes."""
    text = repr(value)
    return text if len(text) <= n else f"{text[: n - 5]}...{text[-2:]}"


def declared_nbytes(shape: Any, itemsize: int) -> int:
    """The bytes of an array of `shape` (a list of ints >= 0, at most MAX_DIMS of them) and itemsize, as a file
    declares them; ValueError saying what is wrong when the shape is not one or its bytes are more than any array
    can have (2**63, numpy's bound: the product of the non-zero dimensions times the itemsize)."""
    if not isinstance(shape, (list, tuple)):
        raise ValueError(f"its shape {short(shape)} is not a list of ints")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"its shape has {len(shape)} dimensions, more than {MAX_DIMS}")
    count, addressed = 1, itemsize
    for d in shape:
        if type(d) is not int or d < 0:
            raise ValueError(f"its shape {short(shape)} has the dimension {short(d)}, not an int >= 0")
        count *= d
        addressed *= max(d, 1)
        if addressed >= 2**63:
            raise ValueError(
                f"its shape {short(shape)} makes more than 2**63 bytes, more than any array holds"
            )
    return count * itemsize


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


# ---- the header: bounded inflation, bounded JSON -------------------------------------------------------------
# A JSON string, escapes included; the closing quote is optional so that an unterminated string runs to the end
# of the text (as the parser reads it) in one match: required, each later quote would start a new attempt over
# the rest of the text, quadratic in the number of quotes.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_ALL_BUT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def _inflate(path: str, data: bytes, limit: int) -> bytes:
    """The zlib stream `data`, inflated in one bounded call: never more than limit + 1 bytes are made."""
    d = zlib.decompressobj()
    try:
        text = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise _fail(path, f"is corrupt: its header does not decode ({e}); the file was damaged") from None
    if len(text) > limit or d.unconsumed_tail:
        raise ArtifactLimitError(
            f"'{path}': its {len(data)}-byte header inflates to more than {limit} bytes, the most edgetrain "
            "reads (max_header_bytes=); the file is corrupt or hostile (a real header is a few MB at most)",
            limit=limit,
            needed=limit + 1,
            path=path,
        )
    if not d.eof or d.unused_data:
        what = (
            "ends before its compressed stream does" if not d.eof else "has bytes after its compressed stream"
        )
        raise _fail(path, f"is corrupt: its header does not decode (it {what}); the file was damaged")
    return text


def json_shape(text: bytes) -> tuple[int, int]:
    """(deepest nesting, items) of JSON text, without parsing it: strings are cut out (a bracket or comma in
    a string counts for nothing), then brackets are counted. Items are the values separated by commas plus the
    containers, an upper bound of the Python objects json.loads would make (but for keys). Exact for valid JSON;
    for text that is not JSON it may say more than the parser would meet before failing, never less."""
    bare = _STRING.sub(b"", text)
    items = bare.count(b",") + bare.count(b"[") + bare.count(b"{")
    brackets = np.frombuffer(bare.translate(None, _ALL_BUT_BRACKETS), np.uint8)
    del bare
    depth = deepest = 0
    for start in range(0, len(brackets), _CHUNK):
        # '[' 0x5B and '{' 0x7B have bit 1 set, ']' 0x5D and '}' 0x7D do not: +1 opens, -1 closes
        run = np.cumsum((brackets[start : start + _CHUNK] & 2).astype(np.int64) - 1) + depth
        deepest, depth = max(deepest, int(run.max())), int(run[-1])
    return deepest, items


# An integer of more digits is beyond any float, and any size, count or setting a file holds: code that reads it
# as a number would fail with an OverflowError far from here.
MAX_INT_DIGITS = 300


class _HugeInt:
    """Where json.loads met an integer of more than MAX_INT_DIGITS digits (found again by _where_huge)."""

    def __init__(self, digits: int):
        self.digits = digits


def _where_huge(value: Any, at: str = "") -> tuple[str, _HugeInt] | None:
    """The path ('header.optimizer.lr') of the first _HugeInt in a parsed JSON value, and it."""
    if isinstance(value, _HugeInt):
        return at, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _where_huge(v, f"{at}[{k}]" if isinstance(k, int) else f"{at}.{k}" if at else str(k))
        if found is not None:
            return found
    return None


def parse_json(path: str, text: bytes, *, what: str, max_bytes: int) -> Any:
    """Bounded json.loads of UTF-8 text: at most max_bytes, max_bytes // HEADER_BYTES_PER_ITEM items,
    MAX_JSON_DEPTH deep, integers of at most MAX_INT_DIGITS digits. ArtifactError (ArtifactLimitError for a
    bound) naming path. NaN and Infinity (which the writer never writes) read as floats: the fields that hold
    numbers are checked where they are used."""
    if len(text) > max_bytes:
        raise ArtifactLimitError(
            f"'{path}': its {what} is {len(text)} bytes of JSON, more than the {max_bytes} edgetrain reads "
            "(max_header_bytes=)",
            limit=max_bytes,
            needed=len(text),
            path=path,
        )
    max_items = max(max_bytes // HEADER_BYTES_PER_ITEM, 1)
    strings = text.count(b'"') // 2  # keys and string values (escaped quotes count too: an upper bound)
    if strings > 2 * max_items:  # each is a Python object; bounded before the scan, whose cost is per string
        raise ArtifactLimitError(
            f"'{path}': its {what} holds about {strings} JSON strings, more than the {2 * max_items} edgetrain "
            f"reads (2 per {HEADER_BYTES_PER_ITEM} bytes of max_header_bytes=); the file is corrupt or hostile",
            limit=2 * max_items,
            needed=strings,
            path=path,
        )
    depth, items = json_shape(text)
    if depth > MAX_JSON_DEPTH:
        raise _fail(
            path,
            f"is corrupt: its {what} nests {depth} levels deep; edgetrain files nest at most {MAX_JSON_DEPTH}",
        )
    if items > max_items:
        raise ArtifactLimitError(
            f"'{path}': its {what} holds {items} JSON items, more than the {max_items} edgetrain reads "
            f"(1 per {HEADER_BYTES_PER_ITEM} bytes of max_header_bytes=); the file is corrupt or hostile",
            limit=max_items,
            needed=items,
            path=path,
        )
    huge: list[_HugeInt] = []

    def bounded_int(digits: str) -> Any:
        n = len(digits.lstrip("-"))
        if n > MAX_INT_DIGITS:
            huge.append(_HugeInt(n))
            return huge[-1]
        return int(digits)

    try:
        value = json.loads(text.decode("utf-8"), parse_int=bounded_int)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(
            path, f"is corrupt: its {what} does not decode ({short(str(e), 200)}); the file was damaged"
        ) from None
    if huge:
        where, first = _where_huge(value) or ("?", huge[0])
        raise _fail(
            path,
            f"is corrupt: its {what} holds an integer of {first.digits} digits at {short(where, 200)}, beyond "
            f"any number an edgetrain file holds (at most {MAX_INT_DIGITS} digits); it is damaged or hostile",
        )
    return value


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


def _checksum_matches(mm: mmap.mmap, size: int) -> bool:
    """Whether the last CHECKSUM_BYTES are the SHA-256 of every byte before them (read in chunks, each chunk's
    pages dropped from this process's resident memory once hashed: verifying a large file does not hold it all)."""
    if size < CHECKSUM_BYTES:
        return False
    h = hashlib.sha256()
    end = size - CHECKSUM_BYTES
    drop = getattr(mmap, "MADV_DONTNEED", None)
    with memoryview(mm) as view:
        for start in range(0, end, _CHUNK):
            h.update(view[start : min(start + _CHUNK, end)])
            if drop is not None and start + _CHUNK < end:  # _CHUNK is a whole number of pages
                try:
                    mm.madvise(drop, start, _CHUNK)
                except (AttributeError, OSError, ValueError):
                    drop = None
        stored = bytes(view[end:size])
    return h.digest() == stored


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


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # an array still views it: the map closes with the last of them
        pass


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


def release_pages(arrays: Iterable[np.ndarray]) -> int:
    """Drops from this process's resident memory the file pages that arrays read_container returned have brought in
    (the checksum reads every page; copying parameters out of the map reads theirs again): the OS keeps them in
    its page cache and maps one back when an array next touches it, so a frozen weight read in place still works,
    but the process's RSS no longer counts pages it holds its own copy of. Returns how many maps were released; 0
    where the platform has no madvise (Windows)."""
    maps: dict[int, mmap.mmap] = {}
    for a in arrays:
        base = a
        while base is not None and not isinstance(base, mmap.mmap):
            base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
        if base is not None:
            maps[id(base)] = base
    done = 0
    for mm in maps.values():
        try:
            mm.madvise(mmap.MADV_DONTNEED)
            done += 1
        except (AttributeError, OSError, ValueError):  # no madvise here, or the map is closed
            pass
    return done


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
