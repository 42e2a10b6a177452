"""Helpers shared by kernel families (arrays, shape-like inputs -> arrays, Python ints, checked axes)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgetrain.core.errors import ShapeError

# ----------------------------------------------------------------------------------------------------------
# elementwise results


def _arr(r) -> np.ndarray:
    # ufuncs return numpy scalars for 0-d operands; kernels always return arrays.
    return r if type(r) is np.ndarray else np.asarray(r)


def _unary(f: Callable, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return _arr(f(x, out=out))


def _is_text(a: np.ndarray) -> bool:
    return a.dtype.kind in "OUS"


# ----------------------------------------------------------------------------------------------------------
# shape-like inputs and axes


def _ints(a) -> list[int]:
    """A shape-like input (any int dtype, any rank) as Python ints: no int64 overflow in the clamping math."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{what}={axis} is out of range for an input of rank {rank} (accepted [{-rank}, {rank - 1}])"
        )
    return axis % rank


def _axes(axes, rank: int, what: str = "axes") -> list[int]:
    norm = [_axis(a, rank, what) for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"{what}={list(axes)} repeats an axis")
    return norm
