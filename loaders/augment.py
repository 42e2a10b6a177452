"""An image batch, its epoch and its sample indices -> the batch randomly cropped, flipped and rotated, the same
way every time for the same (seed, epoch, sample): Augment, a DataLoader's augment= step."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import ConfigError
from .imageops import LAYOUTS, hflip, rotate, spatial_axes

_FORMS = (
    "crop:N (pad N pixels on every side, then crop back to the image's size at a random place), flip (mirror left "
    "to right half of the time), rotate:D (rotate by a random angle within +-D degrees), joined by commas, e.g. "
    "'crop:4,flip,rotate:10'"
)


def _count(value, name: str, *, integer: bool, top: float) -> float:
    """A non-negative number at most `top` (an integer when `integer`); ConfigError otherwise."""
    kinds = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value <= top:
        what = "an integer" if integer else "a number"
        raise ConfigError(f"Augment {name} must be {what} from 0 to {top:g}, got {value!r}")
    return value


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
        self.crop = int(_count(crop, "crop", integer=True, top=1 << 16))
        if not isinstance(flip, (bool, np.bool_)):
            raise ConfigError(f"Augment flip must be True or False, got {flip!r}")
        self.flip = bool(flip)
        self.rotate = float(_count(rotate, "rotate", integer=False, top=180))
        if seed is not None:
            _count(seed, "seed", integer=True, top=math.inf)
        self.seed = None if seed is None else int(seed)
        if not (isinstance(fill, str) and fill == "edge") and (
            isinstance(fill, (str, bool)) or not isinstance(fill, numbers.Real) or not math.isfinite(fill)
        ):
            raise ConfigError(f"Augment fill must be a finite number or 'edge', got {fill!r}")
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
        for item in (t.strip() for t in text.split(",")):
            name, colon, value = (p.strip() for p in item.partition(":"))
            if name not in known or bool(colon) != (known[name] is not None) or name in options:
                why = "repeated" if name in options else "not understood"
                raise ConfigError(f"augmentation {text!r}: {item!r} is {why}; the forms are {_FORMS}")
            try:
                options[name] = True if known[name] is None else known[name](value)
            except ValueError:
                raise ConfigError(
                    f"augmentation {text!r}: {item!r} needs a number after the colon; the forms are {_FORMS}"
                ) from None
        return cls(**options, seed=seed, layout=layout)

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
        it is mirrored, the angle in degrees."""
        rng = np.random.default_rng([int(seed), int(epoch), int(index)])
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

    def __call__(
        self, x, y, *, epoch: int, indices, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the augmented batch, y): sample k of x is sample indices[k] of the dataset, in `epoch`. `seed` is
        the DataLoader's, used when this Augment has none."""
        x = np.asarray(x)
        if x.ndim < 4:
            form = "[N, H, W, C]" if self.layout == "nhwc" else "[N, C, H, W]"
            raise ConfigError(
                f"Augment({self.text!r}) works on batches of images, {form} (layout={self.layout!r}); got a batch of "
                f"shape {list(x.shape)} (samples of shape {list(x.shape[1:])}): augment only image data"
            )
        seed = self.seed if self.seed is not None else seed
        if seed is None:
            raise ConfigError(
                "Augment has no seed: give Augment(seed=), or use it in a DataLoader (it takes its seed)"
            )
        indices = np.asarray(indices).reshape(-1)
        if indices.size != x.shape[0]:
            raise ConfigError(f"Augment: a batch of {x.shape[0]} samples but {indices.size} indices")
        out = [self._one(x[k], *self.draws(seed, epoch, int(i))) for k, i in enumerate(indices)]
        return np.stack(out), y
