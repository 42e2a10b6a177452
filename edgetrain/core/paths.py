"""Where a command may write: never over a file it reads, never twice over one file, never inside a folder it
fills (an input in there would be written over or mixed with its files), and over an existing file only when that
file is of the kind being written (a checkpoint replaces a checkpoint, never an artifact, an ONNX model or data).
Paths are compared as the files they name (real paths, and the same inode), so `m.onnx`, `./m.onnx`, its absolute
path, a symlink to it and a hard link all are one file, and a name differing in case is one on a file system that
ignores case. Each refusal is a UsageError of one line naming both paths, raised before the command reads or
writes anything. The command line (edgetrain.cli) and the phone app (android_demo) call it; it lives in the core,
which both may import.

    outputs_apart(inputs=[("the model", "m.onnx")], outputs=[("-o", "m.etrain"), ("--emit-onnx", None)],
                  command="convert")
    replaceable("m.etrain", "artifact", option="-o", command="convert")
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from .container import MAGIC, file_kind
from .errors import EdgeTrainError, UsageError

# (what the path is on the command line, e.g. "--data" or "the model", the path); a None path was not given
Named = tuple[str, "str | os.PathLike | None"]

# What a command writes -> the kinds of existing file it may replace (any kind may replace an empty file)
REPLACES = {
    "artifact": {"artifact"},
    "checkpoint": {"checkpoint"},
    "adapters": {"adapters"},
    "onnx": {"other"},  # an ONNX model has no magic bytes: a file of no kind recognized here
    "onnx_adapter": {"other"},
    "history": {"json"},  # a training history: JSON lines
    "plot": {"png"},
    "json": {"json"},
    "folder": {"folder"},
}
WRITTEN = {
    "artifact": "a training artifact",
    "checkpoint": "a checkpoint",
    "adapters": "an adapter file",
    "onnx": "an ONNX model",
    "onnx_adapter": "an onnxruntime adapter file",
    "history": "the training history",
    "plot": "a PNG plot",
    "json": "a JSON summary",
    "folder": "its files",
}
FOUND = {
    "artifact": "a training artifact (.etrain)",
    "checkpoint": "a checkpoint (.etck)",
    "adapters": "an edgetrain adapter file (.etad)",
    "edgetrain": "an edgetrain file that this edgetrain cannot read (damaged, or of a newer version)",
    "png": "a PNG image",
    "numpy": "a numpy array file (.npy)",
    "zip": "a zip archive (an .npz of data, for one)",
    "gzip": "a gzip file (compressed data)",
    "sqlite": "an SQLite database",
    "json": "a JSON file",
    "text": "a text file (CSV data, for one)",
    "other": "a file of another kind (an ONNX model or data, for one)",
    "folder": "a folder",
}
_MAGICS = {
    b"\x89PNG\r\n\x1a\n": "png",
    b"\x93NUMPY": "numpy",
    b"PK\x03\x04": "zip",
    b"PK\x05\x06": "zip",  # an empty zip archive (an .npz of no arrays)
    b"\x1f\x8b": "gzip",
    b"SQLite format 3\x00": "sqlite",
}
_SNIFF = 512  # bytes read to tell a file's kind
_SEARCHED = 100_000  # files of a folder searched for another name of a hard-linked input


def shown(path: str | os.PathLike) -> str:
    """A path as a message shows it: as given, or quoted when it holds characters that would break the line."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return text if text.isprintable() else repr(text)


def _real(path: str | os.PathLike) -> str:
    """The real path (symlinks and `.` resolved); a path no file can have (a NUL in it) as it is, made absolute."""
    try:
        return os.path.realpath(path)
    except ValueError:
        return os.path.abspath(path)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same real path (symlinks and `.` resolved), or, both existing, the
    same inode (a hard link, a name in another case on a file system that ignores case)."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (or holds a NUL): no file to share
        return False


def within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether path is folder or lies inside it, compared as same_file compares (each folder above path's real
    path is compared with folder), or is a hard link to a file in it (which a write in there would change)."""
    here = _real(path)
    while True:
        if same_file(here, folder):
            return True
        parent = os.path.dirname(here)
        if parent == here:
            return _linked_into(path, folder)
        here = parent


def _linked_into(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether path is a file with other names (hard links), one of them in folder: searched only then, and in the
    first _SEARCHED entries of the folder (a larger one is left unsearched)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2 or not os.path.isdir(folder):
            return False
    except (OSError, ValueError):
        return False
    seen = 0
    for root, _, files in os.walk(folder):
        for name in files:
            seen += 1
            if seen > _SEARCHED:
                return False
            try:
                other = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


def _both(a: str | os.PathLike, b: str | os.PathLike) -> str:
    """Why two paths given differently are one file, for the message: " (both are /real/path)", or what two real
    paths that are one file are."""
    if os.fspath(a) == os.fspath(b):
        return ""
    real_a, real_b = _real(a), _real(b)
    if real_a == real_b:
        return f" (both are {shown(real_a)})"
    return f" ({shown(real_a)} and {shown(real_b)} are one file: hard links, or names differing only in case)"


def outputs_apart(
    *,
    inputs: Iterable[Named] = (),
    outputs: Iterable[Named] = (),
    places: Iterable[Named] = (),
    command: str,
) -> None:
    """Refuses (a UsageError naming both paths) an output that is one of the inputs, two outputs that are one
    file, and an input or output that is, or lies inside, one of the `places`: the files and folders a command
    writes in a folder an option chose (("--out", "OUT/clients"): the federation's clients' homes). Paths that
    are None were not given and are left out."""
    ins = [(label, p) for label, p in inputs if p is not None]
    outs = [(label, p) for label, p in outputs if p is not None]
    for k, (label, path) in enumerate(outs):
        for other, other_path in outs[:k]:
            if same_file(path, other_path):
                raise UsageError(
                    f"{other} {shown(other_path)} and {label} {shown(path)} are the same {_what(path)}"
                    f"{_both(other_path, path)}: {command} would write both there; give them different paths"
                )
        for source, source_path in ins:
            if same_file(path, source_path):
                raise UsageError(
                    f"{label} {shown(path)} and {source} {shown(source_path)} are the same {_what(path)}"
                    f"{_both(path, source_path)}: {command} reads {source} and would write "
                    f"{'into' if _what(path) == 'folder' else 'over'} it; give {_option(label)} another path"
                )
    for option, place in ((label, p) for label, p in places if p is not None):
        for label, path in [*ins, *outs]:
            if within(path, place):
                raise UsageError(
                    f"{label} {shown(path)} {_where(path, place)} where {command} writes its own files ({option}): "
                    f"put {label} elsewhere, or give another {option}"
                )


def _where(path: str | os.PathLike, place: str | os.PathLike) -> str:
    """How path stands to a place a command writes: "is", "is PLACE (both are ...),", "lies in PLACE," or "is a
    hard link to a file in PLACE,"."""
    if same_file(path, place):
        return "is" if os.fspath(path) == os.fspath(place) else f"is {shown(place)}{_both(path, place)},"
    if _linked_into(path, place) and not within(os.path.dirname(_real(path)), place):
        return f"is a hard link to a file in {shown(place)},"
    return f"lies in {shown(place)},"


def _option(label: str) -> str:
    """The option that chooses a path, from its label: "--checkpoint's best checkpoint" -> "--checkpoint"."""
    return next((w.removesuffix("'s") for w in label.split() if w.startswith("-")), label)


def _what(path: str | os.PathLike) -> str:
    return "folder" if os.path.isdir(path) else "file"


def found_kind(path: str | os.PathLike) -> str | None:
    """The kind of what is at path (a key of FOUND, "empty", or None when nothing is there or it cannot be read),
    from its first bytes: an edgetrain file's kind from its preamble (edgetrain.core.container.file_kind)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            return "folder"
        if not stat.S_ISREG(mode):  # a device or a pipe (--log /dev/stdout): read, it would wait or take data
            return None
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except (OSError, ValueError):  # nothing there, or unreadable: the write itself reports what it meets
        return None
    if not head:
        return "empty"
    if head.startswith(MAGIC[: min(len(head), len(MAGIC))]):
        try:
            return file_kind(path)
        except EdgeTrainError:
            return "edgetrain"
    for magic, kind in _MAGICS.items():
        if head.startswith(magic):
            return kind
    return _text_kind(head)


def _text_kind(head: bytes) -> str:
    """ "json" for text that opens a JSON object or array, "text" for other text, "other" for binary bytes."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not a character cut at the end of the bytes read
            return "other"
        text = head[: e.start].decode("utf-8")
    if not all(c.isprintable() or c in "\t\n\r\f\v" for c in text):
        return "other"
    return "json" if text.lstrip().startswith(("{", "[")) else "text"


def replaceable(
    path: str | os.PathLike | None, kind: str, *, option: str, command: str, overwrite: bool = False
) -> None:
    """Refuses (a UsageError naming the path and what it holds) to write `kind` (a key of REPLACES) at a path that
    holds a file of another kind; nothing there, an empty file, or a file of the same kind may be written.
    overwrite: the command's --overwrite was given (the message says it replaces only the same kind)."""
    if path is None:
        return
    found = found_kind(path)
    if found is None or found in REPLACES[kind] or (found == "empty" and kind != "folder"):
        return
    what = "a file (empty)" if found == "empty" else FOUND[found]
    if found == "folder":
        raise UsageError(
            f"{option} {shown(path)} is a folder: {command} writes {WRITTEN[kind]} to a file; give {_option(option)} a "
            "file's path"
        )
    if kind == "folder":
        raise UsageError(
            f"{option} {shown(path)} is {what}, not a folder: give {option} a folder or a new name"
        )
    note = f" (--overwrite replaces only {WRITTEN[kind]})" if overwrite else ""
    raise UsageError(
        f"{option} {shown(path)} is {what}: {command} writes {WRITTEN[kind]} there and would replace it{note}; "
        f"give {_option(option)} a new path, or one that holds {WRITTEN[kind]}"
    )
