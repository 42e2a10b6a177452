"""Window geometry and the helpers the convolution and pooling kernels share (numpy only; no kernels here): a
window's output shape and explicit pads as onnxruntime resolves them (conv_output_shape, pool_output_shape,
conv_transpose_output_shape), the dtype a kernel computes in, the padded input and the kernel offsets' strided
slices. The gradient kernels (nn_grad.py) and the static bounds (edgetrain.graph.bounds) use them too."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError

AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
FLOAT_DTYPES = (np.float16, np.float32, np.float64)

Ints = tuple[int, ...]


# ---------------------------------------------------------------- geometry (shared with the gradient kernels)


def per_axis(values: Sequence[int] | None, n: int, default: int, name: str) -> Ints:
    """An attribute with one value per spatial axis (strides, dilations, ...): n ints, `default` when absent."""
    if values is None or len(values) == 0:
        return (default,) * n
    if len(values) != n:
        raise ShapeError(f"{name}={list(values)} has {len(values)} values, expected {n}")
    return tuple(int(v) for v in values)


def _check_auto_pad(auto_pad: str) -> None:
    if auto_pad not in AUTO_PADS:
        raise UnsupportedError(f"auto_pad={auto_pad!r} is not supported; use one of {', '.join(AUTO_PADS)}")


def _explicit_pads(pads: Sequence[int] | None, nd: int) -> Ints:
    p = per_axis(pads, 2 * nd, 0, "pads")
    if min(p) < 0:
        raise UnsupportedError(f"pads={list(p)}: negative pads are not supported; crop with Slice instead")
    return p


def _key(values: Sequence[int] | None) -> Ints | None:
    return None if values is None else tuple(int(v) for v in values)


def _window_geometry(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    *,
    auto_pad: str,
    dilations,
    pads,
    strides,
    ceil_mode: int,
    same_uses_dilation: bool,
) -> tuple[Ints, Ints]:
    # memoized on hashable arguments: a training step asks for the same few geometries every time, and working
    # them out costs more than a small layer's arithmetic
    return _cached_window_geometry(
        _key(in_shape),
        _key(kernel_shape),
        auto_pad,
        _key(dilations),
        _key(pads),
        _key(strides),
        int(ceil_mode),
        same_uses_dilation,
    )


@functools.lru_cache(maxsize=512)
def _cached_window_geometry(
    in_shape: Ints,
    kernel_shape: Ints,
    auto_pad: str,
    dilations: Ints | None,
    pads: Ints | None,
    strides: Ints | None,
    ceil_mode: int,
    same_uses_dilation: bool,
) -> tuple[Ints, Ints]:
    nd = len(in_shape)
    _check_auto_pad(auto_pad)
    k = per_axis(kernel_shape, nd, 1, "kernel_shape")
    s = per_axis(strides, nd, 1, "strides")
    d = per_axis(dilations, nd, 1, "dilations")
    if min(s + d + k, default=1) < 1:
        raise UnsupportedError(f"kernel_shape={list(k)}, strides={list(s)}, dilations={list(d)} must be >= 1")
    p = list(_explicit_pads(pads, nd)) if auto_pad == "NOTSET" else [0] * (2 * nd)
    out = []
    for i, n in enumerate(in_shape):
        dk = (k[i] - 1) * d[i] + 1
        if auto_pad.startswith("SAME"):
            # onnxruntime sizes SAME pool padding with the undilated kernel (Conv uses the dilated one); a
            # negative need (stride > kernel) means no padding, as onnxruntime's Conv does.
            need = max(0, (-(-n // s[i]) - 1) * s[i] + (dk if same_uses_dilation else k[i]) - n)
            p[i] = need // 2 if auto_pad == "SAME_UPPER" else (need + 1) // 2
            p[i + nd] = need - p[i]
        span = n + p[i] + p[i + nd] - dk
        if span < 0:
            raise ShapeError(
                f"kernel_shape={list(k)} with dilations={list(d)} is larger than the padded "
                f"input {list(in_shape)} (pads={p}) along spatial axis {i}"
            )
        o = span // s[i] + 1
        if ceil_mode:
            o = -(-span // s[i]) + 1
            if (o - 1) * s[i] >= n + p[i]:  # the last window must start inside the input or its begin pad
                o -= 1
        out.append(o)
    return tuple(out), tuple(p)


def conv_output_shape(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> tuple[Ints, Ints]:
    """Conv's spatial output shape and the explicit pads [begin..., end...] it applies, given the input's and
    the kernel's spatial shapes; auto_pad is resolved as onnxruntime does (SAME_UPPER puts an odd total pad at
    the end, SAME_LOWER at the beginning, with the dilated kernel)."""
    return _window_geometry(
        in_shape,
        kernel_shape,
        auto_pad=auto_pad,
        dilations=dilations,
        pads=pads,
        strides=strides,
        ceil_mode=0,
        same_uses_dilation=True,
    )


def pool_output_shape(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> tuple[Ints, Ints]:
    """MaxPool/AveragePool/LpPool's spatial output shape and explicit pads [begin..., end...], as onnxruntime
    computes them: ceil_mode rounds the window count up but drops a last window that would start in the end
    padding; SAME_* pads are sized with the undilated kernel."""
    return _window_geometry(
        in_shape,
        kernel_shape,
        auto_pad=auto_pad,
        dilations=dilations,
        pads=pads,
        strides=strides,
        ceil_mode=ceil_mode,
        same_uses_dilation=False,
    )


def conv_transpose_output_shape(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    output_padding: Sequence[int] | None = None,
    output_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> tuple[Ints, Ints]:
    """ConvTranspose's spatial output shape and the pads [begin..., end...] cropped from the full result
    full = (in - 1) * stride + output_padding + dilated kernel, as onnxruntime computes them. A given
    (spatial) output_shape fixes the output, zero-extending the full result when larger; auto_pad SAME_*
    without it gives min(full, in * stride). The total crop goes with its odd unit at the end
    for SAME_UPPER, at the beginning otherwise (NOTSET, VALID, SAME_LOWER)."""
    nd = len(in_shape)
    _check_auto_pad(auto_pad)
    k = per_axis(kernel_shape, nd, 1, "kernel_shape")
    s = per_axis(strides, nd, 1, "strides")
    d = per_axis(dilations, nd, 1, "dilations")
    adj = per_axis(output_padding, nd, 0, "output_padding")
    target = per_axis(output_shape, nd, -1, "output_shape")
    p = list(_explicit_pads(pads, nd)) if auto_pad == "NOTSET" else [0] * (2 * nd)
    out = []
    for i, n in enumerate(in_shape):
        full = (n - 1) * s[i] + adj[i] + (k[i] - 1) * d[i] + 1
        if target[i] >= 0 or auto_pad.startswith("SAME"):
            total = max(0, full - (target[i] if target[i] >= 0 else n * s[i]))
            p[i] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            p[i + nd] = total - p[i]
        o = target[i] if target[i] >= 0 else full - p[i] - p[i + nd]
        if o < 1:
            raise ShapeError(
                f"ConvTranspose output size {o} < 1 along spatial axis {i} (input "
                f"{list(in_shape)}, kernel_shape={list(k)}, pads={p})"
            )
        out.append(o)
    return tuple(out), tuple(p)


# ---------------------------------------------------------------- shared helpers


def compute_dtype(x: np.ndarray, op: str) -> np.dtype:
    """float16 is computed in float32 (numpy's float16 matmul and sums are slow and lose precision)."""
    if x.dtype.type not in FLOAT_DTYPES:
        raise UnsupportedError(
            f"{op} input dtype {x.dtype} is not supported; use float16, float32 or float64"
        )
    return np.dtype(np.float32) if x.dtype == np.float16 else x.dtype


def _target(out: np.ndarray | None, shape: Ints, dtype: np.dtype) -> np.ndarray:
    if out is not None and out.dtype == dtype and out.flags.c_contiguous:
        return out
    return np.empty(shape, dtype)


def deliver(y: np.ndarray, out: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    if out is not None:
        if y is not out:
            np.copyto(out, y, casting="unsafe")
        return out
    return y if y.dtype == dtype else y.astype(dtype)


def spatial_rank(x: np.ndarray, op: str, kernel_shape: Sequence[int] | None = None) -> int:
    nd = x.ndim - 2
    if nd < 1:
        raise ShapeError(f"{op} needs an input of shape [N, C, spatial...], got {list(x.shape)}")
    if kernel_shape is not None and len(kernel_shape) != nd:
        raise ShapeError(
            f"{op} kernel_shape={list(kernel_shape)} does not match the {nd} spatial axes of "
            f"the input {list(x.shape)}"
        )
    return nd


def pad_input(x: np.ndarray, pads: Ints, out_shape: Ints, k: Ints, s: Ints, d: Ints, fill) -> np.ndarray:
    """x placed at its begin pads inside a fill-valued array just large enough for every window; x itself
    (no copy) when no window reaches outside it."""
    nd = len(out_shape)
    ext = tuple(
        max(pads[i] + x.shape[2 + i], (out_shape[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i in range(nd)
    )
    if not any(pads[:nd]) and ext == x.shape[2:]:
        return x
    xp = np.full(x.shape[:2] + ext, fill, x.dtype)
    xp[(slice(None),) * 2 + tuple(slice(pads[i], pads[i] + x.shape[2 + i]) for i in range(nd))] = x
    return xp


def sliding_windows(k: Ints, s: Ints, d: Ints, out_shape: Ints) -> Iterator[tuple[Ints, tuple]]:
    """Each kernel offset (row-major) with the index of the strided slice of the padded input it reads."""
    return iter(_windows(_key(k), _key(s), _key(d), _key(out_shape)))


@functools.lru_cache(maxsize=512)
def _windows(k: Ints, s: Ints, d: Ints, out_shape: Ints) -> tuple[tuple[Ints, tuple], ...]:
    return tuple(
        (
            off,
            (slice(None),) * 2
            + tuple(
                slice(o * d[i], o * d[i] + (out_shape[i] - 1) * s[i] + 1, s[i]) for i, o in enumerate(off)
            ),
        )
        for off in np.ndindex(*k)
    )


def pool_setup(x, op, kernel_shape, auto_pad, ceil_mode, dilations, pads, strides):
    nd = spatial_rank(x, op, kernel_shape)
    oshape, p = pool_output_shape(
        x.shape[2:],
        kernel_shape,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        dilations=dilations,
        pads=pads,
        strides=strides,
    )
    return (
        oshape,
        p,
        tuple(int(v) for v in kernel_shape),
        per_axis(strides, nd, 1, "strides"),
        per_axis(dilations, nd, 1, "dilations"),
    )
