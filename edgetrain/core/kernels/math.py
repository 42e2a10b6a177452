"""Math kernels (arrays -> arrays): MatMul, Gemm, Einsum, CumSum; the helpers the math families share (the
softmaxes in softmax.py, the reductions in reductions.py, the normalizations and Dropout in normalization.py); and
the convention of the lean specializations, with MatMul's and Gemm's."""

from __future__ import annotations

import re

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ir import Node, TensorInfo

from .registry import kernel

# -------------------------------------------------------------------------------- helpers


def _axis(op: str, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{op}: {name}={axis} is out of range for an input of rank {rank} "
            f"(supported: {-rank}..{rank - 1})"
        )
    return axis % rank


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The float dtype to compute in: float16 in float32, like onnxruntime; integers in float64."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return dtype
    return np.dtype(np.float64) if dtype.kind in "iub" else np.dtype(np.float32)


def _store(y: np.ndarray, dtype: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """y (computed in a work dtype) as the result: cast to dtype, into out when given."""
    if out is not None:
        if y is not out:
            np.copyto(out, y, casting="unsafe")
        return out
    return y if y.dtype == dtype else y.astype(dtype)


def _scale_shift(d: np.ndarray, scale, shift, dtype: np.dtype, out: np.ndarray | None) -> np.ndarray:
    """d * scale + shift, overwriting the temporary d, or straight into out when no cast is needed."""
    y = out if out is not None and d.dtype == dtype else d
    np.multiply(d, scale, out=y, casting="same_kind")
    if shift is not None:
        np.add(y, shift, out=y, casting="same_kind")
    return _store(y, dtype, out)


# -------------------------------------------------------------------------------- MatMul, Gemm


def _matmul(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    try:
        if a.dtype == np.float16 and b.dtype == np.float16:
            # numpy's float16 matmul has no BLAS path and accumulates in float16: go through float32.
            return _store(np.asarray(np.matmul(a.astype(np.float32), b.astype(np.float32))), a.dtype, out)
        if (
            a.ndim == 2
            and b.ndim == 2
            and a.dtype == b.dtype
            and a.dtype.kind == "f"
            and a.dtype.itemsize >= 4
        ):
            # np.dot goes to BLAS gemm for every 2-D layout; np.matmul does not for some (an outer product, k=1,
            # is 5-7x slower through it): the same products either way
            if out is None or (out.flags.c_contiguous and out.dtype == a.dtype):
                return np.dot(a, b, out=out)
        # np.asarray: 1-D @ 1-D gives a numpy scalar.
        return np.asarray(np.matmul(a, b, out=out))
    except ValueError as e:
        raise ShapeError(
            f"{op}: input shapes {a.shape} and {b.shape} do not fit "
            f"(inner dimensions must match, batch dimensions broadcast): {e}"
        ) from e


@kernel("MatMul")
def matmul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return _matmul("MatMul", a, b, out)


@kernel("Gemm")
def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    a = a.T if transA else a
    b = b.T if transB else b
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"Gemm: A{'^T' if transA else ''} {a.shape} and B{'^T' if transB else ''} {b.shape} "
            "must be matrices (M, K) and (K, N)"
        )
    use_c = c is not None and beta != 0
    if use_c and not _broadcasts_to(c.shape, (a.shape[0], b.shape[1])):
        raise ShapeError(f"Gemm: C {c.shape} does not broadcast to the result {(a.shape[0], b.shape[1])}")
    y = _matmul("Gemm", a, b, out)
    # In place on y; 'unsafe' only matters for integer Gemm with a fractional alpha/beta.
    if alpha != 1:
        np.multiply(y, alpha, out=y, casting="unsafe")
    if use_c:
        np.add(y, c if beta == 1 else beta * c, out=y, casting="unsafe")
    return y


# -------------------------------------------------------------------------------- Einsum, CumSum


_EQUATION = re.compile(r"^\s*([A-Za-z.\s]*)((\s*,\s*[A-Za-z.\s]*)*)(->\s*[A-Za-z.\s]*)?$")


@kernel("Einsum")
def einsum(*inputs: np.ndarray, equation: str) -> np.ndarray:
    lhs = equation.split("->")[0]
    if not _EQUATION.match(equation) or lhs.count(",") + 1 != len(inputs):
        raise UnsupportedError(
            f"Einsum: equation={equation!r} is not valid for {len(inputs)} inputs "
            "(supported: numpy einsum syntax, e.g. 'bij,bjk->bik', '...ii->...i')"
        )
    # Extension float types (ml_dtypes' bfloat16) have no einsum loops: compute in float32, cast back.
    dt = inputs[0].dtype
    ops = [x.astype(np.float32) if x.dtype.kind == "V" else x for x in inputs]
    try:
        res = np.asarray(np.einsum(equation, *ops, optimize=True))
    except ValueError as e:
        raise ShapeError(
            f"Einsum: equation={equation!r} does not fit input shapes {[x.shape for x in inputs]}: {e}"
        ) from e
    # einsum may return a view of an input ('ij->ji'); outputs must own their memory for the arena.
    if any(np.may_share_memory(res, x) for x in ops):
        res = res.copy()
    return res if res.dtype == dt else res.astype(dt)


@kernel("CumSum")
def cumsum(
    x: np.ndarray, axis: np.ndarray, *, exclusive: int = 0, reverse: int = 0, out: np.ndarray | None = None
) -> np.ndarray:
    if np.size(axis) != 1:
        raise ShapeError(f"CumSum: axis must be a scalar tensor, got shape {np.shape(axis)}")
    ax = _axis("CumSum", int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    y = np.empty_like(x) if out is None else out
    xs, ys = (np.flip(x, ax), np.flip(y, ax)) if reverse else (x, y)
    if exclusive:
        n = x.shape[ax]

        def part(a, start, stop):
            return a[(slice(None),) * ax + (slice(start, stop),)]

        part(ys, 0, 1)[...] = 0
        np.cumsum(part(xs, 0, max(n - 1, 0)), axis=ax, dtype=x.dtype, out=part(ys, 1, None))
    else:
        np.cumsum(xs, axis=ax, dtype=x.dtype, out=ys)
    return y


# -------------------------------------------------------------------------------- lean specializations
# A kernel's `lean` builder: (node, input TensorInfos, constant inputs, the output's buffer or None, a dict the
# program's builders share) -> a function of the node's inputs, or None where the plain kernel must run. The
# interpreter asks for one when it compiles a training step (fastpaths "lean_kernels"): the step's shapes are
# static and its feeds checked, so the checks and dispatch a small batch pays on every call are done here once.
# Each runs the plain kernel's numpy calls in its order (bit for bit its result), only fewer of the others.

# np.dot without its __array_function__ dispatch (a Python call per product): the same C function
_DOT = getattr(np.dot, "_implementation", np.dot)


def _blas_info(info: TensorInfo | None) -> bool:
    return info is not None and len(info.shape) == 2 and info.dtype.kind == "f" and info.dtype.itemsize >= 4


def _writable(out: np.ndarray | None, dtype: np.dtype) -> bool:
    """Whether out is a buffer np.dot writes straight into (else the plain kernel goes through np.matmul)."""
    return out is None or (out.flags.c_contiguous and out.dtype == dtype)


def _gemm_lean(node: Node, infos, consts, out, shared):
    # np.dot into the output's buffer with the transposes as views (BLAS reads them as they are), then the bias
    # added there: gemm()'s calls without its checks and broadcasting bookkeeping.
    a, b = infos[0], infos[1]
    c = infos[2] if len(infos) > 2 else None
    at = node.attrs
    ta, tb = bool(at.get("transA", 0)), bool(at.get("transB", 0))
    if at.get("alpha", 1.0) != 1 or not (_blas_info(a) and _blas_info(b)) or a.dtype != b.dtype:
        return None
    m, k = a.shape[::-1] if ta else a.shape
    k2, n = b.shape[::-1] if tb else b.shape
    use_c = c is not None and at.get("beta", 1.0) != 0
    if k != k2 or not _writable(out, a.dtype):
        return None
    if use_c and (at.get("beta", 1.0) != 1 or c.dtype != a.dtype or not _broadcasts_to(c.shape, (m, n))):
        return None
    dot, add = _DOT, np.add

    def gemm_lean(a, b, c=None):
        y = dot(a.T if ta else a, b.T if tb else b, out=out)
        if use_c:
            add(y, c, out=y)
        return y

    return gemm_lean


def _matmul_lean(node: Node, infos, consts, out, shared):
    a, b = infos
    if not (_blas_info(a) and _blas_info(b)) or a.dtype != b.dtype or not _writable(out, a.dtype):
        return None
    dot = _DOT
    return lambda a, b: dot(a, b, out=out)


gemm.lean = _gemm_lean
matmul.lean = _matmul_lean
