"""An image batch, its epoch and its sample indices -> the batch randomly cropped, flipped and rotated, the same
way every time for the same (seed, epoch, sample): Augment, a DataLoader's augment= step."""

from __future__ import annotations

import math
import re

import numpy as np

from .errors import ConfigError
from .imageops import LAYOUTS, hflip, rotate, spatial_axes
from .values import count, number

_FORMS = (
    "crop:N (pad N pixels on every side, then crop back to the image's size at a random place), flip (mirror left "
    "to right half of the time), rotate:D (rotate by a random angle within +-D degrees), joined by commas, e.g. "
    "'crop:4,flip,rotate:10'"
)
# the most padding crop= takes at all; at a call it must also be less than the image's height and width
CROP_MAX = 1 << 16
# the numbers parse() reads, in ASCII digits: crop's a whole number, rotate's a decimal (an exponent allowed); what
# int() and float() would also take (1_0, Unicode digits, nan, infinity) is refused, not reinterpreted
_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _read_number(value: str, kind: type, where: str) -> float:
    """The number of a crop:N (kind int) or rotate:D (kind float) term, read only from ASCII digits (_WHOLE,
    _DECIMAL) and only when float64 holds it: 1e400 would read as inf and 1e-400 as 0, and int() refuses more than
    4300 digits with a bare ValueError (counted first). ConfigError naming `where` otherwise; its range is checked
    by Augment()."""
    if not (_WHOLE if kind is int else _DECIMAL).fullmatch(value):
        what = "a whole number" if kind is int else "a number of degrees"
        raise ConfigError(f"{where} needs {what} after the colon (digits 0-9); the forms are {_FORMS}")
    if kind is int and len(value.lstrip("+-").lstrip("0")) > len(str(CROP_MAX)):
        raise ConfigError(f"{where} is out of range (from 0 to {CROP_MAX} pixels)")
    v = kind(value)
    if not math.isfinite(v) or (v == 0 and re.search(r"[1-9]", value.lower().partition("e")[0])):
        raise ConfigError(f"{where} is not a number a float64 holds (from 0 to 180 degrees work)")
    return v


def _fill_argument(fill) -> float | str:
    if isinstance(fill, str) and fill == "edge":
        return fill
    if isinstance(fill, str):
        raise ConfigError(f"Augment fill must be a finite number or 'edge', got {fill!r}")
    return number(fill, "Augment fill", float32=False, fix="a finite number, or 'edge'")


class Augment:
    """Random crop after padding, horizontal flip and rotation of image batches, reproducible and resumable.

    crop=P pads each image by P pixels on every side (with `fill`), then takes an H x W window at a random
    offset (0..2P each way): torchvision's RandomCrop(size, padding=P). flip=True mirrors left to right with
    probability 0.5 (RandomHorizontalFlip). rotate=D rotates by an angle uniform in [-D, D] degrees,
    counterclockwise for positive angles, about the center, bilinear, corners filled with `fill`
    (loaders.imageops.rotate; RandomRotation(D) with bilinear interpolation). They apply in that order.

    The random draws of sample i in epoch e come from np.random.default_rng([seed, e, i]) alone, never from
    global state, and every sample always draws its offset, its flip and its angle in that order (so turning one
    step on or off leaves the draws of the others as they were): the same (seed, epoch, sample) gives the same
    output in any batch, and a run resumed mid-epoch gets bit-identical batches. seed=None takes the DataLoader's
    seed. fill: a number (0 by default) or "edge" (the nearest edge pixel). layout: "nhwc" (batches
    [N, H, W, C], channels last: what image views give) or "nchw" ([N, C, H, W]). Crop and flip keep the
    dtype; rotation gives float32 (float64 stays float64), values in the input's range. Labels pass through.
    """

    def __init__(
        self,
        *,
        crop: int = 0,
        flip: bool = False,
        rotate: float = 0.0,
        seed: int | None = None,
        fill: float | str = 0.0,
        layout: str = "nhwc",
    ):
        self.crop = count(crop, "Augment crop", hi=CROP_MAX, fix="the pixels padded on each side")
        if not isinstance(flip, (bool, np.bool_)):
            raise ConfigError(f"Augment flip must be True or False, got {flip!r}")
        self.flip = bool(flip)
        self.rotate = number(rotate, "Augment rotate", lo=0, hi=180, float32=False, fix="degrees either way")
        self.seed = None if seed is None else count(seed, "Augment seed", fix="a whole number >= 0")
        _fill_argument(fill)
        self.fill = fill
        if layout not in LAYOUTS:
            raise ConfigError(f"Augment layout must be one of {list(LAYOUTS)}, got {layout!r}")
        self.layout = layout

    @classmethod
    def parse(cls, text: str, *, seed: int | None = None, layout: str = "nhwc") -> Augment:
        """An Augment from a command line's text, e.g. 'crop:4,flip,rotate:10' (ConfigError listing the forms)."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"augmentation {text!r}: give one or more of {_FORMS}")
        options: dict = {}
        known = {"crop": int, "rotate": float, "flip": None}  # each form's number type (flip takes none)
        shown = text if len(text) <= 80 else text[:77] + "..."
        for item in (t.strip() for t in text.split(",")):
            name, colon, value = (p.strip() for p in item.partition(":"))
            if name not in known or bool(colon) != (known[name] is not None) or name in options:
                why = "repeated" if name in options else "not understood"
                raise ConfigError(f"augmentation {shown!r}: {item[:40]!r} is {why}; the forms are {_FORMS}")
            if known[name] is None:
                options[name] = True
                continue
            options[name] = _read_number(value, known[name], f"augmentation {shown!r}: {item[:40]!r}")
        try:
            return cls(**options, seed=seed, layout=layout)
        except ConfigError as e:  # a number out of range: the message names the spec it came from as well
            raise ConfigError(f"augmentation {shown!r}: {e}") from None

    @property
    def text(self) -> str:
        """The parse() text of this augmentation ('' when it does nothing)."""
        parts = [f"crop:{self.crop}"] if self.crop else []
        parts += ["flip"] if self.flip else []
        parts += [f"rotate:{self.rotate:g}"] if self.rotate else []
        return ",".join(parts)

    def __repr__(self) -> str:
        return f"Augment.parse({self.text!r}, seed={self.seed!r}, layout={self.layout!r})"

    def draws(self, seed: int, epoch: int, index: int) -> tuple[int, int, bool, float]:
        """(top, left, flip, angle) of sample `index` in `epoch`: the crop's offsets into the padded image, whether
        it is mirrored, the angle in degrees. Each of seed, epoch and index is a whole number >= 0."""
        for value, what in ((seed, "seed"), (epoch, "epoch"), (index, "sample index")):
            count(value, f"Augment {what}", fix="a whole number >= 0")
        return self._draws(int(seed), int(epoch), int(index))

    def _draws(self, seed: int, epoch: int, index: int) -> tuple[int, int, bool, float]:
        rng = np.random.default_rng([seed, epoch, index])
        top, left = (int(v) for v in rng.integers(0, 2 * self.crop + 1, size=2))
        flip = bool(rng.random() < 0.5)
        angle = float(rng.uniform(-self.rotate, self.rotate))
        return top, left, flip, angle

    def _one(self, x: np.ndarray, top: int, left: int, flip: bool, angle: float) -> np.ndarray:
        h_axis, w_axis = spatial_axes(x, self.layout, "Augment")
        if self.crop:
            p = self.crop
            pad = [(0, 0)] * x.ndim
            pad[h_axis], pad[w_axis] = (p, p), (p, p)
            if self.fill == "edge":
                padded = np.pad(x, pad, mode="edge")
            else:
                padded = np.pad(x, pad, mode="constant", constant_values=self.fill)
            window = [slice(None)] * x.ndim
            window[h_axis] = slice(top, top + x.shape[h_axis])
            window[w_axis] = slice(left, left + x.shape[w_axis])
            x = padded[tuple(window)]
        if self.flip and flip:
            x = hflip(x, layout=self.layout)
        if self.rotate:
            x = rotate(x, angle, fill=self.fill, layout=self.layout)
        return x

    def check(self, batch_shape, dtype) -> None:
        """ConfigError unless this augmentation fits batches of `batch_shape` ([N, H, W, C] or [N, C, H, W], as
        `layout` says) and `dtype`: images (4 axes or more) of numbers, H and W at least 1 and more than the
        crop's padding (so that every crop holds pixels of the image, and the padded image is at most 9 times
        its size), a numeric fill that the dtype holds as it is (np.pad would wrap 300 to 44 in uint8)."""
        shape, dtype = tuple(batch_shape), np.dtype(dtype)
        name = f"Augment({self.text!r})"
        if len(shape) < 4:
            form = "[N, H, W, C]" if self.layout == "nhwc" else "[N, C, H, W]"
            raise ConfigError(
                f"{name} works on batches of images, {form} (layout={self.layout!r}); got a batch of "
                f"shape {list(shape)} (samples of shape {list(shape[1:])}): augment only image data"
            )
        if dtype.kind not in "biuf":
            raise ConfigError(f"{name}: a batch of {dtype} values; images are numbers (uint8, float32 ...)")
        h, w = (shape[-3], shape[-2]) if self.layout == "nhwc" else (shape[-2], shape[-1])
        if min(h, w) < 1 or self.crop >= min(h, w):
            raise ConfigError(
                f"{name}: crop:{self.crop} pads {self.crop} pixels on each side of images of {h} x {w} (H x W); "
                f"the padding must be less than the image's height and width (crop:{max(0, min(h, w) - 1)} at "
                f"most), or a crop may hold no pixel of the image"
            )
        if self.fill != "edge" and (self.crop or self.rotate):
            _fill_fits(self.fill, dtype, name)

    def __call__(
        self, x, y, *, epoch: int, indices, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the augmented batch, y): sample k of x is sample indices[k] of the dataset, in `epoch` (a whole number
        >= 0). `seed` is the DataLoader's, used when this Augment has none. The batch must fit (check)."""
        try:
            x = np.asarray(x)
        except (ValueError, TypeError):  # ragged nesting
            raise ConfigError(f"Augment({self.text!r}): the batch is not an array of images") from None
        self.check(x.shape, x.dtype)
        seed = self.seed if self.seed is not None else seed
        if seed is None:
            raise ConfigError(
                "Augment has no seed: give Augment(seed=), or use it in a DataLoader (it takes its seed)"
            )
        seed = count(seed, "Augment seed", fix="a whole number >= 0")
        epoch = count(epoch, "Augment epoch", fix="the epoch's number, from 0")
        indices = _indices(indices, x.shape[0])
        if not indices.size:  # nothing to draw; the dtype is the one a batch would get
            return x.astype(np.float64 if x.dtype == np.float64 else np.float32) if self.rotate else x, y
        out = [self._one(x[k], *self._draws(seed, epoch, int(i))) for k, i in enumerate(indices)]
        return np.stack(out), y


def _indices(indices, n: int) -> np.ndarray:
    """The sample indices of a batch of n: whole numbers >= 0, one per sample (ConfigError otherwise)."""
    try:
        a = np.asarray(indices).reshape(-1)
    except (ValueError, TypeError):  # ragged nesting
        a = None
    if a is None or (a.size and (a.dtype.kind not in "iu" or int(a.min()) < 0)):
        raise ConfigError(
            f"Augment indices must be the batch's sample indices, whole numbers >= 0; got {repr(indices)[:80]}"
        )
    if a.size != n:
        raise ConfigError(f"Augment: a batch of {n} samples but {a.size} indices")
    return a


def _fill_fits(fill: float, dtype: np.dtype, name: str) -> None:
    """ConfigError unless `dtype` holds `fill` as it is."""
    if dtype.kind == "f":
        fits = abs(fill) <= float(np.finfo(dtype).max)
    else:
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        lo, hi = (0, 1) if info is None else (info.min, info.max)
        fits = float(fill).is_integer() and lo <= fill <= hi
    if not fits:
        raise ConfigError(
            f"{name}: fill={fill!r} is not a value of the batch's {dtype} pixels; give a fill that {dtype} holds "
            f"(e.g. 0), or 'edge'"
        )
