"""Arrays or another view -> IDataView samples (x, y): ArrayDataView, SubsetView, split, check_labels."""

from __future__ import annotations

import abc
import numbers
from collections.abc import Sequence

import numpy as np

from .errors import ConfigError, DataError, SampleIndexError


class IDataView(abc.ABC):
    """A random-access dataset, as MegEngine's on-device training defines it: get_item(idx) -> (x, y), size().

    x is one sample as a numpy array; y is its label, an int64 scalar array for classes or a float array for
    regression. `source` names where the data came from (a path), for error messages.
    """

    source: str = "<data view>"
    # True when the view refuses non-finite values as it reads them (every view of this package does); a
    # DataLoader checks each batch of any other view
    finite_checked: bool = False

    @abc.abstractmethod
    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample `idx` (0 <= idx < size()) as (x, y)."""

    @abc.abstractmethod
    def size(self) -> int:
        """Number of samples."""

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples `indices` stacked on a new first axis. Views backed by arrays override this with one take."""
        items = [self.get_item(int(i)) for i in indices]
        return np.stack([x for x, _ in items]), np.stack([y for _, y in items])

    def labels(self) -> np.ndarray:
        """Every label, stacked (used by check_labels); array-backed views return them without a loop."""
        return np.stack([self.get_item(i)[1] for i in range(self.size())])

    def __getitem__(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.size()
        i = int(idx)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise SampleIndexError(f"index {idx} out of range for {self.source} of {n} samples", self.source)
        return self.get_item(i)

    def __len__(self) -> int:
        return self.size()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, {self.size()} samples)"


_FINITE_CHUNK = 1 << 22  # values checked at a time: a 4 MiB mask, whatever the array's size


def first_nonfinite(a: np.ndarray) -> tuple[int, tuple[int, ...], float, int] | None:
    """None when every value of `a` (float or complex) is finite, else (sample index along axis 0, position
    within that sample, the value, the number of samples that hold one). One pass, in bounded chunks."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return None
    if a.ndim == 0:
        a = a.reshape(1)
    per = max(1, a.size // a.shape[0])
    step = max(1, _FINITE_CHUNK // per)
    first, count = None, 0
    for start in range(0, a.shape[0], step):
        bad = ~np.isfinite(a[start : start + step]).reshape(-1, per).all(axis=1)
        if bad.any():
            rows = np.flatnonzero(bad)
            count += int(rows.size)
            if first is None:
                i = start + int(rows[0])
                sample = a[i]
                pos = np.unravel_index(int(np.flatnonzero(~np.isfinite(sample).reshape(-1))[0]), sample.shape)
                first = (
                    i,
                    tuple(int(p) for p in pos),
                    complex(sample[pos]) if a.dtype.kind == "c" else float(sample[pos]),
                )
    return None if first is None else (*first, count)


def check_finite(
    a: np.ndarray, source: str, *, what: str = "feature", ids=None, path: str | None = None
) -> None:
    """DataError naming `source` and the first sample of `a` (along axis 0) that holds NaN or inf, with its
    position and how many samples do; `ids` (optional) names samples by id instead of by index."""
    found = first_nonfinite(a)
    if found is None:
        return
    i, pos, value, count = found
    name = f"sample {i}" if ids is None else f"sample id {int(ids[i])}"
    at = f" at position {list(pos)}" if pos else ""
    n = np.shape(a)[0] if np.ndim(a) else 1
    raise DataError(
        f"{source}: {name} holds a non-finite {what} ({value}{at}); {count} of {n} samples do. NaN and inf "
        f"cannot be trained on: fix or drop those samples",
        source if path is None else path,
    )


def _labels_array(y: np.ndarray) -> np.ndarray:
    # class labels travel as int64 whatever integer type the file used; float targets stay as they are
    if y.dtype.kind in "biu":
        return y.astype(np.int64, copy=False)
    if y.dtype.kind != "f":
        raise DataError(f"labels of dtype {y.dtype} are not numbers (need integer class labels or floats)")
    return y


class ArrayDataView(IDataView):
    """Samples from two arrays: x[i] and y[i] (x of shape [n, ...], y of shape [n] or [n, ...]).

    Integer labels become int64. A batch is one np.take on each array. `num_classes` checks the labels. NaN or
    inf in x or in float labels is a DataError naming the first sample that holds one (one pass over the arrays).
    """

    finite_checked = True

    def __init__(self, x, y, *, num_classes: int | None = None, source: str = "<arrays>"):
        x, y = np.asarray(x), np.asarray(y)
        self.source = source
        if x.ndim == 0 or y.ndim == 0:
            raise DataError(
                f"{source}: x and y need a first (sample) axis; got shapes {x.shape} and {y.shape}", source
            )
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{source}: {x.shape[0]} samples in x but {y.shape[0]} labels in y", source)
        if x.shape[0] == 0:
            raise DataError(f"{source}: empty dataset (0 samples)", source)
        self.x, self.y = x, _labels_array(y)
        check_finite(self.x, source)
        check_finite(self.y, source, what="label")
        if num_classes is not None:
            check_labels(self, num_classes)

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[idx], self.y[idx, ...]

    def size(self) -> int:
        return int(self.x.shape[0])

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.take(self.x, indices, axis=0), np.take(self.y, indices, axis=0)

    def labels(self) -> np.ndarray:
        return self.y


class SubsetView(IDataView):
    """The samples of `view` at `indices`, in that order (sample i of the subset is view[indices[i]])."""

    def __init__(self, view: IDataView, indices):
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ConfigError(
                f"SubsetView indices must be a 1-D sequence of integers, got {idx.dtype} {idx.shape}"
            )
        idx = idx.astype(np.intp, copy=False)
        n = view.size()
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = idx[(idx < 0) | (idx >= n)][0]
            raise SampleIndexError(
                f"SubsetView index {bad} out of range for {view.source} of {n} samples", view.source
            )
        self.view, self.indices = view, idx
        self.source = f"{view.source}[subset of {idx.size}]"
        self.finite_checked = bool(getattr(view, "finite_checked", False))

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        return self.view.get_item(int(self.indices[idx]))

    def size(self) -> int:
        return int(self.indices.size)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.view.get_batch(self.indices[indices])

    def labels(self) -> np.ndarray:
        return np.take(self.view.labels(), self.indices, axis=0)


def split(view: IDataView, fractions: Sequence[float] = (0.8, 0.2), seed: int | None = 0) -> list[SubsetView]:
    """Disjoint SubsetViews covering `view`, sized by `fractions` (which add up to 1).

    The samples are shuffled by `seed` first (the same seed gives the same split); seed=None splits in order.
    Each part keeps its samples in ascending index order (sequential reads of memory-mapped files).
    """
    try:
        fr = np.asarray(fractions, dtype=np.float64)
    except (TypeError, ValueError):
        fr = np.zeros(0)
    if fr.ndim != 1 or fr.size == 0 or not (fr > 0).all() or abs(fr.sum() - 1.0) > 1e-6:
        raise ConfigError(f"split fractions must be positive and add up to 1, got {fractions!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ConfigError(f"split seed must be an integer >= 0 or None, got {seed!r}")
    n = view.size()
    order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    bounds = np.rint(np.cumsum(fr) * n).astype(np.int64)
    bounds[-1] = n
    starts = np.concatenate([[0], bounds[:-1]])
    sizes = bounds - starts
    if (sizes == 0).any():
        raise DataError(
            f"{view.source}: splitting {n} samples by {tuple(fractions)} leaves a part empty "
            f"(sizes {sizes.tolist()})"
        )
    return [SubsetView(view, np.sort(order[a:b])) for a, b in zip(starts, bounds)]


def class_count(num_classes) -> int:
    """A num_classes argument: a positive integer (ConfigError otherwise)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    return int(num_classes)


def check_labels(view: IDataView, num_classes: int, *, per_sample: Sequence[int] = ()) -> None:
    """Raise DataError unless every label of `view` is an integer class in [0, num_classes): one per sample (shape
    [N]; [N, 1, 1] too, as a [N, C, 1, 1] output's labels may be stored), or, given the model's `per_sample` label
    shape (a segmentation's [H, W]), one per position. Axes of size 1 past the first never matter."""
    num_classes = class_count(num_classes)
    y = np.asarray(view.labels())
    if y.dtype.kind not in "biu":
        raise DataError(
            f"{view.source}: labels are {y.dtype}, not integer classes (num_classes={num_classes})"
        )
    want = [int(d) for d in per_sample if d != 1]
    if y.ndim == 0 or [d for d in y.shape[1:] if d != 1] != want:
        what = (
            f"one integer per position, shape [N, {', '.join(map(str, want))}]"
            if want
            else "one integer per sample, shape [N]"
        )
        raise DataError(f"{view.source}: class labels must be {what}, got shape {y.shape}")
    y = y.reshape(-1)
    per = int(np.prod(want))  # labels per sample
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{view.source}: label {int(y[i])} of sample {i // per} is out of range for num_classes={num_classes} "
            f"(labels span {int(y.min())}..{int(y.max())}; {bad.size} out of range)",
            view.source,
        )
