"""An .npz archive or a numeric CSV file -> NpzDataView / CsvDataView (array-backed views, read whole)."""

from __future__ import annotations

import csv
import gzip
import io
import os
import zipfile
import zlib

import numpy as np

from .errors import DataError
from .mnist import GZIP_MAGIC
from .views import ArrayDataView


def _npz_dtypes(dtype, stored: np.dtype) -> tuple[np.dtype | None, np.dtype | None]:
    """The dtypes x and float y become (None: as stored) for NpzDataView's `dtype` argument."""
    if dtype is None:
        return None, None
    if isinstance(dtype, str) and dtype == "auto":
        # floats become float32, the runtime's type; integers and bools are data (token ids, pixels) whose
        # exact values matter, so they stay as stored until a Preprocess that knows the model casts them
        return (np.dtype(np.float32) if stored.kind == "f" else None), np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"NpzDataView dtype must be 'auto', None or a numpy dtype, got {dtype!r}") from e
    return dt, dt


class NpzDataView(ArrayDataView):
    """x = archive[x_key], y = archive[y_key]. Never loads Python objects: object arrays are refused.

    dtype="auto" (the default): float x becomes float32; integer and bool x stay as stored (token ids stay
    int64, uint8 images stay uint8: casting is the job of a Preprocess, which knows the model). None keeps x
    as stored; a dtype casts x. y: integers become int64 class labels; floats become float32 (the dtype
    given, when one is; None keeps them).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        x_key: str = "x",
        y_key: str = "y",
        *,
        dtype="auto",
        num_classes: int | None = None,
    ):
        path = os.fspath(path)
        _npz_dtypes(dtype, np.dtype(np.float32))  # a bad argument fails before the file is read
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        try:
            archive = np.load(path, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DataError(
                    f"{path}: one .npy array, not an .npz archive (np.savez(path, x=x, y=y) is)", path
                )
            with archive:
                keys = sorted(archive.files)
                missing = [k for k in (x_key, y_key) if k not in keys]
                if missing:
                    raise DataError(
                        f"{path}: no array named {' or '.join(map(repr, missing))}; the archive holds {keys} "
                        f"(choose with x_key= and y_key=)",
                        path,
                    )
                x, y = archive[x_key], archive[y_key]
        except DataError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            # allow_pickle=False turns object arrays and pickles into ValueError; a cut zip into BadZipFile
            raise DataError(f"{path}: cannot read as an .npz archive of numeric arrays ({e})", path) from e
        if x.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
            raise DataError(
                f"{path}: {x_key} ({x.dtype}) and {y_key} ({y.dtype}) must be numeric arrays", path
            )
        xt, yt = _npz_dtypes(dtype, x.dtype)
        if xt is not None:
            x = x.astype(xt, copy=False)
        if yt is not None and y.dtype.kind == "f":
            y = y.astype(yt, copy=False)
        super().__init__(x, y, num_classes=num_classes, source=path)


def read_text(path: str) -> str:
    """The text of a file, gzip-compressed or not (recognised by content), a UTF-8 byte order mark dropped."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == GZIP_MAGIC:
            raw = gzip.decompress(raw)
        return raw.decode("utf-8-sig")
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file (not UTF-8 at byte {e.start})", path) from e


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


LABEL_NAMES = ("label", "labels", "target", "class", "y")


class CsvDataView(ArrayDataView):
    """A CSV file of numbers (optionally gzip-compressed): one sample per row, the label in `label_column`.

    label_column: an index (negative counts from the end; -1 is the last column), a header name, or "auto" (the
    default): the column whose header is label, labels, target, class or y (any case), else the last column.
    header: "auto" (the first row is a header when any of its cells is not a number), True or False.
    x: the other columns as `dtype` (float32). y: int64 class labels when every label is a whole number
    (label_dtype="auto"), else floats of `dtype`; label_dtype= forces one. Errors name the row (data rows
    counted from 1), the file line and the column of a bad cell. `columns` holds the header names (or None).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        label_column: int | str = "auto",
        header: bool | str = "auto",
        dtype=np.float32,
        *,
        delimiter: str = ",",
        label_dtype="auto",
        num_classes: int | None = None,
    ):
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        if header not in ("auto", True, False):
            raise ValueError(f"header must be 'auto', True or False, got {header!r}")
        numbered = [(i + 1, ln) for i, ln in enumerate(read_text(path).splitlines()) if ln.strip()]
        if not numbered:
            raise DataError(f"{path}: empty dataset (the file has no rows)", path)
        first = _cells(numbered[0][1], delimiter)
        has_header = header is True or (header == "auto" and not all(_is_number(c) for c in first))
        self.columns = first if has_header else None
        rows = numbered[1:] if has_header else numbered
        if not rows:
            raise DataError(f"{path}: empty dataset (a header row {first} and no data rows)", path)
        ncols = len(first)
        if ncols < 2:
            raise DataError(
                f"{path}: {ncols} column; need at least one feature column and a label column", path
            )
        col = self._label_index(path, label_column, ncols)
        data = _parse(path, rows, ncols, delimiter, self.columns, label=col)
        labels = data[:, col]
        x = np.delete(data, col, axis=1).astype(dtype)
        if label_dtype == "auto":
            whole = bool(np.isfinite(labels).all() and (labels == np.round(labels)).all())
            y = labels.astype(np.int64) if whole else labels.astype(dtype)
        else:
            y = labels.astype(label_dtype)
        self.label_column = col
        super().__init__(x, y, num_classes=num_classes, source=path)

    def _label_index(self, path: str, label_column: int | str, ncols: int) -> int:
        if label_column == "auto":
            names = [c.strip().lower() for c in self.columns or []]
            named = [k for k, c in enumerate(names) if c in LABEL_NAMES]
            return named[0] if len(named) == 1 else ncols - 1
        if isinstance(label_column, str):
            if self.columns is None:
                raise DataError(
                    f"{path}: label column {label_column!r} named, but the file has no header row", path
                )
            names = [c.strip() for c in self.columns]
            if label_column not in names:
                raise DataError(f"{path}: no column named {label_column!r}; the header has {names}", path)
            return names.index(label_column)
        if not -ncols <= int(label_column) < ncols:
            raise DataError(f"{path}: label column {label_column} out of range for {ncols} columns", path)
        return int(label_column) % ncols


def _cells(line: str, delimiter: str) -> list[str]:
    return [c.strip() for c in next(csv.reader([line], delimiter=delimiter))]


def _parse(
    path: str, rows: list[tuple[int, str]], ncols: int, delimiter: str, names, *, label: int
) -> np.ndarray:
    # fast path: numpy's C parser; when it refuses, a Python pass finds the row and column to blame
    try:
        data = np.loadtxt(
            io.StringIO("\n".join(ln for _, ln in rows)),
            delimiter=delimiter,
            dtype=np.float64,
            ndmin=2,
            comments=None,
            quotechar='"',
        )
        if data.shape == (len(rows), ncols):
            return data
        why = f"numpy read a {data.shape[0]} x {data.shape[1]} table"
    except ValueError as e:
        why = str(e)
    table = []
    for r, (lineno, line) in enumerate(rows, 1):
        cells = _cells(line, delimiter)
        if len(cells) != ncols:
            raise DataError(
                f"{path}: row {r} (line {lineno}) has {len(cells)} cells, the first row {ncols}", path
            )
        table.append(cells)
    for r, ((lineno, _), cells) in enumerate(zip(rows, table), 1):
        for j, cell in enumerate(cells):
            if not _is_number(cell):
                column = f"column {j + 1}" + (f" ({names[j]!r})" if names else "")
                what = "an empty cell" if cell == "" else f"{cell!r} is not a number"
                hint = _text_hint(table, j, column, label=j == label)
                raise DataError(f"{path}: row {r} (line {lineno}), {column}: {what}{hint}", path)
    raise DataError(f"{path}: cannot read as a numeric CSV table ({why})", path)


def _text_hint(table: list[list[str]], j: int, column: str, *, label: bool) -> str:
    """What would work when a cell is not a number: for a column of text, drop or encode it; else fix the row."""
    texts = sum(1 for cells in table if cells[j] != "" and not _is_number(cells[j]))
    if texts == 0:
        return " (fill it in, or drop the row)"
    if texts == 1 and len(table) > 1:
        return f" (the other rows of {column} hold numbers: fix or drop this row)"
    if label:
        return (
            f"; {column} is the label column and holds text in {texts} of {len(table)} rows: CsvDataView reads "
            f"numbers only, so map the class names to class ids 0..K-1"
        )
    return (
        f"; {column} holds text in {texts} of {len(table)} rows, and CsvDataView reads numbers only: drop the "
        f"column, or encode it as numbers (a category id, or one 0/1 column per value) before training"
    )
