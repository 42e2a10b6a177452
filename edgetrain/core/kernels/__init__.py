"""The kernel table (numpy only): KERNELS, op type -> Kernel, every kernel module registered on its first read.

The kernel modules are a few thousand lines: importing them is most of what `import edgetrain.runtime` would cost,
and only compiling a graph needs them. So KERNELS is a read-only view of the op records' kernels
(edgetrain.core.ops) that imports the modules the first time it is read (looking an op up, listing the ops);
compiled steps hold the kernel functions themselves, so running a step never reads it.
"""

from __future__ import annotations

from _thread import RLock  # not threading: that module costs more to import than this one
from collections.abc import Iterator, Mapping
from importlib import import_module

from edgetrain.core.ops import OPS

from .registry import Kernel, kernel

# the modules whose @kernel registrations make up the table
MODULES = (
    "activations",
    "cast",
    "conv",
    "elementwise",
    "indexing",
    "math",
    "nn_grad",
    "normalization",
    "pool",
    "qcontrib",
    "qproducts",
    "quantized",
    "recurrent",
    "reductions",
    "resize",
    "softmax",
    "tensor",
    "transformer",
)

_lock = RLock()
_loaded = False


def load_all() -> None:
    """Imports every kernel module (once; cheap after). A registration that reads the table meanwhile sees the
    kernels registered so far: the lock is re-entrant."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for name in MODULES:
            import_module(f"{__name__}.{name}")
        _loaded = True


class _Table(Mapping):
    """The records' kernels, complete: every kernel module imported before the first read."""

    __slots__ = ()

    def __getitem__(self, op: str) -> Kernel:
        k = self.get(op)
        if k is None:
            raise KeyError(op)
        return k

    def get(self, op: str, default=None):
        if not _loaded:
            load_all()
        rec = OPS.get(op)
        return default if rec is None or rec.kernel is None else rec.kernel

    def __contains__(self, op: object) -> bool:
        return self.get(op) is not None

    def __iter__(self) -> Iterator[str]:
        if not _loaded:
            load_all()
        return iter([op for op, rec in OPS.items() if rec.kernel is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"KERNELS({len(self)} ops)"


KERNELS: Mapping[str, Kernel] = _Table()


def __getattr__(name: str):
    # the kernel modules as attributes (kernels.conv, kernels.activations), as when this package imported them
    if name in MODULES:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")


__all__ = ["KERNELS", "Kernel", "kernel", "load_all"]
