"""The memory map an edgetrain file is read through (container.py): its SHA-256 checksum verified a chunk at a
time, each chunk's pages dropped once hashed (verifying a large file does not hold it all); the map closed once no
array views it; and its pages released once what the arrays hold has been copied out."""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Iterable

import numpy as np

CHECKSUM_BYTES = 32
# bytes read, hashed or scanned at a time (a whole number of pages: the checksum drops each chunk's)
_CHUNK = 1 << 20


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


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # an array still views it: the map closes with the last of them
        pass


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
