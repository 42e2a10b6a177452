"""Resize kernel (array, roi/scales/sizes -> resampled array): nearest, linear and cubic, per-axis matrices."""

from __future__ import annotations

import math

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError

from ._util import _axes, _ints
from .registry import kernel

# ------------------------------------------------ Resize
_RESIZE_MODES = ("nearest", "linear", "cubic")
_CTMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UnsupportedError(f"Resize: {name}={value!r} is not supported; supported: {list(choices)}")


@kernel("Resize")
def resize(
    X: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> np.ndarray:
    ctm = coordinate_transformation_mode
    _check_choice("mode", mode, _RESIZE_MODES)
    _check_choice("coordinate_transformation_mode", ctm, _CTMS)
    _check_choice("nearest_mode", nearest_mode, _NEAREST_MODES)
    _check_choice("keep_aspect_ratio_policy", keep_aspect_ratio_policy, _ASPECT_POLICIES)
    if mode != "nearest" and X.dtype.kind != "f":
        raise UnsupportedError(
            f"Resize: mode={mode!r} supports float inputs only, got {X.dtype} "
            "(mode='nearest' takes every dtype)"
        )
    plan = resize_plan(X.shape, roi, scales, sizes, axes, keep_aspect_ratio_policy)
    work = X.dtype if X.dtype == np.float64 or mode == "nearest" else np.dtype(np.float32)
    y, masks = X, []
    for a, n_out, rscale, r0, r1 in sorted(plan, key=lambda p: p[1] / max(X.shape[p[0]], 1)):  # shrink first
        n_in = X.shape[a]
        if rscale == 1 and n_out == n_in and (ctm != "tf_crop_and_resize" or (r0, r1) == (0, 1)):
            continue  # identity along this axis
        x = source_coords(ctm, n_out, n_in, rscale, r0, r1)
        if ctm == "tf_crop_and_resize":
            masks.append((a, (x < 0) | (x > n_in - 1)))
        if mode == "nearest":
            y = np.take(y, nearest_index(x, nearest_mode, n_in), axis=a)
        else:
            w = resize_weights(
                x.astype(np.float64),
                n_in,
                mode,
                cubic_coeff_a,
                rscale if antialias else 1.0,
                exclude_outside,
                normalize=bool(antialias or exclude_outside),
            )
            y = _matmul_along(y.astype(work, copy=False), w.astype(work), a)
    if masks:
        hit = np.zeros([1] * X.ndim, bool)
        for a, m in masks:
            hit = hit | m.reshape([-1 if i == a else 1 for i in range(X.ndim)])
        y = np.array(y, dtype=work)  # a nearest result may still be a view of X
        np.copyto(y, np.asarray(extrapolation_value, dtype=work), where=np.broadcast_to(hit, y.shape))
    return y.astype(X.dtype, copy=False) if y is not X else y.copy()


def resize_plan(shape, roi, scales, sizes, axes, policy) -> list[tuple[int, int, float, float, float]]:
    """(axis, output size, scale, roi start, roi end) per resized axis, with onnxruntime's float32 scales."""
    f32 = np.float32
    r = len(shape)
    ax = list(range(r)) if axes is None else _axes(axes, r, "axes")
    scales = None if scales is None or np.size(scales) == 0 else np.asarray(scales, f32).reshape(-1)
    sizes = None if sizes is None or np.size(sizes) == 0 else _ints(sizes)
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize: give exactly one of the inputs scales and sizes")
    given = scales if sizes is None else sizes
    rois = [0.0] * len(ax) + [1.0] * len(ax) if roi is None or np.size(roi) == 0 else _floats(roi)
    if len(given) != len(ax) or len(rois) != 2 * len(ax):
        raise ShapeError(
            f"Resize: scales/sizes ({len(given)}) and roi ({len(rois)}) must hold 1 and 2 "
            f"values per resized axis ({len(ax)} axes of input shape {list(shape)})"
        )
    if sizes is None:
        if min(scales) <= 0:
            raise ShapeError(f"Resize: scales={scales.tolist()} must be > 0")
        rs = [f32(s) for s in scales]
        outs = [int(np.floor(s * f32(shape[a]))) for a, s in zip(ax, rs, strict=True)]
    else:
        rs = [f32(n) / f32(shape[a]) for a, n in zip(ax, sizes, strict=True)]
        outs = list(sizes)
        if policy != "stretch":
            s = min(rs) if policy == "not_larger" else max(rs)
            rs = [s] * len(ax)
            outs = [int(np.floor(s * f32(shape[a]) + f32(0.5))) for a in ax]  # round half up
    return [
        (a, n, float(s), rois[i], rois[i + len(ax)])
        for i, (a, n, s) in enumerate(zip(ax, outs, rs, strict=True))
    ]


def _floats(a) -> list[float]:
    return [float(v) for v in np.asarray(a, np.float32).reshape(-1)]


def source_coords(ctm: str, n_out: int, n_in: int, rscale: float, r0: float, r1: float) -> np.ndarray:
    """x_original of every output index, in float32 and in onnxruntime's order of operations: nearest-pixel
    rounding at exact halves must come out the same."""
    f = np.float32
    y, s, half = np.arange(n_out, dtype=f), f(rscale), f(0.5)
    if ctm == "half_pixel":
        return (y + half) / s - half
    if ctm == "half_pixel_symmetric":  # onnxruntime adds the half pixel in double here
        offset = f(n_in) / f(2) * (f(1) - f(n_out) / (s * f(n_in)))
        return (float(offset) + (y.astype(np.float64) + 0.5) / float(s) - 0.5).astype(f)
    if ctm == "pytorch_half_pixel":
        return (y + half) / s - half if n_out > 1 else np.zeros(n_out, f)
    if ctm == "align_corners":
        return y * f(n_in - 1) / f(n_out - 1) if n_out > 1 else np.zeros(n_out, f)
    if ctm == "asymmetric":
        return y / s
    r0, r1 = f(r0), f(r1)  # tf_crop_and_resize
    if n_out > 1:
        return r0 * f(n_in - 1) + y * (r1 - r0) * f(n_in - 1) / f(n_out - 1)
    return np.full(n_out, f(0.5 * (float(r0) + float(r1)) * (n_in - 1)), f)


def nearest_index(x: np.ndarray, nearest_mode: str, n_in: int) -> np.ndarray:
    fl = np.floor(x)
    if nearest_mode == "round_prefer_floor":
        i = fl + (x - fl > 0.5)
    elif nearest_mode == "round_prefer_ceil":
        i = fl + (x - fl >= 0.5)
    else:
        i = fl if nearest_mode == "floor" else np.ceil(x)
    return np.clip(i, 0, n_in - 1).astype(np.intp)


def resize_weights(
    x: np.ndarray, n_in: int, mode: str, a: float, rscale: float, exclude_outside: int, normalize: bool
) -> np.ndarray:
    """The (n_out, n_in) matrix of one axis: linear or cubic taps around each x, stretched by 1/rscale when
    antialiasing a downscale (rscale < 1), edge-clamped or (exclude_outside) dropped outside the input."""
    radius = 1 if mode == "linear" else 2
    inv = min(rscale, 1.0)
    support = radius / inv
    j = np.floor(x - support)[:, None] + 1 + np.arange(2 * math.ceil(support) + 1)
    t = np.abs(j - x[:, None]) * inv
    if mode == "linear":
        w = np.maximum(1 - t, 0)
    else:
        far = np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0)
        w = np.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1, far)
    if exclude_outside:
        w *= (j >= 0) & (j < n_in)
    if normalize:
        total = w.sum(axis=1, keepdims=True)
        w /= np.where(total == 0, 1, total)
    rows = np.arange(len(x))[:, None] * n_in
    flat = (rows + np.clip(j, 0, n_in - 1).astype(np.int64)).reshape(-1)
    return np.bincount(flat, weights=w.reshape(-1), minlength=len(x) * n_in).reshape(len(x), n_in)


def _matmul_along(y: np.ndarray, w: np.ndarray, a: int) -> np.ndarray:
    """Applies the (n_out, n_in) matrix w along axis a of y: one BLAS call (batched over the leading axes)."""
    if a == y.ndim - 1:
        return y @ w.T
    shp = y.shape
    y3 = y.reshape(math.prod(shp[:a]), shp[a], math.prod(shp[a + 1 :]))
    return np.matmul(w, y3).reshape(shp[:a] + (w.shape[0],) + shp[a + 1 :])
