"""What an untrusted edgetrain file declares, read within bounds (numpy only): the dtypes a file may store, an
array's bytes from its declared shape (within numpy's limits), and the header, its zlib stream inflated within a
limit and its JSON measured (nesting, items) before it is parsed; `short` quotes what a hostile file holds without
its megabytes. The container reader (container.py), the graph deserializer (serialize.py), the memory plan check
(plan.py) and the runtime's artifact checks read through them."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

import numpy as np

from .errors import ArtifactError, ArtifactLimitError
from .mapped import _CHUNK

# Fixed-size numeric dtypes only: no Python objects, strings, datetimes or platform-sized long double.
DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)
# JSON costs up to ~40x its text in Python objects ("[[],[],...]"), so the header's items (values and containers)
# are bounded too, at max_header_bytes // HEADER_BYTES_PER_ITEM (1M by default; ResNet-50's header has 60k, ~10 B
# each): a hostile header costs at most a few hundred MB however it is built.
HEADER_BYTES_PER_ITEM = 64
MAX_JSON_DEPTH = 64  # nesting of the header's JSON; real headers nest 6 deep
MAX_DIMS = 32  # numpy 1.24's limit on an array's dimensions


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
