"""An IDataView -> fingerprint {"size", "sha256"}: a cheap check that a dataset is the one a checkpoint saw."""

from __future__ import annotations

import hashlib

import numpy as np

from .views import IDataView

SAMPLES = 64
_TAG = (
    b"loaders.fingerprint/1\0"  # changes whenever what is hashed changes, so old and new never compare equal
)


def sample_indices(n: int, count: int = SAMPLES) -> np.ndarray:
    """Up to `count` indices of n: the first, the last and evenly spaced between (all of them when n <= count)."""
    if n <= count:
        return np.arange(n)
    return np.unique(np.rint(np.linspace(0, n - 1, count)).astype(np.int64))


def _update(h, a: np.ndarray) -> None:
    a = np.asarray(a)
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))  # the same bytes on any machine
    h.update(f"{a.dtype.str}{list(a.shape)}\0".encode())
    h.update(a.tobytes())


def fingerprint(view: IDataView) -> dict:
    """{"size": number of samples, "sha256": hex digest of the size and, for up to 64 samples (first, last,
    evenly spaced), each sample's index, x's dtype, shape and bytes, and y's}.

    Reads only those samples, so it stays cheap for large memory-mapped data; a change to a sample outside
    them goes unnoticed (this tells datasets apart; it does not prove two are equal)."""
    n = int(view.size())
    h = hashlib.sha256(_TAG)
    h.update(n.to_bytes(8, "little"))
    indices = sample_indices(n)
    if indices.size:
        xs, ys = view.get_batch(indices)
        for k, i in enumerate(indices.tolist()):
            h.update(int(i).to_bytes(8, "little"))
            _update(h, xs[k])
            _update(h, ys[k, ...])
    return {"size": n, "sha256": h.hexdigest()}
