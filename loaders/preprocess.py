"""A batch (X, Y) -> (X, Y) ready for the model: Preprocess (adapt, cast, scale, normalise per channel), and the
parsers of the command line's --scale and --normalize texts."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from .adapt import SampleAdapter
from .errors import ConfigError
from .values import number

# values of a per-channel mean or std: one per channel along axis 1, which for a flat sample is one per feature (as
# many as a CSV table's columns may be)
CHANNELS_MAX = 1 << 20

_SCALE_FORMS = "a number (0.00392) or a fraction (1/255)"
_NORMALIZE_FORMS = (
    "MEAN,STD with one value each (0.5,0.25) or one per channel joined by colons "
    "(0.485:0.456:0.406,0.229:0.224:0.225)"
)


def _values(v, what: str) -> np.ndarray | None:
    if v is None:
        return None
    if isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, str) and len(v) > CHANNELS_MAX:
        raise ConfigError(
            f"Preprocess {what} has {len(v)} values, more than the {CHANNELS_MAX} of a sample's channels"
        )
    try:
        arr = np.asarray(v)
    except (TypeError, ValueError, OverflowError):  # lists of ragged lengths
        arr = None
    if arr is not None and arr.dtype.kind in "biuf":  # numbers only: text and complex values are refused
        arr = arr.astype(np.float64).reshape(-1)
    else:
        arr = None
    if arr is None or arr.size == 0 or not np.isfinite(arr).all():
        raise ConfigError(f"Preprocess {what} must be a finite number or one per channel, got {v!r}"[:300])
    for x in arr.tolist():
        number(x, f"Preprocess {what}", fix="give values of the size the data's scaled values have, e.g. 0.5")
    return arr


class Preprocess:
    """(X, Y) -> (X, Y) on whole batches: `adapter` first (to the model's sample shape), then X cast to `dtype`
    (None keeps it), then x * scale (x / k when scale is 1/k), then (x - mean[c]) / std[c] per channel c along axis 1.

    mean and std are one value for every channel or one per channel (the adapter's model_shape[0], else the
    batch's axis 1). Y passes through. X comes out C-contiguous and never shares memory with the input when
    arithmetic is done, so the view's arrays are never written.
    """

    def __init__(
        self,
        adapter: SampleAdapter | None = None,
        *,
        scale: float | None = None,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        dtype=np.float32,
    ):
        self.adapter = adapter
        try:
            self.dtype = None if dtype is None else np.dtype(dtype)
        except TypeError as e:
            raise ConfigError(f"Preprocess dtype must be a numpy dtype or None, got {dtype!r}") from e
        if scale is not None and not (
            isinstance(scale, numbers.Real) and not isinstance(scale, bool) and _finite(scale)
        ):
            raise ConfigError(f"Preprocess scale must be a finite number, got {scale!r}"[:300])
        self.scale = None if scale is None else number(scale, "Preprocess scale", fix="give e.g. 1/255")
        self.mean, self.std = _values(mean, "mean"), _values(std, "std")
        if self.std is not None and (self.std <= 0).any():
            raise ConfigError(f"Preprocess std must be > 0, got {std!r}")
        arithmetic = self.scale is not None or self.mean is not None or self.std is not None
        if arithmetic and self.dtype is not None and self.dtype.kind != "f":
            raise ConfigError(f"Preprocess scale, mean and std need a float dtype, got {self.dtype}")
        if adapter is not None and adapter.model_shape:
            self._check_channels(adapter.model_shape[0], "the model's input channels (model_shape[0])")

    def _check_channels(self, channels: int, what: str) -> None:
        for name, v in (("mean", self.mean), ("std", self.std)):
            if v is not None and v.size not in (1, channels):
                raise ConfigError(
                    f"Preprocess {name} has {v.size} values; {what} is {channels}: give one value for "
                    f"every channel or {channels}"
                )

    def _per_channel(self, v: np.ndarray, x: np.ndarray) -> np.ndarray:
        # [C] -> [1, C, 1, ...] so that it broadcasts along axis 1 of the batch
        if v.size == 1:
            return v.astype(x.dtype).reshape(())
        self._check_channels(x.shape[1] if x.ndim >= 2 else 1, f"the batch's axis 1 (shape {list(x.shape)})")
        return v.astype(x.dtype).reshape((1, v.size) + (1,) * (x.ndim - 2))

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.adapter is not None:
            x = self.adapter(x)
        dtype = np.asarray(x).dtype if self.dtype is None else self.dtype
        if self.scale is None and self.mean is None and self.std is None:
            return np.ascontiguousarray(x, dtype=dtype), y
        if dtype.kind != "f":
            raise ConfigError(f"Preprocess scale, mean and std need float data; X is {dtype} (give dtype=)")
        x = np.array(x, dtype=dtype, order="C")  # a copy: the steps below work in place
        if self.scale is not None:
            k = divisor(self.scale)
            if k:  # x / 255, correctly rounded (255 -> exactly 1.0), as the exported model's Div computes it
                x /= x.dtype.type(k)
            else:
                x *= x.dtype.type(self.scale)
        if self.mean is not None:
            x -= self._per_channel(self.mean, x)
        if self.std is not None:
            x /= self._per_channel(self.std, x)
        return x, y

    def __repr__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in vars(self).items() if v is not None]
        return f"Preprocess({', '.join(parts)})"


def _finite(x) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float: finite, and refused for its size by number()
        return True


def divisor(scale: float | None) -> int | None:
    """k when scale is 1/k for a whole k >= 2 (1/255, 1/65535), else None: such a scale divides by k, correctly
    rounded, where multiplying by the rounded 1/k would put 255 at 1.0000001. None too for what is no scale (not
    a number, or so small that 1/scale overflows): the checks of the value refuse it, naming it."""
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not 0 < scale < 1:
        return None
    if not math.isfinite(1 / scale):
        return None
    k = round(1 / scale)
    return k if k >= 2 and abs(1 / scale - k) <= 1e-9 * k else None


def _quoted(text: str) -> str:
    """A user's text in a message: quoted, and cut short when it is long."""
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def _number(text: str, what: str, forms: str, fix: str) -> float:
    """A number or a fraction as text -> its value, finite and of a size float32 holds (refused naming `what`, the
    text, and, for a fraction, its value)."""
    t = text.strip()
    num, slash, den = t.partition("/")
    try:
        value = float(num) / float(den) if slash else float(t)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise ConfigError(f"{what} {_quoted(text)} is not a number; accepted: {forms}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what} {_quoted(text)} is not a finite number; accepted: {forms}")
    return number(value, f"{what} {_quoted(t)} =" if slash else what, fix=f"{fix}; accepted: {forms}")


def parse_scale(text: str) -> float:
    """--scale '0.00392' or '1/255' -> the factor pixels are multiplied by (a positive finite number)."""
    if not isinstance(text, str):
        raise ConfigError(f"--scale must be text, got {type(text).__name__}; accepted: {_SCALE_FORMS}")
    value = _number(text, "--scale", _SCALE_FORMS, "give e.g. 1/255")
    if value <= 0:
        raise ConfigError(f"--scale {_quoted(text)} must be > 0; accepted: {_SCALE_FORMS}")
    return value


def parse_normalize(text: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """--normalize 'MEAN,STD' ('0.5,0.25') or per channel ('0.485:0.456:0.406,0.229:0.224:0.225') -> (means,
    stds)."""
    if not isinstance(text, str):
        raise ConfigError(f"--normalize must be text, got {type(text).__name__}; expected {_NORMALIZE_FORMS}")
    shown = _quoted(text)
    halves = text.split(",")
    if len(halves) != 2 or not all(h.strip() for h in halves):
        raise ConfigError(f"--normalize {shown}: expected {_NORMALIZE_FORMS}")
    if any(h.count(":") >= CHANNELS_MAX for h in halves):
        raise ConfigError(
            f"--normalize {shown}: more than {CHANNELS_MAX} values of the mean or the std; expected "
            f"{_NORMALIZE_FORMS}"
        )
    mean, std = (
        tuple(
            _number(v, f"--normalize {shown}: {kind}", _NORMALIZE_FORMS, "give e.g. 0.5,0.25")
            for v in h.split(":")
        )
        for kind, h in zip(("the mean", "the std"), halves)
    )
    if len(mean) != len(std) and 1 not in (len(mean), len(std)):
        raise ConfigError(
            f"--normalize {shown}: {len(mean)} means but {len(std)} stds; give one per channel of each, "
            f"or one value for all channels; accepted: {_NORMALIZE_FORMS}"
        )
    if any(s <= 0 for s in std):
        raise ConfigError(f"--normalize {shown}: std must be > 0; accepted: {_NORMALIZE_FORMS}")
    return mean, std
