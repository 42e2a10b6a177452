"""A path (MNIST directory, idx pair, .npz, CSV, image folder or list) -> the right IDataView, recognised by
content: open_data."""

from __future__ import annotations

import csv
import gzip
import inspect
import os
import zlib

from .csvtable import CsvDataView, _cells, _is_number
from .errors import ConfigError, DataError
from .imagelayout import image_kind, image_layout, loose_images_message, one_image_message
from .imagelists import ImageListView, image_list_kind
from .images import ImageFolderView
from .mnist import GZIP_MAGIC, SPLIT_PREFIX, MnistDataView, find_mnist_files, idx_header, mnist_names
from .npz import NpzDataView
from .store import SampleStore
from .views import IDataView

_SNIFF = 8192
_SNIFF_WIDE = 1 << 20
_DELIMITERS = (",", "\t", ";")


def _head(path: str, size: int = _SNIFF) -> tuple[bytes, bool]:
    """The first bytes of a file, decompressed when it is gzip; and whether it was."""
    with open(path, "rb") as f:
        head = f.read(size)
    if head[:2] != GZIP_MAGIC:
        return head, False
    try:
        with gzip.open(path, "rb") as f:
            return f.read(size), True
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: a damaged gzip file ({e})", path) from e


def _csv_delimiter(head: bytes, cut: bool) -> str | None:
    """The delimiter when the start of the file reads as a table, else None: a numeric table (a header row
    allowed), or a delimited text table (every line the same number of cells, at least 2, over 2 lines or more:
    CsvDataView then names the text column, where a hex dump of the file's start would tell nothing).
    cut: head is only the start of the file, so its last line may be incomplete."""
    if b"\0" in head:
        return None
    head = head.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark (the error offsets below skip it)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # a character cut at the end of the sniffed block is fine
            return None
        text = head[: e.start].decode("utf-8")
    lines = [ln for ln in text.splitlines()[:6] if ln.strip()]
    if cut and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut short
    for d in _DELIMITERS:
        if any(d in ln and all(_is_number(c.strip().strip('"')) for c in ln.split(d)) for ln in lines):
            return d
    for d in _DELIMITERS:
        try:
            widths = {len(_cells(ln, d)) for ln in lines}
        except csv.Error:  # e.g. a cell beyond the csv module's field size limit
            continue
        if len(lines) >= 2 and len(widths) == 1 and widths.pop() >= 2:
            return d
    return None


def _partner(path: str, ndim: int) -> str | None:
    """The labels file next to an images file (or the reverse), by the MNIST naming."""
    d, name = os.path.split(path)
    pairs = [("images-idx3", "labels-idx1"), ("images.idx3", "labels.idx1")]
    for a, b in pairs if ndim == 3 else [(b, a) for a, b in pairs]:
        if a in name:
            base = name.replace(a, b).removesuffix(".gz")
            for cand in (base, base + ".gz"):
                if os.path.isfile(os.path.join(d, cand)):
                    return os.path.join(d, cand)
    return None


def _open_pair(paths, **kwargs) -> MnistDataView:
    ndims = []
    for p in map(os.fspath, paths):
        parsed = idx_header(_head(p)[0]) if os.path.isfile(p) else None
        if parsed is None:
            raise DataError(f"{p}: not an idx file (open_data reads a pair of MNIST idx files)", p)
        ndims.append(len(parsed[1]))
    if sorted(ndims) != [1, 3]:
        raise DataError(
            f"{[os.fspath(p) for p in paths]}: need one images (3-D) and one labels (1-D) idx file, "
            f"found {ndims} dimensions"
        )
    images, labels = paths if ndims[0] == 3 else paths[::-1]
    return _make(MnistDataView, images, labels, **kwargs)


def _make(cls, *args, **kwargs):
    """cls(*args, **kwargs), where a keyword the view does not take is a ConfigError naming the file and the view
    open_data picked (not a TypeError from deep inside)."""
    params = inspect.signature(cls).parameters
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown:
        takes = [p for p in params if p not in ("self", "path", "images_path", "labels_path", "create")]
        raise ConfigError(
            f"{os.fspath(args[0])}: read as {cls.__name__}, which takes no {', '.join(unknown)} (it takes "
            f"{', '.join(takes)})"
        )
    return cls(*args, **kwargs)


def open_data(path, **kwargs) -> IDataView:
    """The view for `path`, recognised by its content (the extension alone decides nothing):

    - a directory of MNIST idx files (split="train" or "test"), or a (images, labels) pair of idx files, or one
      idx file whose partner sits next to it under the MNIST names -> MnistDataView
    - a zip archive (.npz) -> NpzDataView;  a numeric CSV/TSV table, raw or gzip -> CsvDataView
    - an SQLite sample store (the phone app's samples.sqlite) -> SampleStore
    - a directory of class folders of images (ROOT/<class>/*.png|jpg|...) -> ImageFolderView; a directory of
      split folders (ROOT/train/<class>/...) -> the ImageFolderView of split= (a DataError naming the splits
      without it); a CSV of path,label rows or a JSON list naming image files -> ImageListView
    Other keyword arguments go to the view (num_classes=, x_key=, label_column=, normalize=, max_bytes=, size=,
    crop=, channels=, ...); one the view does not take is a ConfigError. A file that cannot be read is a DataError
    naming it; so is one image, or a directory of images without class folders, saying how to lay them out.
    """
    try:
        return _open(path, **kwargs)
    except OSError as e:  # a permission denied, a file gone meanwhile, an I/O error
        where = getattr(e, "filename", None) or (path if isinstance(path, (str, os.PathLike)) else None)
        raise DataError(
            f"{os.fspath(where) if where else path}: cannot read ({e.strerror or e})", where
        ) from e


def _open_dir(path: str, split: str | None, kwargs: dict) -> IDataView:
    """An MNIST directory (its files for split, "train" by default), else a folder of images by its layout."""
    if split in (None, *SPLIT_PREFIX) and any(
        os.path.isfile(os.path.join(path, n)) for n in mnist_names(split or "train", "images")
    ):
        images, labels = find_mnist_files(path, split or "train")
        return _make(MnistDataView, images, labels, **kwargs)
    layout = image_layout(path)
    kind, names = layout if layout is not None else (None, [])
    if kind == "classes":
        return _make(ImageFolderView, path, **kwargs)
    if kind == "splits":
        if split in names:
            return _make(ImageFolderView, os.path.join(path, split), **kwargs)
        raise DataError(
            f"{path}: holds the splits {', '.join(names)} (each a folder of class folders)"
            f"{'' if split is None else f', not {split!r}'}: pass split= one of them, or open "
            f"{os.path.join(path, names[0])}",
            path,
        )
    if kind == "loose":
        raise DataError(loose_images_message(path, names), path)
    images, labels = find_mnist_files(path, split or "train")  # the MNIST message says what is missing
    return _make(MnistDataView, images, labels, **kwargs)


def _open(path, **kwargs) -> IDataView:
    if isinstance(path, (tuple, list)):
        if len(path) != 2:
            raise DataError(
                f"open_data takes a path or a pair of idx paths (images, labels), got {len(path)} paths"
            )
        return _open_pair(path, **kwargs)
    path = os.fspath(path)
    if os.path.isdir(path):
        return _open_dir(path, kwargs.pop("split", None), kwargs)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file or directory", path)
    head, compressed = _head(path)
    if (
        head[:16] == b"SQLite format 3\x00" and not compressed
    ):  # the app's sample store (or a foreign database,
        return _make(SampleStore, path, create=False, **kwargs)  # which SampleStore refuses, naming it)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06") and not compressed:
        return _make(NpzDataView, path, **kwargs)
    parsed = idx_header(head)
    if parsed is not None:
        ndim = len(parsed[1])
        other = _partner(path, ndim) if ndim in (1, 3) else None
        if other is None:
            raise DataError(
                f"{path}: an idx file of {ndim} dimension(s) alone; open_data needs the MNIST images and labels: "
                f"pass the pair (images, labels) or their directory",
                path,
            )
        return _open_pair((path, other), **kwargs)
    kind = None if compressed else image_kind(head)
    if kind is not None:
        raise DataError(one_image_message(path, kind), path)
    listed = None if compressed else image_list_kind(head, cut=len(head) == _SNIFF)
    if listed is not None:
        return _make(ImageListView, path, **kwargs)
    if head[:6] == b"\x93NUMPY":
        raise DataError(f"{path}: one .npy array; save x and y together with np.savez(path, x=x, y=y)", path)
    delimiter = _csv_delimiter(head, cut=len(head) == _SNIFF)
    if delimiter is None and len(head) == _SNIFF and b"\0" not in head and head.count(b"\n") < 2:
        # wide rows (e.g. MNIST as CSV: 785 columns) do not fit the first block: look further
        head, _ = _head(path, _SNIFF_WIDE)
        delimiter = _csv_delimiter(head, cut=len(head) == _SNIFF_WIDE)
    if delimiter is not None:
        kwargs.setdefault("delimiter", delimiter)
        return _make(CsvDataView, path, **kwargs)
    shown = " ".join(f"{b:02x}" for b in head[:8]) or "nothing (empty file)"
    raise DataError(
        f"{path}: unrecognised data (starts with {shown}{', gzip-compressed' if compressed else ''}); open_data "
        f"reads MNIST idx files (raw or .gz, a directory or an images/labels pair), .npz archives, "
        f"delimited tables (CSV, TSV), image folders (ROOT/<class>/*.png) and image lists (CSV of path,label)",
        path,
    )
