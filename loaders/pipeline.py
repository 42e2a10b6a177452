"""The input pipeline a model declares once: how the user's raw data (camera bytes, 0-255 pixels, token ids) becomes
the model's input. InputPipeline is that declaration as JSON values, stored in the training artifact and every
checkpoint, applied the same way by every reader of data (train, eval, the phone app, the fleet's clients) and
written into the exported ONNX model; DataFacts is what a reader says its data is, checked against it.

The steps, in this order: the raw layout (channels-last images are transposed to channels first), a resize to
`size` and a center crop to `crop` (images, done by the image readers), the cast to the model's dtype, x * scale
(x / k when scale is 1/k: the correctly rounded division, so 255 becomes exactly 1.0), then (x - mean[c]) / std[c]
per channel. `range` is the raw values the pipeline expects ([0, 255] when it scales by 1/255): data that
contradicts it (pixels already in [0, 1] into a pipeline that divides by 255, or 0-255 values into one that expects
[0, 1]) is refused with a message that says what to do, instead of training on values 255 times off.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError, DataError
from .imagedecode import IMAGE_MAX_PIXELS
from .preprocess import CHANNELS_MAX, Preprocess, divisor, parse_normalize, parse_scale
from .values import bounded_json, count, number

PIPELINE_VERSION = 1
LAYOUTS = ("nchw", "nhwc")
_RAW_DTYPES = ("uint8", "uint16", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
_KEYS = ("version", "dtype", "raw_dtype", "layout", "size", "crop", "scale", "mean", "std", "range")
_FACT_SAMPLES = 256  # samples a reader's facts are taken from: the first ones, a bounded cost


@dataclass(frozen=True)
class DataFacts:
    """What a reader's data is: dtype, the per-sample shape, the value range of the first samples and whether
    they are whole numbers."""

    source: str
    dtype: np.dtype
    sample_shape: tuple[int, ...]
    lo: float
    hi: float
    integral: bool

    @property
    def eight_bit(self) -> bool:
        """Whole numbers in 0..255 that go above 1: 8-bit pixels, whatever dtype holds them."""
        return self.integral and self.lo >= 0 and 1 < self.hi <= 255

    @property
    def unit(self) -> bool:
        """Values in [0, 1] that are not all whole numbers: pixels scaled already."""
        return not self.integral and self.lo >= 0 and self.hi <= 1

    def describe(self) -> str:
        kind = " (8-bit)" if self.eight_bit else " (already in [0, 1])" if self.unit else ""
        whole = "whole numbers " if self.integral and self.dtype.kind == "f" else ""
        return f"{self.dtype.name} samples {list(self.sample_shape)}, {whole}values {self.lo:g}..{self.hi:g}{kind}"


def data_facts(view, limit: int = _FACT_SAMPLES) -> DataFacts:
    """The facts of a view's first `limit` samples (one batch read)."""
    n = min(view.size(), limit)
    x, _ = view.get_batch(np.arange(n))
    return array_facts(x, str(getattr(view, "source", "<data>")))


def array_facts(x, source: str = "<data>") -> DataFacts:
    """The facts of a batch of samples [N, ...]."""
    x = np.asarray(x)
    finite = x[np.isfinite(x)] if x.dtype.kind == "f" else x
    if x.dtype.kind not in "biuf" or finite.size == 0:
        lo = hi = math.nan
        integral = False
    else:
        lo, hi = float(finite.min()), float(finite.max())
        integral = x.dtype.kind in "biu" or bool(np.all(finite == np.round(finite)))
    return DataFacts(source, x.dtype, tuple(x.shape[1:]), lo, hi, integral)


def _pair(v, what: str) -> tuple[int, int] | None:
    """[height, width]: two whole numbers >= 1 whose product is at most IMAGE_MAX_PIXELS, the most pixels of an
    image read here (a resize to more would make images larger than any the readers decode, before the crop)."""
    if v is None:
        return None
    dims = _items(v)
    ok = dims is not None and len(dims) == 2 and all(_whole(d) and d >= 1 for d in dims)
    if not ok:
        raise ConfigError(
            f"input pipeline {what} must be two positive integers [height, width], got {_shown(v)}"
        )
    h, w = (count(int(d), f"input pipeline {what}", lo=1, hi=IMAGE_MAX_PIXELS) for d in dims)
    if h * w > IMAGE_MAX_PIXELS:
        raise ConfigError(
            f"input pipeline {what} [{h}, {w}] is {h * w} pixels, more than the {IMAGE_MAX_PIXELS} of the largest "
            f"image read here: give the model's input size (e.g. [224, 224])"
        )
    return h, w


_FIX = {
    "scale": "give e.g. 1/255 (0.00392...) for 8-bit pixels",
    "mean": "give the mean of the scaled values, e.g. 0.5 (one value, or one per channel)",
    "std": "give their standard deviation, e.g. 0.25 (one value, or one per channel)",
    "range": "give the raw values' [low, high], e.g. [0, 255] or [0, 1]",
}


def _floats(v, what: str) -> tuple[float, ...] | None:
    """One number or a list of them (at most CHANNELS_MAX), each finite and of a size float32 holds."""
    if v is None:
        return None
    items = _items(v)
    items = [v] if items is None else items
    if not items or len(items) > CHANNELS_MAX:
        raise ConfigError(
            f"input pipeline {what} must be a number or a list of 1 to {CHANNELS_MAX} numbers, got {_shown(v)}"
        )
    if not all(isinstance(x, numbers.Real) and not isinstance(x, bool) and _finite(x) for x in items):
        raise ConfigError(f"input pipeline {what} must be finite numbers, got {_shown(v)}")
    return tuple(number(x, f"input pipeline {what}", fix=_FIX[what]) for x in items)


def _items(v: Any) -> list | None:
    """The elements of a list, a tuple or a 1-D array; None for anything else (a scalar)."""
    if isinstance(v, np.ndarray):
        return v.tolist() if v.ndim == 1 else None
    return list(v) if isinstance(v, (list, tuple)) else None


def _finite(x: numbers.Real) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float is finite; number() refuses its size
        return True


def _whole(d: Any) -> bool:
    """A whole number: an int (not a bool), or a float with no fraction (224.0, as a computed size may be)."""
    if isinstance(d, bool) or not isinstance(d, numbers.Real):
        return False
    return isinstance(d, numbers.Integral) or float(d).is_integer()


def _shown(v: Any) -> str:
    """A value in a message, cut short when it is long."""
    try:
        text = repr(v)
    except ValueError:  # holds an int of more digits than Python converts to text
        text = f"a {type(v).__name__} holding an integer too long to show"
    return text if len(text) <= 80 else text[:77] + "..."


class InputPipeline:
    """The declared way from raw data to the model's input (see the module's docstring for the steps).

    Every field is optional; a pipeline with none set is undeclared (`declared` False): artifacts from before
    pipelines, and models converted without preprocessing options, whose data is fed as each reader gives it.
    """

    def __init__(
        self,
        *,
        dtype: str = "float32",
        raw_dtype: str | None = None,
        layout: str | None = None,
        size: Sequence[int] | None = None,
        crop: Sequence[int] | None = None,
        scale: float | None = None,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        range: Sequence[float] | None = None,  # the raw values expected (the JSON key's name)
    ):
        self.dtype = _dtype_name(dtype, "dtype")
        self.raw_dtype = None if raw_dtype is None else _dtype_name(raw_dtype, "raw_dtype")
        if raw_dtype is not None and self.raw_dtype not in _RAW_DTYPES:
            raise ConfigError(
                f"input pipeline raw_dtype must be one of {', '.join(_RAW_DTYPES)}, got {_shown(raw_dtype)}"
            )
        if layout is not None and (not isinstance(layout, str) or layout not in LAYOUTS):
            raise ConfigError(f"input pipeline layout must be 'nchw' or 'nhwc', got {_shown(layout)}")
        self.layout = layout
        self.size, self.crop = _pair(size, "size"), _pair(crop, "crop")
        if self.crop and self.size and (self.crop[0] > self.size[0] or self.crop[1] > self.size[1]):
            raise ConfigError(
                f"input pipeline crop {list(self.crop)} is larger than the resize {list(self.size)}"
            )
        if isinstance(scale, (list, tuple, np.ndarray)) and len(scale) != 1:
            raise ConfigError(f"input pipeline scale must be one number, got {_shown(scale)}")
        self.scale = None if scale is None else _floats(scale, "scale")[0]
        if self.scale is not None and self.scale <= 0:
            raise ConfigError(f"input pipeline scale must be > 0, got {_shown(scale)}")
        self.mean, self.std = _floats(mean, "mean"), _floats(std, "std")
        if self.std is not None and min(self.std) <= 0:
            raise ConfigError(f"input pipeline std must be > 0, got {_shown(std)}")
        if self.mean is not None and self.std is not None and 1 not in (len(self.mean), len(self.std)):
            if len(self.mean) != len(self.std):
                raise ConfigError(
                    f"input pipeline mean has {len(self.mean)} values and std {len(self.std)}: give one value of "
                    f"each for every channel, or as many of each as the model's input has channels"
                )
        self.range = _floats(range, "range")
        if self.range is not None and (len(self.range) != 2 or self.range[0] >= self.range[1]):
            raise ConfigError(
                f"input pipeline range must be [low, high] with low < high, got {_shown(range)}"
            )
        arithmetic = self.scale is not None or self.mean is not None or self.std is not None
        if arithmetic and np.dtype(self.dtype).kind != "f":
            raise ConfigError(
                f"the model's input takes {self.dtype} values (token ids or indices): scale, mean and std apply to "
                f"float inputs only"
            )
        self._check_arithmetic()

    def _check_arithmetic(self) -> None:
        """The steps on the raw values the pipeline expects (its range, else its raw integer type's, else 0, which
        nearly every data has) stay finite in the model's float type: a pipeline whose outputs would be inf or NaN
        is refused, naming the step. Computed as Preprocess computes them, on the range's ends (each step is
        monotonic in x), and in float64 for the message."""
        if np.dtype(self.dtype).kind != "f":
            return
        bounds = self.expected_range()
        if bounds is None and self.raw_dtype is not None and np.dtype(self.raw_dtype).kind in "iu":
            info = np.iinfo(self.raw_dtype)
            bounds = (float(info.min), float(info.max))
        raw = (
            "a raw value of 0"
            if bounds is None
            else f"the raw values {bounds[0]:g}..{bounds[1]:g} it expects"
        )
        dt = np.dtype(self.dtype)
        most = float(np.finfo(dt).max)
        wide = np.clip(np.array(bounds or (0.0, 0.0), dtype=np.float64), -most, most).reshape(2, 1)
        x = wide.astype(dt)
        k = divisor(self.scale)
        steps = (
            ("scale", self.scale, lambda x, t: x / t.type(k) if k else x * t.type(self.scale)),
            ("mean", self.mean, lambda x, t: x - np.asarray(self.mean, dtype=t)),
            ("std", self.std, lambda x, t: x / np.asarray(self.std, dtype=t)),
        )
        self._check_factor(dt, k)
        with np.errstate(all="ignore"):
            for key, value, step in steps:
                if value is None:
                    continue
                x, wide = step(x, dt), step(wide, np.dtype(np.float64))
                if not np.isfinite(x).all():
                    shown = value if key == "scale" else list(value)
                    to = f"to {float(np.max(np.abs(wide))):.3g}, beyond what {self.dtype} holds ({most:.3g})"
                    if key == "std" and not np.asarray(value, dtype=dt).all():
                        to = f"through a division by 0: {self.dtype} holds no std so small"
                    raise ConfigError(
                        f"input pipeline {key} {shown} takes {raw} {to}: its outputs would be inf or NaN; {_FIX[key]}"
                    )

    def _check_factor(self, dt: np.dtype, k: int | None) -> None:
        """The scale's divisor (or factor), the means and the stds are numbers the model's float type holds: a
        divisor of inf (65535 in float16), a factor of 0 (1e-30 in float16) or a std of inf would make every
        output the same."""
        with np.errstate(all="ignore"):
            factor = None if self.scale is None else dt.type(k or self.scale)
            held = {
                key: np.asarray(getattr(self, key), dtype=dt) for key in ("mean", "std") if getattr(self, key)
            }
        if factor is not None and not (np.isfinite(factor) and factor != 0):
            how = f"divides by {k}" if k else f"multiplies by {self.scale:g}"
            raise ConfigError(
                f"input pipeline scale {self.scale:g} {how}, which {dt.name} holds as {factor}: every output would "
                f"be the same; {_FIX['scale']}, or a model of a wider float type for such data"
            )
        for key, values in held.items():
            if not np.isfinite(values).all():
                raise ConfigError(
                    f"input pipeline {key} {list(getattr(self, key))} is beyond what {dt.name} holds "
                    f"({float(np.finfo(dt).max):.3g}); {_FIX[key]}"
                )

    # ---- the declaration ---------------------------------------------------------------------------------------
    @property
    def declared(self) -> bool:
        return any(getattr(self, k) is not None for k in _KEYS[2:])

    def expected_range(self) -> tuple[float, float] | None:
        """The raw values the pipeline expects: the declared range, else [0, k] when it divides by k = 255 or
        65535 (8- or 16-bit pixels), else None (unknown)."""
        if self.range is not None:
            return self.range
        k = divisor(self.scale)
        return (0.0, float(k)) if k in (255, 65535) else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": PIPELINE_VERSION, "dtype": self.dtype}
        for k in _KEYS[2:]:
            v = getattr(self, k)
            if v is not None:
                out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, spec: Any, source: str = "the input pipeline") -> InputPipeline:
        """A pipeline from to_json()'s dict (or its JSON text); ConfigError naming `source` and the fault."""
        if isinstance(spec, (str, bytes, bytearray)):
            spec = bounded_json(spec, f"{source}: the input pipeline")
        if not isinstance(spec, Mapping):
            raise ConfigError(
                f"{source}: the input pipeline must be a JSON object, got {type(spec).__name__}"
            )
        unknown = sorted(_shown(k) if not isinstance(k, str) else k for k in spec if k not in _KEYS)
        if unknown:
            raise ConfigError(
                f"{source}: the input pipeline has unknown keys {unknown[:10]}; it knows {list(_KEYS)}"
            )
        version = spec.get("version", PIPELINE_VERSION)
        if isinstance(version, bool) or version != PIPELINE_VERSION:
            raise ConfigError(
                f"{source}: input pipeline version {_shown(version)}; this edgetrain reads version {PIPELINE_VERSION}: "
                f"update edgetrain"
            )
        try:
            return cls(**{k: v for k, v in spec.items() if k != "version"})
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_options(
        cls,
        *,
        dtype: str = "float32",
        scale: str | float | None = None,
        normalize: str | None = None,
        layout: str | None = None,
        input_range: str | None = None,
        raw_dtype: str | None = None,
        size: Sequence[int] | None = None,
        crop: Sequence[int] | None = None,
    ) -> InputPipeline:
        """A pipeline from command-line texts: --scale 1/255, --normalize MEAN,STD, --layout, --input-range LO,HI.
        Scaling by 1/255 declares 8-bit raw data (uint8 in the exported model) unless raw_dtype says otherwise."""
        factor = parse_scale(scale) if isinstance(scale, str) else scale
        mean = std = None
        if normalize is not None:
            mean, std = parse_normalize(normalize)
        rng = None if input_range is None else parse_range(input_range)
        if raw_dtype is None and divisor(factor) == 255:
            raw_dtype = "uint8"
        given = {
            "--scale": scale,
            "--normalize": normalize,
            "--layout": layout,
            "--input-range": input_range,
            "--resize": size,
            "--crop": crop,
        }
        for option, field in (("--resize", "size"), ("--crop", "crop")):
            try:
                _pair(given[option], field)
            except ConfigError as e:
                raise ConfigError(f"{_options({option: given[option]})}: {e}") from None
        try:
            return cls(
                dtype=dtype,
                raw_dtype=raw_dtype,
                layout=layout,
                size=size,
                crop=crop,
                scale=factor,
                mean=mean,
                std=std,
                range=rng,
            )
        except ConfigError as e:  # a check of the options together: named as they were given
            raise ConfigError(f"{_options(given)}: {e}") from None

    def describe(self) -> str:
        """One line a person reads: 'uint8 0..255, channels-last, x / 255, then (x - 0.5) / 0.25 per channel'."""
        if not self.declared:
            return "none declared: data is fed as each reader gives it"
        parts = []
        rng = self.expected_range()
        if self.raw_dtype or rng:
            parts.append(" ".join(p for p in (self.raw_dtype, rng and f"{rng[0]:g}..{rng[1]:g}") if p))
        if self.layout:
            parts.append("channels-last images" if self.layout == "nhwc" else "channels-first")
        if self.size:
            parts.append(f"resized to {self.size[0]}x{self.size[1]}")
        if self.crop:
            parts.append(f"center crop {self.crop[0]}x{self.crop[1]}")
        k = divisor(self.scale)
        if self.scale is not None:
            parts.append(f"x / {k}" if k else f"x * {self.scale:g}")
        if self.mean is not None or self.std is not None:
            m = ":".join(f"{v:g}" for v in self.mean or (0.0,))
            s = ":".join(f"{v:g}" for v in self.std or (1.0,))
            parts.append(f"then (x - {m}) / {s} per channel")
        return ", ".join(parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputPipeline) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"InputPipeline({self.to_json()})"

    # ---- the data ----------------------------------------------------------------------------------------------
    def check(self, facts: DataFacts) -> list[str]:
        """Notices about the data; a DataError when it contradicts the pipeline (wrong range, wrong scaling)."""
        if facts.dtype.kind not in "biuf" or math.isnan(facts.lo) or np.dtype(self.dtype).kind != "f":
            return []
        rng = self.expected_range()
        if rng is None:
            if facts.eight_bit and self.scale is None:
                return [
                    f"{facts.source}: {facts.describe()}, fed as they are; if the model was trained on [0, 1] "
                    f"inputs, convert with --scale 1/255 (or pass --scale 1/255) so that they are scaled"
                ]
            return []
        lo, hi = rng
        tol = 1e-6 * max(1.0, abs(hi), abs(lo))
        if facts.hi > hi + tol or facts.lo < lo - tol:
            raise DataError(self._out_of_range(facts, lo, hi), facts.source)
        if hi >= 255 and facts.unit:
            raise DataError(
                f"{facts.source}: {facts.describe()}, but the model's input pipeline ({self.describe()}) expects "
                f"raw values up to {hi:g} and would scale these a second time: give the raw values (edgetrain reads "
                f"MNIST idx files raw for such a pipeline; for your own arrays, leave out the / {hi:g}), or, if the "
                f"model takes [0, 1] values as they are, convert it without --scale",
                facts.source,
            )
        return []

    def _out_of_range(self, facts: DataFacts, lo: float, hi: float) -> str:
        head = f"{facts.source}: {facts.describe()}, outside the {lo:g}..{hi:g} the model's input pipeline expects"
        if hi <= 1 and facts.eight_bit:
            return (
                f"{head}: these look like 8-bit pixels (0-255); scale them to [0, 1] first, or convert the model "
                f"with --scale 1/255 so that its pipeline scales them (and its exported ONNX takes raw pixels)"
            )
        return (
            f"{head} ({self.describe()}): check the data, or convert with the --scale/--input-range it needs"
        )

    def reads_raw(self) -> bool:
        """Whether readers that scale by themselves (MNIST's x / 255) must give their raw values instead: the
        pipeline scales, or expects more than [0, 1]."""
        rng = self.expected_range()
        return self.scale is not None or (rng is not None and rng[1] > 1)

    def preprocess(self, adapter=None) -> Preprocess:
        """The batch transform (X, Y) -> (X, Y) of this pipeline: the sample adapter (layout), the cast, the scale
        and the per-channel normalization."""
        return Preprocess(adapter, scale=self.scale, mean=self.mean, std=self.std, dtype=self.dtype)


def _options(given: dict[str, Any]) -> str:
    """The options given, as written on the command line: '--resize 8,8 --crop 4,4'."""
    words = []
    for option, value in given.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(_shown(v) for v in value)
        words.append(f"{option} {_shown(value) if not isinstance(value, str) else value[:60]}")
    return " ".join(words)


def _dtype_name(v, what: str) -> str:
    """The name of a numeric numpy dtype (bool, integers, floats) given by its name or as a dtype."""
    dt = None
    if isinstance(v, str) and len(v) <= 32 or isinstance(v, (np.dtype, type)):
        try:
            dt = np.dtype(v)
        except (TypeError, ValueError):
            dt = None
    if dt is None or dt.kind not in "biuf" or dt.fields is not None or dt.subdtype is not None:
        raise ConfigError(
            f"input pipeline {what} must be a numpy dtype name (e.g. float32, uint8), got {_shown(v)}"
        )
    return dt.name


def parse_range(text: str) -> tuple[float, float]:
    """--input-range '0,255' or '0,1' or '-1,1' -> (low, high), each finite and of a size float32 holds."""
    forms = "expected LOW,HIGH (e.g. 0,255 or 0,1)"
    parts = text.split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--input-range {text!r}: {forms}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(f"--input-range {text!r}: expected finite LOW < HIGH (e.g. 0,255 or 0,1)")
    for value in (lo, hi):
        number(value, f"--input-range {text!r}: the value", fix=forms)
    return lo, hi


__all__ = [
    "LAYOUTS",
    "PIPELINE_VERSION",
    "DataFacts",
    "InputPipeline",
    "array_facts",
    "data_facts",
    "parse_range",
]
