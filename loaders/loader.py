"""An IDataView -> batches (X, Y) in a deterministic, resumable order: DataLoader."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import numpy as np

from .errors import ConfigError, DataError
from .views import IDataView, first_nonfinite

Transform = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
_STATE_KEYS = ("epoch", "position", "seed", "shuffle", "size")


def _is_int(v) -> bool:
    """An integer, or a float holding a whole number (4.0): not a bool, a string or None."""
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, numbers.Integral):
        return True
    return isinstance(v, (float, np.floating)) and math.isfinite(v) and v == int(v)


class DataLoader:
    """Batches of a view: X stacked as the view gives it, Y int64 for class labels.

    `augment(X, Y, epoch=, indices=, seed=)` (e.g. an Augment) runs first on the raw batch, with the epoch, the
    view's indices of its samples and the loader's seed, so that its random draws are the same when a run is
    resumed; then `transform(x, y)` on each sample, then `batch_transform(X, Y)` (e.g. a Preprocess that adapts,
    casts and scales) on the whole batch. None of them is part of the state (the seed is). Shuffling draws a
    fresh permutation per epoch from (seed, epoch) with numpy's Generator, so a run is repeatable from its seed
    (for a given numpy version). The loader is stateful, like MegEngine's: `next()` returns the next batch and
    rolls over into the next epoch by itself; `for X, Y in loader` runs what is left of the current epoch (all
    of it unless stopped or restored mid-epoch). `state()` is a JSON-able dict; `restore(state)` makes the next batch
    exactly the one that would have come next.
    """

    def __init__(
        self,
        view: IDataView,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        transform: Transform | None = None,
        batch_transform: Transform | None = None,
        augment: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None,
    ):
        if not _is_int(batch_size) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if seed is not None and not (_is_int(seed) and seed >= 0):
            raise ConfigError(f"seed must be an integer >= 0 or None, got {seed!r}")
        if not all(callable(getattr(view, m, None)) for m in ("size", "get_batch")):
            raise ConfigError(
                f"DataLoader needs an IDataView (e.g. loaders.open_data(path)), got {type(view).__name__}"
            )
        n = view.size()
        if n == 0:
            raise DataError(f"{view.source}: empty dataset (0 samples), nothing to load", view.source)
        if drop_last and n < batch_size:
            raise DataError(
                f"{view.source}: {n} samples make no full batch of {batch_size} and drop_last=True drops it",
                view.source,
            )
        self.view, self.batch_size = view, int(batch_size)
        self.shuffle, self.drop_last, self.transform = bool(shuffle), bool(drop_last), transform
        self.batch_transform = batch_transform
        if augment is not None and not callable(augment):
            raise ConfigError(
                f"augment must be callable (e.g. loaders.Augment), got {type(augment).__name__}"
            )
        self.augment = augment
        # without a seed, pick one now so that state() can still reproduce the run
        self.seed = int(np.random.default_rng().integers(2**62)) if seed is None else int(seed)
        self._n = n
        self._epoch, self._pos = 0, 0
        self._order_epoch, self._order = -1, None

    # -- the order ---------------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (0-based)."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._n // self.batch_size if self.drop_last else -(-self._n // self.batch_size)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self._epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self._epoch]).permutation(self._n)
            else:
                self._order = np.arange(self._n)
            self._order_epoch = self._epoch
        return self._order

    def _epoch_done(self) -> bool:
        left = self._n - self._pos
        return left <= 0 or (self.drop_last and left < self.batch_size)

    # -- batches ------------------------------------------------------------------------------------------
    def _batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.view.get_batch(indices)
        if not getattr(self.view, "finite_checked", False):  # a view of the user's own: one pass per batch
            for a, what in ((x, "feature"), (y, "label")):
                found = first_nonfinite(a)
                if found is not None:
                    k, pos, value, count = found
                    at = f" at position {list(pos)}" if pos else ""
                    raise DataError(
                        f"{self.view.source}: sample {int(indices[k])} holds a non-finite {what} ({value}{at}); "
                        f"{count} of the {len(indices)} samples of this batch do. NaN and inf cannot be trained "
                        f"on: fix or drop those samples",
                        self.view.source,
                    )
        if self.augment is not None:  # before anything else: it sees the samples as the view gives them
            x, y = self.augment(x, y, epoch=self._epoch, indices=indices, seed=self.seed)
        if self.transform is not None:
            pairs = [self.transform(x[i], y[i, ...]) for i in range(len(indices))]
            x, y = np.stack([p[0] for p in pairs]), np.stack([np.asarray(p[1]) for p in pairs])
        if self.batch_transform is not None:  # e.g. a Preprocess: one numpy call per batch, not per sample
            x, y = self.batch_transform(x, y)
            y = np.asarray(y)
        if y.dtype.kind in "biu":
            y = y.astype(np.int64, copy=False)
        return x, y

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch (X, Y); after an epoch's last batch the next call starts the following epoch."""
        if self._epoch_done():  # never after next() or restore(), which roll over eagerly; kept as a guard
            self._epoch, self._pos = self._epoch + 1, 0
        indices = self._epoch_order()[self._pos : self._pos + self.batch_size]
        batch = self._batch(indices)
        # advance before handing the batch out, so state() now points at the batch after this one
        self._pos += len(indices)
        if self._epoch_done():
            self._epoch, self._pos = self._epoch + 1, 0
        return batch

    __next__ = next

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The rest of the current epoch, batch by batch (the whole epoch when it has not started)."""
        epoch = self._epoch
        while self._epoch == epoch:  # next() moves to the following epoch right after an epoch's last batch
            yield self.next()

    # -- resuming -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        """Where the loader stands, as JSON values: epoch, position (samples of this epoch already given out),
        seed, and shuffle and size to check on restore that the state fits this loader."""
        return {
            "epoch": self._epoch,
            "position": self._pos,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "size": self._n,
        }

    def restore(self, state: dict) -> None:
        """Continue from a state() so that the next batch is the one that came next when it was taken."""
        if not isinstance(state, dict):
            raise ConfigError(
                f"loader state must be a dict from DataLoader.state(), got {type(state).__name__}"
            )
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(f"loader state lacks {missing}; a DataLoader.state() has {list(_STATE_KEYS)}")
        for key in ("epoch", "position", "seed", "size"):
            if not _is_int(state[key]):
                raise ConfigError(f"loader state has {key} {state[key]!r}, not an integer")
        if state["seed"] < 0:
            raise ConfigError(f"loader state has seed {state['seed']!r}, not an integer >= 0")
        if not isinstance(state["shuffle"], (bool, np.bool_)):
            raise ConfigError(f"loader state has shuffle {state['shuffle']!r}, not true or false")
        if int(state["size"]) != self._n:
            raise ConfigError(
                f"loader state is for a dataset of {state['size']} samples, this one has {self._n}"
            )
        if bool(state["shuffle"]) != self.shuffle:
            raise ConfigError(
                f"loader state has shuffle={state['shuffle']}, this loader shuffle={self.shuffle}"
            )
        epoch, pos = int(state["epoch"]), int(state["position"])
        if not 0 <= epoch < 2**62 or not 0 <= pos <= self._n:
            raise ConfigError(
                f"loader state has epoch {epoch}, position {pos}: out of range for {self._n} samples"
            )
        self.seed, self._epoch, self._pos = int(state["seed"]), epoch, pos
        self._order_epoch = -1
        if self._epoch_done():  # e.g. a state taken by a loader with another batch size or drop_last
            self._epoch, self._pos = self._epoch + 1, 0
