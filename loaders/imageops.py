"""Images as numpy arrays -> resized, cropped, flipped or rotated arrays (numpy only): resize, center_crop, hflip,
rotate.

Every function works on the last three axes of an array: H, W, C for layout="nhwc" (channels last, as images
are: one image [H, W, C] or a batch [N, H, W, C]), or C, H, W for layout="nchw" (channels first: [C, H, W] or
[N, C, H, W]). Leading axes, if any, are carried along.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import ConfigError, LimitError
from .limits import limit_argument, size_text

LAYOUTS = ("nhwc", "nchw")
# the largest array one resize makes (its output, or the intermediate of its first axis): an image resized to
# 8192 x 8192 RGB in float32 is 768 MiB; a size beyond any training input is refused before it is allocated
RESIZE_MAX_BYTES = 1 << 30


def spatial_axes(x: np.ndarray, layout: str, what: str = "image") -> tuple[int, int]:
    """The (H, W) axes of `x` for `layout`, counted from the end; ConfigError for an unknown layout or an array of
    fewer than 3 axes (not an image)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    if np.ndim(x) < 3:
        form = "[H, W, C] or [N, H, W, C]" if layout == "nhwc" else "[C, H, W] or [N, C, H, W]"
        raise ConfigError(
            f"{what}: an image is {form} (layout={layout!r}), got an array of shape {list(np.shape(x))}"
        )
    return (-3, -2) if layout == "nhwc" else (-2, -1)


def size_pair(value, name: str) -> tuple[int, int]:
    """(H, W) from a pair of positive integers; ConfigError otherwise."""
    try:
        h, w = value
    except (TypeError, ValueError):
        h = w = None
    ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in (h, w))
    if not ok:
        raise ConfigError(f"{name} must be a pair (H, W) of positive integers, got {value!r}")
    return int(h), int(w)


def _work_dtype(x: np.ndarray) -> np.dtype:
    # float64 stays float64; everything else (uint8 pixels, float16, float32) is computed in float32, as
    # onnxruntime's Resize computes float32 images
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


def _linear_taps(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower index, upper index, weight of the upper) per output index of one axis: ONNX Resize's linear mode with
    coordinate_transformation_mode="half_pixel" and no antialias. The source coordinate is computed in float32 in
    onnxruntime's order, x = (i + 0.5) / (n_out / n_in) - 0.5, and clamped to [0, n_in - 1] (edge clamping)."""
    f = np.float32
    scale = f(n_out) / f(n_in)
    x = (np.arange(n_out, dtype=f) + f(0.5)) / scale - f(0.5)
    x = np.clip(x, f(0), f(n_in - 1))
    lo = np.floor(x).astype(np.intp)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, x - lo.astype(f)


def _resize_axis(x: np.ndarray, axis: int, n_out: int) -> np.ndarray:
    """x resampled along `axis` to n_out points: two gathers and a blend (linear in the image's size)."""
    n_in = x.shape[axis]
    if n_in == n_out:
        return x
    lo, hi, t = _linear_taps(n_out, n_in)
    shape = [1] * x.ndim
    shape[axis] = n_out
    t = t.astype(x.dtype).reshape(shape)
    a, b = np.take(x, lo, axis=axis), np.take(x, hi, axis=axis)
    return a + (b - a) * t


def resize_bytes(shape, size, *, layout: str = "nhwc", itemsize: int = 4) -> int:
    """The bytes of the largest array resize() makes of an array of `shape` (its H axis is resized first: the
    intermediate has the new height and the old width)."""
    h_axis, w_axis = (-3, -2) if layout == "nhwc" else (-2, -1)
    height, width = size_pair(size, "resize size")
    others = math.prod(int(d) for i, d in enumerate(shape) if i - len(shape) not in (h_axis, w_axis))
    return others * height * max(int(shape[w_axis]), width) * itemsize


def resize(x: np.ndarray, size, *, layout: str = "nhwc", max_bytes: int = RESIZE_MAX_BYTES) -> np.ndarray:
    """x resized to size = (H, W): bilinear, exactly as ONNX Resize with mode="linear",
    coordinate_transformation_mode="half_pixel", no antialias (edge values clamped), so that a model exported with
    that Resize node gives the same numbers in onnxruntime (within float32 rounding: 1e-4 on 0..255 values).

    The result is float32 (float64 input stays float64): uint8 pixels keep their 0..255 range. A downscale by
    more than 2 samples only the two nearest pixels per axis (no antialias, like ONNX's default and
    torchvision's Resize(antialias=False)), so fine detail can alias.

    The largest array it makes (resize_bytes) may be at most max_bytes (RESIZE_MAX_BYTES): a LimitError naming
    the size, before anything is allocated."""
    h_axis, w_axis = spatial_axes(x, layout, "resize")
    height, width = size_pair(size, "resize size")
    x = np.asarray(x)
    work = _work_dtype(x)
    needed = resize_bytes(x.shape, (height, width), layout=layout, itemsize=work.itemsize)
    limit = limit_argument(max_bytes, "max_bytes")
    if needed > limit:
        raise LimitError(
            f"resize to {height} x {width} (H x W) of an array of shape {list(x.shape)} ({layout}) makes {work.name} "
            f"arrays of {size_text(needed)}, more than the {size_text(limit)} a resize may allocate: resize to the "
            f"model's input size (e.g. 224 x 224), or pass max_bytes= to allow more",
            limit=limit,
            needed=needed,
        )
    y = x.astype(work, copy=False)
    y = _resize_axis(y, h_axis % y.ndim, height)
    y = _resize_axis(y, w_axis % y.ndim, width)
    return y.copy() if y is x else y


def crop_box(shape: tuple[int, int], size) -> tuple[int, int]:
    """(top, left) of a center crop of `size` (h, w) from an image of `shape` (H, W), as torchvision's CenterCrop
    rounds it: round((H - h) / 2), half to even; ConfigError when the crop is larger than the image."""
    h, w = size_pair(size, "crop size")
    if h > shape[0] or w > shape[1]:
        raise ConfigError(
            f"a center crop of {h}x{w} does not fit in an image of {shape[0]}x{shape[1]} (H x W)"
        )
    return int(round((shape[0] - h) / 2.0)), int(round((shape[1] - w) / 2.0))


def center_crop(x: np.ndarray, size, *, layout: str = "nhwc") -> np.ndarray:
    """The central size = (h, w) window of x (a view, dtype kept), placed as torchvision's CenterCrop places it."""
    h_axis, w_axis = spatial_axes(x, layout, "center_crop")
    top, left = crop_box((x.shape[h_axis], x.shape[w_axis]), size)
    h, w = size_pair(size, "crop size")
    index = [slice(None)] * x.ndim
    index[h_axis], index[w_axis] = slice(top, top + h), slice(left, left + w)
    return x[tuple(index)]


def hflip(x: np.ndarray, *, layout: str = "nhwc") -> np.ndarray:
    """x mirrored left to right (the W axis reversed; a view, dtype kept)."""
    _, w_axis = spatial_axes(x, layout, "hflip")
    return np.flip(x, axis=w_axis)


def _rotation_sources(height: int, width: int, degrees: float) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) in the input, in float64, that each output pixel of a rotation by `degrees` counterclockwise
    reads: rotation about the image's center ((H - 1) / 2, (W - 1) / 2 in pixel-center coordinates), with Pillow's
    matrix (cosine and sine rounded to 15 decimals, so that 90 degrees moves whole pixels exactly)."""
    theta = -math.radians(degrees)
    c, s = round(math.cos(theta), 15), round(math.sin(theta), 15)
    cy, cx = (height - 1) / 2.0, (width - 1) / 2.0
    dy = np.arange(height, dtype=np.float64)[:, None] - cy
    dx = np.arange(width, dtype=np.float64)[None, :] - cx
    return -s * dx + c * dy + cy, c * dx + s * dy + cx


def rotate(x: np.ndarray, degrees: float, *, fill: float | str = 0.0, layout: str = "nhwc") -> np.ndarray:
    """x rotated by `degrees` counterclockwise as the image is seen (rows going down: Pillow's Image.rotate and
    torchvision's rotate), about its center, with bilinear sampling; same size (corners are cut off).

    fill: a number (default 0) for output pixels whose source lies outside the image (beyond its outer pixel
    edges, as Pillow decides; within them edge pixels are clamped), or "edge" to take the nearest edge pixel
    everywhere. The result is float32 (float64 stays float64). Meant for the small angles of augmentation; at
    multiples of 90 degrees whole pixels move exactly (np.rot90 for a square image)."""
    h_axis, w_axis = spatial_axes(x, layout, "rotate")
    edge = isinstance(fill, str) and fill == "edge"
    if not edge and (
        isinstance(fill, (str, bool)) or not isinstance(fill, numbers.Real) or not math.isfinite(fill)
    ):
        raise ConfigError(f"rotate fill must be a finite number or 'edge', got {fill!r}")
    if isinstance(degrees, bool) or not isinstance(degrees, numbers.Real) or not math.isfinite(degrees):
        raise ConfigError(f"rotate degrees must be a finite number, got {degrees!r}")
    x = np.asarray(x)
    height, width = x.shape[h_axis], x.shape[w_axis]
    rows, cols = _rotation_sources(height, width, float(degrees))
    outside = (rows < -0.5) | (rows >= height - 0.5) | (cols < -0.5) | (cols >= width - 0.5)
    rows, cols = np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1)
    r0, c0 = np.floor(rows).astype(np.intp), np.floor(cols).astype(np.intp)
    r1, c1 = np.minimum(r0 + 1, height - 1), np.minimum(c0 + 1, width - 1)
    work = _work_dtype(x)
    ty, tx = (rows - r0).astype(work), (cols - c0).astype(work)
    # gathers on the flattened (H * W) axis: one index array per corner instead of a pair
    axis = -2 if layout == "nhwc" else -1
    if layout == "nhwc":  # the (H, W) grid of weights broadcasts against [..., H, W, C]
        flat = x.reshape(*x.shape[:-3], height * width, x.shape[-1])
        ty, tx, outside = ty[..., None], tx[..., None], outside[..., None]
    else:
        flat = x.reshape(*x.shape[:-2], height * width)

    def at(r, c):
        picked = np.take(flat, (r * width + c).reshape(-1), axis=axis).astype(work, copy=False)
        return picked.reshape(x.shape)

    top_left, bottom_left = at(r0, c0), at(r1, c0)
    top = top_left + (at(r0, c1) - top_left) * tx
    bottom = bottom_left + (at(r1, c1) - bottom_left) * tx
    out = top + (bottom - top) * ty
    if not edge:
        out = np.where(outside, work.type(fill), out)
    return out
