"""Files crafted byte by byte, as a hostile or damaged file would be: a container's preamble, header, tensor data
and SHA-256 as edgetrain.core.container's docstring lays them out, from parts the tests choose, with none of the
writer's checks (a NaN or an infinity in the header, a table that lies about its tensors)."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from edgetrain.core.container import ALIGN, KINDS, MAGIC


def container_bytes(
    top: Any = None,
    data: bytes = b"",
    *,
    kind: str = "artifact",
    text: bytes | None = None,
    zheader: bytes | None = None,
    checksum: str = "valid",
) -> bytes:
    """Preamble + header + padding + data + SHA-256, from the parts given, checked for nothing: `top` is the
    JSON object {"header": ..., "tensors": table} (or `text` its JSON bytes, or `zheader` the compressed header
    itself). checksum="wrong" flips the digest's bits. The string "__1e400__" is written as the number 1e400
    (which Python's JSON reads as infinity, and json.dumps cannot write)."""
    if zheader is None:
        if text is None:
            text = json.dumps(top, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            text = text.replace(b'"__1e400__"', b"1e400")
        zheader = zlib.compress(text, 9)
    head = MAGIC + struct.pack("<IIQ", 1, KINDS.get(kind, 9), len(zheader)) + zheader
    body = head + bytes(-len(head) % ALIGN) + data
    digest = hashlib.sha256(body).digest()
    if checksum == "wrong":
        digest = bytes(b ^ 0xFF for b in digest)
    return body + digest


def encode(
    header: Any,
    tensors: dict[str, np.ndarray],
    *,
    kind: str = "artifact",
    table: Callable[[dict], Any] | None = None,
) -> bytes:
    """(header, tensors) laid out as the writer lays them out, with a valid checksum, but without the writer's
    checks; table(t), when given, edits the tensor table (or returns a new one) before it is encoded."""
    entries, data = {}, bytearray()
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = a.dtype.newbyteorder("<")
        data += bytes(-len(data) % ALIGN)
        raw = a.astype(dt).tobytes()
        entries[name] = {"dtype": dt.name, "shape": list(a.shape), "offset": len(data), "nbytes": len(raw)}
        data += raw
    if table is not None:
        edited = table(entries)
        entries = edited if isinstance(edited, dict) else entries
    return container_bytes({"header": header, "tensors": entries}, bytes(data), kind=kind)


DELETE = object()  # crafted()'s value that deletes the key instead of setting it


def crafted(header: dict, path: tuple, value: Any) -> dict:
    """A copy of a header with the value at `path` (keys and list positions) replaced by `value`, or deleted."""
    out = copy.deepcopy(header)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(value)
    return out
