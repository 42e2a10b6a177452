"""A numeric CSV file (raw or gzip, within a size ceiling) -> CsvDataView: features and labels checked value by
value (finite, within their dtype, integer class labels within int64), errors naming the line and column."""

from __future__ import annotations

import csv
import gzip
import itertools
import numbers
import os
import re
import zlib

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import (
    CSV_MAX_BYTES,
    CSV_MAX_COLUMNS,
    allocate,
    gzip_declared_size,
    limit_argument,
    read_capped,
    size_text,
)
from .mnist import GZIP_MAGIC
from .views import ArrayDataView, class_count

LABEL_NAMES = ("label", "labels", "target", "class", "y")
_CHUNK_VALUES = 1 << 20  # values parsed per np.loadtxt call: a float64 block of 8 MiB
_INT64 = 2.0**63


def read_text(path: str, max_bytes: int = CSV_MAX_BYTES) -> str:
    """The text of a file, gzip-compressed or not (recognised by content), a UTF-8 byte order mark dropped; at
    most `max_bytes` of it (raw, or once inflated: streamed, refused as soon as it holds more)."""
    bom = 0
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
        bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        return raw[bom:].decode("utf-8") if bom else raw.decode("utf-8")
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read ({e})", path) from e
    except UnicodeDecodeError as e:
        where = e.start + bom  # counted in the file (or in the inflated text), the byte order mark included
        raise DataError(f"{path}: not a text file (not UTF-8 at byte {where})", path) from e


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
        text = read_text(path, max_bytes)
        # first pass: count the rows and find the first, a block of lines at a time (a list of every line would
        # cost ~60 bytes of Python objects per line: 15 times the text of a table of short rows)
        count, head = 0, None
        for numbers_, rows in _row_blocks(text):
            if head is None and rows:
                head = (int(numbers_[0]), rows[0])
            count += len(rows)
        if head is None:
            raise DataError(f"{path}: empty dataset (the file has no rows)", path)
        width = head[1].count(delimiter) + 1
        if width > CSV_MAX_COLUMNS:
            raise DataLimitError(
                f"{path}: line {head[0]} has {width} cells; a CSV table may have at most {CSV_MAX_COLUMNS} columns",
                path,
                limit=CSV_MAX_COLUMNS,
                needed=width,
            )
        first = _cells(head[1], delimiter, path, head[0])
        has_header = header is True or (header == "auto" and not all(_is_number(c) for c in first))
        self.columns = first if has_header else None
        n = count - has_header
        if n == 0:
            raise DataError(f"{path}: empty dataset (a header row {first} and no data rows)", path)
        ncols = len(first)
        if ncols < 2:
            raise DataError(
                f"{path}: {ncols} column; need at least one feature column and a label column", path
            )
        col = self._label_index(path, label_column, ncols)
        self.label_column = col
        self._text, self._skip = text, int(has_header)  # for the line numbers of errors, while parsing
        try:
            x, labels = self._parse(path, n, ncols, delimiter, dtype, col)
            y = self._labels(path, labels, dtype, label_dtype, classes)
        finally:
            del self._text
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

    def _data_rows(self):
        """(line numbers, rows) of the data rows, block by block (the header row skipped)."""
        skip = self._skip
        for numbers_, rows in _row_blocks(self._text):
            if skip and rows:
                numbers_, rows, skip = numbers_[1:], rows[1:], 0
            yield numbers_, rows

    def _line_of(self, r: int) -> int:
        """The file line of data row r (0-based), found again (for a message)."""
        for numbers_, rows in self._data_rows():
            if r < len(rows):
                return int(numbers_[r])
            r -= len(rows)
        return 0

    def _where(self, r: int, j: int, line: int | None = None) -> str:
        line = self._line_of(r) if line is None else line
        return f"row {r + 1} (line {line}), {self._column(j)}"

    def _parse(
        self, path: str, n: int, ncols: int, delimiter: str, dtype: np.dtype, col: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(x as dtype, the labels as float64), parsed a block of rows at a time by numpy's C parser; a block it
        refuses is read again cell by cell to name the row and column to blame."""
        x = allocate(n * (ncols - 1) * dtype.itemsize, path, f"{n} rows of {ncols - 1} features")
        x = x.view(dtype).reshape(n, ncols - 1)
        labels = np.empty(n, np.float64)
        step = max(1, _CHUNK_VALUES // ncols)
        r = 0
        for numbers_, block in self._data_rows():
            for start in range(0, len(block), step):
                part, lines = block[start : start + step], numbers_[start : start + step]
                try:
                    data = np.loadtxt(
                        part, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None, quotechar='"'
                    )
                    why = None if data.shape == (len(part), ncols) else f"numpy read a {data.shape} table"
                except ValueError as e:
                    why = str(e)
                if why is not None:
                    self._blame(path, part, lines, r, ncols, delimiter, col, why)
                self._check_values(path, part, lines, r, data, dtype, col, delimiter)
                k = len(part)
                x[r : r + k, :col] = data[:, :col]
                x[r : r + k, col:] = data[:, col + 1 :]
                labels[r : r + k] = data[:, col]
                r += k
        assert r == n, (r, n)
        return x, labels

    def _check_values(
        self,
        path: str,
        part: list[str],
        lines,
        r0: int,
        data: np.ndarray,
        dtype: np.dtype,
        col: int,
        delimiter,
    ) -> None:
        """NaN, inf (written, or a number beyond float64) anywhere; features beyond `dtype`."""
        bad = ~np.isfinite(data)
        if bad.any():
            r, j = (int(v) for v in np.argwhere(bad)[0])
            text = _cell(part[r], j, delimiter)
            what = "the label" if j == col else "a feature"
            raise DataError(
                f"{path}: {self._where(r0 + r, j, int(lines[r]))}: {text!r} is not a finite number ({what} is "
                f"{data[r, j]}); NaN and inf cannot be trained on: write a real value, or drop the row",
                path,
            )
        features = np.delete(data, col, axis=1)
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
            r, k = (int(v) for v in np.argwhere(over)[0])
            j = k + (k >= col)
            text = _cell(part[r], j, delimiter)
            raise DataError(
                f"{path}: {self._where(r0 + r, j, int(lines[r]))}: {text!r} is {what}; {fix}", path
            )

    def _labels(self, path: str, labels: np.ndarray, dtype: np.dtype, label_dtype, classes: int | None):
        """The float64 labels -> int64 classes (all whole, within int64, within num_classes) or float targets."""
        col = self.label_column
        whole = _all_whole(labels)
        if isinstance(label_dtype, str):  # auto
            target = np.dtype(np.int64) if whole else (dtype if dtype.kind == "f" else np.dtype(np.float32))
        else:
            target = label_dtype
        if target.kind == "f":
            big = float(np.finfo(target).max)
            r = _first(labels, lambda a: np.abs(a) > big)
            if r >= 0:
                raise DataError(
                    f"{path}: {self._where(r, col)}: the label {labels[r]:g} is beyond {target} (largest "
                    f"{big:g}): it would become inf; scale the targets, or pass label_dtype=np.float64",
                    path,
                )
            return labels.astype(target)
        info = np.iinfo(target)
        lo, hi = max(float(info.min), -_INT64), min(float(info.max) + 1, _INT64)
        r = _first(labels, lambda a: (a < lo) | (a >= hi) | (a != np.round(a)))
        if r >= 0:
            raise DataError(
                f"{path}: {self._where(r, col)}: the label {labels[r]:g} is not an integer class within {target} "
                f"(class labels are whole numbers 0..K-1; for regression targets pass label_dtype=np.float32)",
                path,
            )
        y = _to_int(labels, target)
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
        self, path: str, part: list[str], lines, r0: int, ncols: int, delimiter: str, col: int, why: str
    ):
        """The DataError for a block numpy refused: the first ragged row, else the first cell not a number."""
        for r, row in enumerate(part):
            cells = _cells(row, delimiter, path, int(lines[r]))
            if len(cells) != ncols:
                raise DataError(
                    f"{path}: row {r0 + r + 1} (line {int(lines[r])}) has {len(cells)} cells, the first row "
                    f"{ncols}",
                    path,
                )
            for j, cell in enumerate(cells):
                if not _is_number(cell):
                    what = "an empty cell" if cell == "" else f"{cell!r} is not a number"
                    hint = self._text_hint(j, delimiter, label=j == col)
                    raise DataError(f"{path}: {self._where(r0 + r, j, int(lines[r]))}: {what}{hint}", path)
        raise DataError(
            f"{path}: cannot read as a numeric CSV table (rows {r0 + 1}..{r0 + len(part)}: {why})", path
        )

    def _text_hint(self, j: int, delimiter: str, *, label: bool) -> str:
        """What would work when a cell is not a number: for a column of text, drop or encode it; else fix the
        row."""
        column = self._column(j)
        texts = total = 0
        for _, rows in self._data_rows():
            for line in rows:
                total += 1
                try:
                    cells = _cells(line, delimiter)
                except DataError:
                    continue
                if j < len(cells) and cells[j] != "" and not _is_number(cells[j]):
                    texts += 1
        if texts == 0:
            return " (fill it in, or drop the row)"
        if texts == 1 and total > 1:
            return f" (the other rows of {column} hold numbers: fix or drop this row)"
        if label:
            return (
                f"; {column} is the label column and holds text in {texts} of {total} rows: CsvDataView reads "
                f"numbers only, so map the class names to class ids 0..K-1"
            )
        return (
            f"; {column} holds text in {texts} of {total} rows, and CsvDataView reads numbers only: drop the "
            f"column, or encode it as numbers (a category id, or one 0/1 column per value) before training"
        )


_BLOCK_CHARS = 1 << 20  # text split into lines at a time: ~30 MiB of Python strings at most
_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # str.splitlines's line breaks


def _row_blocks(text: str):
    """(line numbers from 1, rows) of the non-blank lines of `text`, about _BLOCK_CHARS of text at a time, each
    block ending at a line break (a line longer than a block comes whole), split as str.splitlines splits."""
    pos, lineno, n = 0, 1, len(text)
    while pos < n:
        end = n
        if pos + _BLOCK_CHARS < n:
            found = _BREAK.search(text, pos + _BLOCK_CHARS - 1)
            end = n if found is None else found.end()
        lines = text[pos:end].splitlines()
        keep = [bool(ln.strip()) for ln in lines]
        yield lineno + np.flatnonzero(keep), list(itertools.compress(lines, keep))
        lineno += len(lines)
        pos = end


def _cell(row: str, j: int, delimiter: str) -> str:
    try:
        return _cells(row, delimiter)[j]
    except (DataError, IndexError):
        return "?"


def _first(a: np.ndarray, bad) -> int:
    """The first index i where bad(a)[i], or -1; a block at a time, so that the temporaries stay small."""
    step = 1 << 20
    for i in range(0, a.size, step):
        found = np.flatnonzero(bad(a[i : i + step]))
        if found.size:
            return i + int(found[0])
    return -1


def _all_whole(a: np.ndarray) -> bool:
    return _first(a, lambda b: b != np.round(b)) < 0


def _to_int(labels: np.ndarray, target: np.dtype) -> np.ndarray:
    """Whole float64 labels as `target` integers; int64 in place (a block at a time), so no second array."""
    if target != np.int64:
        return labels.astype(target)
    out = labels.view(np.int64)
    step = 1 << 20
    for i in range(0, labels.size, step):
        out[i : i + step] = labels[i : i + step]  # numpy copies each overlapping block first
    return out


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _cells(line: str, delimiter: str, path: str = "", lineno: int = 0) -> list[str]:
    try:
        return [c.strip() for c in next(csv.reader([line], delimiter=delimiter))]
    except (csv.Error, StopIteration) as e:  # e.g. a cell beyond the csv module's field size limit
        raise DataError(f"{path}: line {lineno}: not a CSV row ({e})", path) from None
