"""Switches for the optimized paths (numpy only).

Every fast path (a fused graph pattern such as attention or LayerNorm, a training-mode forward that keeps its
trace, a kernel's special case such as a 1x1 convolution as one GEMM) computes what the plain path computes: the
tests turn them off, one by one or all together, and compare. Users never need to.

    with fastpaths.plain("conv1x1"):        # this path off while converting / compiling inside the block
        ...
    with fastpaths.plain():                 # every path off
        ...

EDGETRAIN_PLAIN="conv1x1,attention" (or "all") in the environment turns paths off for a whole process (a test's
subprocess). A path reads its switch when a graph is converted or a step compiled, never per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

_OFF: list[set[str]] = []

# paths whose kernels compute several samples in one matrix product (a 1x1 convolution over few positions as one
# GEMM over the batch): a BLAS may round a sample's result by where it sits in that product, so nodes whose results
# are kept per sample (the feature cache's frozen prefix) compile without them (Interpreter(per_sample=...))
BATCH_MIXING = ("conv1x1_batched",)
BATCH_MIXING_OPS = frozenset({"Conv"})  # the ops whose kernels have such a path: the others need no care


def _from_env() -> set[str]:
    raw = os.environ.get("EDGETRAIN_PLAIN", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def enabled(name: str) -> bool:
    """Whether the fast path `name` is on (the default), for a pass or a compiler deciding now."""
    off = _from_env().union(*_OFF) if _OFF else _from_env()
    return not ("all" in off or name in off)


@contextmanager
def plain(*names: str) -> Iterator[None]:
    """Turns off the named fast paths (every path when none is named) inside the block."""
    _OFF.append(set(names) if names else {"all"})
    try:
        yield
    finally:
        _OFF.pop()
