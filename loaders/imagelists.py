"""Image list files -> an IDataView: ImageListView reads a CSV of path,label rows or a JSON list of paths and
labels, each path relative to the list's folder; image_list_kind tells, from a text file's first bytes, whether it
is such a list."""

from __future__ import annotations

import csv
import io
import json
import numbers
import os
import re

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .imagedecode import IMAGE_MAX_BYTES, IMAGE_MAX_PIXELS
from .imagelayout import IMAGE_EXTENSIONS, is_image_name
from .images import IMAGE_MAX_CLASSES, ImageFilesView, _classes_argument
from .limits import CSV_MAX_BYTES, limit_argument, read_capped, size_text
from .values import bounded_json

_PATH_COLUMNS = ("path", "file", "filename", "file_name", "filepath", "image", "image_path", "img")
_LABEL_COLUMNS = ("label", "labels", "class", "target", "y", "category")


def _list_text(path: str, max_bytes: int) -> str:
    """The text of a list file (UTF-8, a byte order mark dropped), at most max_bytes."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise DataLimitError(
                f"{path}: a list file of {size_text(size)}, more than the {size_text(max_bytes)} allowed (pass "
                f"max_bytes= to allow more)",
                path,
                limit=max_bytes,
                needed=size,
            )
        with open(path, "rb") as f:  # by chunks: read(max_bytes + 1) allocated 256 MiB for a list of 1 KiB
            raw, over = read_capped(f, max_bytes)
        if over:  # it grew since
            raise DataLimitError(
                f"{path}: a list file of more than {size_text(max_bytes)} (pass max_bytes= to allow more)",
                path,
                limit=max_bytes,
            )
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})", path) from e
    try:
        return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file (not UTF-8 at byte {e.start})", path) from e


def _column(names: list[str], wanted: tuple[str, ...], default: int) -> int:
    low = [n.strip().lower() for n in names]
    return next((k for k, n in enumerate(low) if n in wanted), default)


def _csv_rows(text: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, stripped cells) of every non-blank row."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows, line = [], 1
    for cells in reader:
        if any(c.strip() for c in cells):
            rows.append((line, [c.strip() for c in cells]))
        line = reader.line_num + 1
    return rows


def _csv_entries(path: str, text: str, delimiter: str | None) -> list[tuple[str, str, object]]:
    """(where, image path, label text) of each row of a path,label CSV (a header row is recognised: its path cell
    is not an image name; it may name the columns: path/file/image..., label/class/target...)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if delimiter is None:
        delimiter = next((d for d in (",", "\t", ";") if d in first), ",")
    try:
        rows = _csv_rows(text, delimiter)
    except csv.Error as e:
        raise DataError(f"{path}: not a CSV list of path,label ({e})", path) from e
    if not rows:
        raise DataError(f"{path}: empty list (no rows)", path)
    header = None if is_image_name(rows[0][1][0]) else rows[0][1]
    width = 2 if header is None else len(header)
    path_col = 0 if header is None else _column(header, _PATH_COLUMNS, 0)
    label_col = 1 if header is None else _column(header, _LABEL_COLUMNS, 1 if path_col != 1 else 0)
    if width < 2 or path_col == label_col:
        raise DataError(
            f"{path}: a list of images needs two columns, path and label; the header has {header}", path
        )
    entries = []
    for line, cells in rows[header is not None :]:
        if len(cells) != width:
            form = "path,label (2 cells)" if header is None else f"{width} cells, as its header"
            raise DataError(
                f"{path}: line {line} has {len(cells)} cells; each row is {form} (quote a path that holds the "
                f"delimiter {delimiter!r})",
                path,
            )
        entries.append((f"line {line}", cells[path_col], cells[label_col]))
    return entries


def _json_entries(path: str, text: str) -> list[tuple[str, str, object]]:
    """(where, image path, label) of a JSON list: [{"path": ..., "label": ...}, ...] or {"path": label, ...}."""
    forms = '[{"path": "cat/1.png", "label": "cat"}, ...] or {"cat/1.png": "cat", ...}'
    try:  # its size is bounded already (max_bytes); its depth is checked before the parser recurses into it
        data = bounded_json(text, path, max_bytes=len(text))
    except ConfigError as e:
        raise DataError(f"{e}; a JSON image list is {forms}", path) from None
    if isinstance(data, dict):
        odd = next((k for k in data if not is_image_name(k)), None)
        if odd is not None:  # e.g. a COCO annotations file, which names images deeper down
            raise DataError(
                f"{path}: the key {odd[:80]!r} is not an image file name; a JSON image list is {forms}", path
            )
        return [(f"key {k!r}", k, v) for k, v in data.items()]
    if not isinstance(data, list):
        raise DataError(f"{path}: a JSON {type(data).__name__}; a JSON image list is {forms}", path)
    entries = []
    for n, item in enumerate(data, 1):
        keys = [k for k in item if isinstance(k, str)] if isinstance(item, dict) else []
        p = next((k for k in keys if k.lower() in _PATH_COLUMNS), None)
        y = next((k for k in keys if k.lower() in _LABEL_COLUMNS), None)
        if p is None or y is None:
            raise DataError(
                f"{path}: entry {n} is {json.dumps(item)[:80]}; a JSON image list is {forms}", path
            )
        entries.append((f"entry {n}", item[p], item[y]))
    return entries


_INTEGER = re.compile(r"[+-]?\d+")


def _label_ids(path: str, entries, classes) -> tuple[np.ndarray, list[str] | None]:
    """(int64 labels, class names or None) of list entries: when every label is a whole number (written as a
    number or as text), the numbers are the labels; otherwise every label is a class name, and the names sorted
    (or `classes`, when given) give the labels 0..K-1. A JSON list mixing numbers and names is refused."""
    texts = []
    for where, _, label in entries:
        if (
            isinstance(label, bool)
            or not isinstance(label, (str, numbers.Integral))
            or not str(label).strip()
        ):
            raise DataError(
                f"{path}: {where}: the label {repr(label)[:80]} is neither a class number nor a class name",
                path,
            )
        texts.append(str(label).strip())
    whole = [bool(_INTEGER.fullmatch(t)) for t in texts]
    if not all(whole) and any(not isinstance(label, str) for _, _, label in entries):
        k = whole.index(False)
        raise DataError(
            f"{path}: {entries[k][0]}: the class name {texts[k]!r} among class numbers: use numbers or names",
            path,
        )
    names = None if classes is None else _classes_argument(classes)
    if all(whole):
        top = len(names) if names is not None else IMAGE_MAX_CLASSES
        span = f"0..{top - 1}, " + ("the classes given" if names is not None else f"at most {top} classes")
        ids = np.empty(len(texts), dtype=np.int64)
        for k, t in enumerate(texts):
            # the digits are counted before int() reads them: Python refuses more than 4300 of them with a bare
            # ValueError, and numpy's int64 more than 19 with an OverflowError
            shown = t if len(t) <= 24 else f"{t[:12]}...({len(t)} digits)"
            if len(t.lstrip("+-").lstrip("0")) > len(str(top)) or not 0 <= int(t) < top:
                raise DataError(
                    f"{path}: {entries[k][0]}: the label {shown} is not a class number ({span})", path
                )
            ids[k] = int(t)
        return ids, names
    names = sorted(set(texts)) if names is None else names
    index = {n: k for k, n in enumerate(names)}
    for (where, _, _), t in zip(entries, texts):
        if t not in index:
            raise DataError(
                f"{path}: {where}: the class {t!r} is not one of classes= ({', '.join(names[:10])})", path
            )
    return np.array([index[t] for t in texts], dtype=np.int64), names


def _resolve(path: str, entries) -> list[str]:
    """The image files of list entries, relative to the list's folder (absolute paths stay), each checked to be
    an image name and to exist."""
    base = os.path.dirname(os.path.abspath(path))
    files = []
    for where, name, _ in entries:
        if not isinstance(name, str) or not is_image_name(name):
            raise DataError(
                f"{path}: {where}: {name!r} is not an image file name ({', '.join(IMAGE_EXTENSIONS)})", path
            )
        full = os.path.join(base, name.strip())
        if not os.path.isfile(full):
            raise DataError(
                f"{path}: {where}: no such image file {full} (paths are relative to the list's folder)", path
            )
        files.append(full)
    return files


class ImageListView(ImageFilesView):
    """The images a list file names, with their labels: a CSV of path,label rows (a header row allowed, which may
    name the columns: path/file/image..., label/class/target...; delimiter "," or tab or ";", found from the first
    row) or a JSON file, [{"path": ..., "label": ...}, ...] or {"path": label, ...}. Paths are relative to the
    list file's folder. A label is a class number, or a class name: when every label is a whole number the numbers
    are the labels, otherwise every label is a name, and the sorted names (or `classes=`) give the labels 0..K-1,
    as an ImageFolderView of the same classes would. The list's text may be at most max_bytes (CSV_MAX_BYTES).

    Other options (size=, crop=, channels=, num_classes=, max_pixels=, max_image_bytes=) are
    ImageFilesView's.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        classes=None,
        size=None,
        crop=None,
        channels: int | None = None,
        num_classes: int | None = None,
        max_pixels: int = IMAGE_MAX_PIXELS,
        max_image_bytes: int = IMAGE_MAX_BYTES,
        delimiter: str | None = None,
        max_bytes: int = CSV_MAX_BYTES,
    ):
        path = os.fspath(path)
        if delimiter is not None and not (
            isinstance(delimiter, str) and len(delimiter) == 1 and delimiter not in '"\r\n'
        ):
            raise ConfigError(
                f"delimiter must be one character (not a quote or a newline), got {delimiter!r}"
            )
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        text = _list_text(path, limit_argument(max_bytes))
        if text.lstrip()[:1] in ("[", "{"):
            entries = _json_entries(path, text)
        else:
            entries = _csv_entries(path, text, delimiter)
        if not entries:
            raise DataError(f"{path}: empty list (no images)", path)
        labels, names = _label_ids(path, entries, classes)
        super().__init__(
            _resolve(path, entries),
            labels,
            classes=names,
            size=size,
            crop=crop,
            channels=channels,
            num_classes=num_classes,
            max_pixels=max_pixels,
            max_image_bytes=max_image_bytes,
            source=path,
        )


_JSON_IMAGE = re.compile(r'"[^"\n]*\.(?:png|jpe?g|bmp|gif|webp)"', re.IGNORECASE)


def image_list_kind(head: bytes, cut: bool) -> str | None:
    """'json' or 'csv' when `head`, a text file's first bytes, starts like a list of images: JSON naming image
    files, or rows whose first cells are image file names (after an optional header row). cut: head is only the
    start of the file (its last line may be incomplete)."""
    head = head.removeprefix(b"\xef\xbb\xbf")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if not cut or e.start < len(head) - 4:  # only a character cut at the end of the block is fine
            return None
        text = head[: e.start].decode("utf-8")
    if "\0" in text:
        return None
    if text.lstrip()[:1] in ("[", "{"):
        return "json" if _JSON_IMAGE.search(text) else None
    lines = [ln for ln in text.splitlines()[:8] if ln.strip()]
    if cut and len(lines) > 1:
        lines = lines[:-1]
    for d in (",", "\t", ";"):
        try:
            firsts = [next(csv.reader([ln], delimiter=d))[0] for ln in lines]
        except (csv.Error, StopIteration, IndexError):
            continue
        data = firsts if firsts and is_image_name(firsts[0]) else firsts[1:]
        if data and all(is_image_name(c) for c in data):
            return "csv"
    return None
