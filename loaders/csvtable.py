"""A numeric CSV file (raw or gzip, within a size ceiling) -> CsvDataView: features and labels checked value by
value (finite, within their dtype, integer class labels within int64), errors naming the line and column."""

from __future__ import annotations

import csv
import gzip
import numbers
import os
import zlib

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import CSV_MAX_BYTES, allocate, gzip_declared_size, limit_argument, read_capped, size_text
from .mnist import GZIP_MAGIC
from .views import ArrayDataView, class_count

LABEL_NAMES = ("label", "labels", "target", "class", "y")
_CHUNK_VALUES = 1 << 20  # values parsed per np.loadtxt call: a float64 block of 8 MiB
_INT64 = 2.0**63


def read_text(path: str, max_bytes: int = CSV_MAX_BYTES) -> str:
    """The text of a file, gzip-compressed or not (recognised by content), a UTF-8 byte order mark dropped; at
    most `max_bytes` of it (raw, or once inflated: streamed, refused as soon as it holds more)."""
    try:
        with open(path, "rb") as f:
            compressed = f.read(2) == GZIP_MAGIC
            if not compressed:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise _too_big(path, f"a text file of {size_text(size)}", max_bytes, size)
                f.seek(0)
                raw = f.read()
        if compressed:
            declared = gzip_declared_size(path)
            if declared is not None and declared > max_bytes:
                raise _too_big(
                    path, f"a .gz that declares {size_text(declared)} once inflated", max_bytes, declared
                )
            with gzip.open(path, "rb") as g:
                raw, over = read_capped(g, max_bytes)
            if over:
                raise _too_big(
                    path, f"a .gz that inflates to more than {max_bytes} bytes", max_bytes, max_bytes + 1
                )
        return raw.decode("utf-8-sig")
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file (not UTF-8 at byte {e.start})", path) from e


def _too_big(path: str, what: str, limit: int, needed: int) -> DataLimitError:
    return DataLimitError(
        f"{path}: {what}; a CSV file may hold at most {size_text(limit)} of text, so it was refused before being "
        f"read whole (a decompression bomb, or a table too large for memory: pass max_bytes= to allow more, or "
        f"save the table as an .npz)",
        path,
        limit=limit,
        needed=needed,
    )


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _numeric_dtype(dtype, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"CsvDataView {what} must be a numeric numpy dtype, got {dtype!r}") from e
    if dt.kind not in "fiu":
        raise ConfigError(f"CsvDataView {what} must be a float or integer dtype, got {dt}")
    return dt


class CsvDataView(ArrayDataView):
    """A CSV file of numbers (optionally gzip-compressed): one sample per row, the label in `label_column`.

    label_column: an index (negative counts from the end; -1 is the last column), a header name, or "auto" (the
    default): the column whose header is label, labels, target, class or y (any case), else the last column.
    header: "auto" (the first row is a header when any of its cells is not a number), True or False.
    x: the other columns as `dtype` (float32). y: int64 class labels when every label is a whole number
    (label_dtype="auto"), else floats of `dtype`; label_dtype= forces one. Errors name the row (data rows
    counted from 1), the file line and the column of a bad cell. `columns` holds the header names (or None).

    Every value is checked: NaN, inf and numbers beyond `dtype` (1e39 in float32) are refused, and so are class
    labels beyond int64 (1e30), or out of range when num_classes is given, naming the line and the column. The
    text may be at most `max_bytes` (default CSV_MAX_BYTES, 256 MiB; raw or once inflated; DataLimitError).
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
        max_bytes: int = CSV_MAX_BYTES,
    ):
        path = os.fspath(path)
        if header not in ("auto", True, False):
            raise ConfigError(f"header must be 'auto', True or False, got {header!r}")
        dtype = _numeric_dtype(dtype, "dtype")
        if not (isinstance(label_dtype, str) and label_dtype == "auto"):
            label_dtype = _numeric_dtype(label_dtype, "label_dtype")
        if not (isinstance(delimiter, str) and len(delimiter) == 1 and delimiter not in '"\r\n'):
            raise ConfigError(
                f"delimiter must be one character (not a quote or a newline), got {delimiter!r}"
            )
        if not (label_column == "auto" or isinstance(label_column, str) or _is_int(label_column)):
            raise ConfigError(
                f"label_column must be 'auto', a column index or a header name, got {label_column!r}"
            )
        classes = None if num_classes is None else class_count(num_classes)
        max_bytes = limit_argument(max_bytes)
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file", path)
        lines = read_text(path, max_bytes).splitlines()
        keep = [i for i, ln in enumerate(lines) if ln.strip()]
        rows = [lines[i] for i in keep]
        del lines
        self._lines = np.array(keep, dtype=np.int64) + 1  # the file line of each row (1-based)
        if not rows:
            raise DataError(f"{path}: empty dataset (the file has no rows)", path)
        first = _cells(rows[0], delimiter, path, int(self._lines[0]))
        has_header = header is True or (header == "auto" and not all(_is_number(c) for c in first))
        self.columns = first if has_header else None
        if has_header:
            rows, self._lines = rows[1:], self._lines[1:]
        if not rows:
            raise DataError(f"{path}: empty dataset (a header row {first} and no data rows)", path)
        ncols = len(first)
        if ncols < 2:
            raise DataError(
                f"{path}: {ncols} column; need at least one feature column and a label column", path
            )
        col = self._label_index(path, label_column, ncols)
        self.label_column = col
        x, labels = self._parse(path, rows, ncols, delimiter, dtype, col)
        del rows
        y = self._labels(path, labels, dtype, label_dtype, classes)
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

    # -- the table -------------------------------------------------------------------------------------------
    def _column(self, j: int) -> str:
        return f"column {j + 1}" + (f" ({self.columns[j]!r})" if self.columns else "")

    def _where(self, r: int, j: int) -> str:
        return f"row {r + 1} (line {int(self._lines[r])}), {self._column(j)}"

    def _parse(
        self, path: str, rows: list[str], ncols: int, delimiter: str, dtype: np.dtype, col: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(x as dtype, the labels as float64), parsed block by block by numpy's C parser; a block it refuses
        is read again cell by cell to name the row and column to blame."""
        n = len(rows)
        x = allocate(n * (ncols - 1) * dtype.itemsize, path, f"{n} rows of {ncols - 1} features")
        x = x.view(dtype).reshape(n, ncols - 1)
        labels = np.empty(n, np.float64)
        step = max(1, _CHUNK_VALUES // ncols)
        for start in range(0, n, step):
            part = rows[start : start + step]
            try:
                data = np.loadtxt(
                    part, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None, quotechar='"'
                )
                why = None if data.shape == (len(part), ncols) else f"numpy read a {data.shape} table"
            except ValueError as e:
                why = str(e)
            if why is not None:
                self._blame(path, rows, start, len(part), ncols, delimiter, col, why)
            self._check_values(path, rows, start, data, dtype, col, delimiter)
            x[start : start + len(part), :col] = data[:, :col]
            x[start : start + len(part), col:] = data[:, col + 1 :]
            labels[start : start + len(part)] = data[:, col]
        return x, labels

    def _cell(self, rows: list[str], r: int, j: int, delimiter: str) -> str:
        try:
            return _cells(rows[r], delimiter, "", 0)[j]
        except (DataError, IndexError):
            return "?"

    def _check_values(
        self, path: str, rows: list[str], start: int, data: np.ndarray, dtype: np.dtype, col: int, delimiter
    ) -> None:
        """NaN, inf (written, or a number beyond float64) anywhere; features beyond `dtype`."""
        bad = ~np.isfinite(data)
        if bad.any():
            r, j = np.argwhere(bad)[0]
            text = self._cell(rows, start + r, j, delimiter)
            what = "the label" if j == col else "a feature"
            raise DataError(
                f"{path}: {self._where(start + r, j)}: {text!r} is not a finite number ({what} is "
                f"{data[r, j]}); NaN and inf cannot be trained on: write a real value, or drop the row",
                path,
            )
        features = np.delete(data, col, axis=1) if data.shape[1] > 1 else data[:, :0]
        if dtype.kind == "f":
            big = float(np.finfo(dtype).max)
            over = np.abs(features) > big
            fix = "scale the column, or read with dtype=np.float64"
            what = f"beyond {dtype} (largest {big:g}): it would become inf"
        else:
            info = np.iinfo(dtype)
            over = (features < info.min) | (features > info.max) | (features != np.round(features))
            fix = "read with a float dtype (dtype=np.float32)"
            what = f"not a whole number within {dtype} ({info.min}..{info.max})"
        if over.any():
            r, k = np.argwhere(over)[0]
            j = k + (k >= col)
            text = self._cell(rows, start + r, j, delimiter)
            raise DataError(f"{path}: {self._where(start + r, j)}: {text!r} is {what}; {fix}", path)

    def _labels(self, path: str, labels: np.ndarray, dtype: np.dtype, label_dtype, classes: int | None):
        """The float64 labels -> int64 classes (all whole, within int64, within num_classes) or float targets."""
        col = self.label_column
        whole = bool((labels == np.round(labels)).all())
        if isinstance(label_dtype, str):  # auto
            target = np.dtype(np.int64) if whole else (dtype if dtype.kind == "f" else np.dtype(np.float32))
        else:
            target = label_dtype
        if target.kind == "f":
            big = float(np.finfo(target).max)
            bad = np.flatnonzero(np.abs(labels) > big)
            if bad.size:
                r = int(bad[0])
                raise DataError(
                    f"{path}: {self._where(r, col)}: the label {labels[r]:g} is beyond {target} (largest "
                    f"{big:g}): it would become inf; scale the targets, or pass label_dtype=np.float64",
                    path,
                )
            return labels.astype(target)
        info = np.iinfo(target)
        lo, hi = max(float(info.min), -_INT64), min(float(info.max) + 1, _INT64)
        bad = np.flatnonzero((labels != np.round(labels)) | (labels < lo) | (labels >= hi))
        if bad.size:
            r = int(bad[0])
            raise DataError(
                f"{path}: {self._where(r, col)}: the label {labels[r]:g} is not an integer class within {target} "
                f"(class labels are whole numbers 0..K-1; for regression targets pass label_dtype=np.float32)",
                path,
            )
        y = labels.astype(target)
        if classes is not None:
            out = np.flatnonzero((y < 0) | (y >= classes))
            if out.size:
                r = int(out[0])
                raise DataError(
                    f"{path}: {self._where(r, col)}: label {int(y[r])} of sample {r} is out of range for "
                    f"num_classes={classes} (labels span {int(y.min())}..{int(y.max())}; {out.size} out of range)",
                    path,
                )
        return y

    def _blame(
        self,
        path: str,
        rows: list[str],
        start: int,
        count: int,
        ncols: int,
        delimiter: str,
        col: int,
        why: str,
    ):
        """The DataError for a block numpy refused: the first ragged row, else the first cell not a number."""
        for r in range(start, start + count):
            cells = _cells(rows[r], delimiter, path, int(self._lines[r]))
            if len(cells) != ncols:
                raise DataError(
                    f"{path}: row {r + 1} (line {int(self._lines[r])}) has {len(cells)} cells, the first row "
                    f"{ncols}",
                    path,
                )
            for j, cell in enumerate(cells):
                if not _is_number(cell):
                    what = "an empty cell" if cell == "" else f"{cell!r} is not a number"
                    hint = _text_hint(rows, j, self._column(j), delimiter, label=j == col)
                    raise DataError(f"{path}: {self._where(r, j)}: {what}{hint}", path)
        raise DataError(
            f"{path}: cannot read as a numeric CSV table (rows {start + 1}..{start + count}: {why})", path
        )


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _cells(line: str, delimiter: str, path: str = "", lineno: int = 0) -> list[str]:
    try:
        return [c.strip() for c in next(csv.reader([line], delimiter=delimiter))]
    except (csv.Error, StopIteration) as e:  # e.g. a cell beyond the csv module's field size limit
        raise DataError(f"{path}: line {lineno}: not a CSV row ({e})", path) from None


def _text_hint(rows: list[str], j: int, column: str, delimiter: str, *, label: bool) -> str:
    """What would work when a cell is not a number: for a column of text, drop or encode it; else fix the row."""
    texts = 0
    for line in rows:
        try:
            cells = _cells(line, delimiter)
        except DataError:
            continue
        if j < len(cells) and cells[j] != "" and not _is_number(cells[j]):
            texts += 1
    if texts == 0:
        return " (fill it in, or drop the row)"
    if texts == 1 and len(rows) > 1:
        return f" (the other rows of {column} hold numbers: fix or drop this row)"
    if label:
        return (
            f"; {column} is the label column and holds text in {texts} of {len(rows)} rows: CsvDataView reads "
            f"numbers only, so map the class names to class ids 0..K-1"
        )
    return (
        f"; {column} holds text in {texts} of {len(rows)} rows, and CsvDataView reads numbers only: drop the "
        f"column, or encode it as numbers (a category id, or one 0/1 column per value) before training"
    )
