"""The data's per-sample shape + the model's -> a SampleAdapter (same, reshape or transpose) or a DataError.

A reshape is only allowed where it keeps the memory order of the values (adding or dropping size-1 axes,
flattening or unflattening a row); channels-last images become channels-first by a transpose. Anything else
would read the values in a scrambled order (uint8 camera images [N, H, W, C] reshaped to [N, C, H, W] train
and evaluate on noise), so it is refused with a message that says what would work.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError, DataError

LAYOUTS = (None, "nchw", "nhwc")


def _shape(shape, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
        ok = all(int(d) == d for d in shape) and all(d >= 1 for d in dims)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{what} must be a sequence of positive integers (no batch axis), got {shape!r}")
    return dims


def _show(shape: tuple[int, ...]) -> str:
    return str(list(shape))


def _counted(shape: tuple[int, ...]) -> str:
    return f"{_show(shape)} ({math.prod(shape)} values)"


def _is_flatten(sample: tuple[int, ...], model: tuple[int, ...]) -> bool:
    """True when reading one shape as the other keeps every value in place (C order)."""
    if math.prod(sample) != math.prod(model):
        return False
    squeezed = [d for d in sample if d != 1] == [d for d in model if d != 1]
    return squeezed or len(sample) == 1 or len(model) == 1


def _channels_last(model: tuple[int, ...]) -> tuple[int, ...] | None:
    return model[1:] + model[:1] if len(model) >= 2 else None


class SampleAdapter:
    """A batch [N, *sample_shape] -> [N, *model_shape]: as is, reshaped (a view) or channels-last transposed to
    channels-first (a view). `kind` is "same", "reshape" or "transpose"; `notice` says in one line what is
    done to the data (None when nothing is)."""

    def __init__(self, kind: str, sample_shape, model_shape, notice: str | None, source: str):
        assert kind in ("same", "reshape", "transpose"), kind
        self.kind, self.notice, self.source = kind, notice, source
        self.sample_shape, self.model_shape = tuple(sample_shape), tuple(model_shape)
        rank = len(self.sample_shape)
        # channels-last [N, d1, ..., dk, C] -> [N, C, d1, ..., dk]
        self.axes = (0, rank, *range(1, rank)) if kind == "transpose" else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.shape[1:] != self.sample_shape:
            raise DataError(
                f"{self.source}: a batch of shape {_show(x.shape)} given to an adapter for samples "
                f"{_show(self.sample_shape)} (a batch is [N, {', '.join(map(str, self.sample_shape))}])",
                self.source,
            )
        if self.kind == "reshape":
            return x.reshape((x.shape[0], *self.model_shape))
        if self.kind == "transpose":
            return np.transpose(x, self.axes)
        return x

    def __repr__(self) -> str:
        return f"SampleAdapter({self.kind!r}, {_show(self.sample_shape)} -> {_show(self.model_shape)})"


def adapt_samples(
    sample_shape, model_shape, *, layout: str | None = None, source: str = "<data>"
) -> SampleAdapter:
    """The adapter from the data's per-sample shape to the model's per-sample input shape (no batch axes).

    layout is the data's layout as the user states it: None (decide from the shapes), "nchw" (channels first:
    never transpose) or "nhwc" (channels last: transpose to channels first). DataError when the samples fit
    the model only by scrambling their values, or hold another number of values.
    """
    sample, model = _shape(sample_shape, "sample_shape"), _shape(model_shape, "model_shape")
    if isinstance(layout, str):
        layout = layout.lower()
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be None, 'nchw' or 'nhwc', got {layout!r}")
    last = _channels_last(model)
    if layout == "nhwc":
        if sample == last:
            return SampleAdapter(
                "transpose",
                sample,
                model,
                f"{source}: samples {_show(sample)} transposed from channels-last (layout 'nhwc', as stated) "
                f"to the model's channels-first input {_show(model)}",
                source,
            )
        if model and model[0] == 1 and _is_flatten(sample, model):
            # one channel has no order: channels-last and channels-first hold the same values in memory
            return _reshape(sample, model, source)
        raise _refusal(sample, model, layout, source)
    if sample == model:
        return SampleAdapter("same", sample, model, None, source)
    if _is_flatten(sample, model):
        return _reshape(sample, model, source)
    if sample == last and layout is None:
        return SampleAdapter(
            "transpose",
            sample,
            model,
            f"{source}: samples {_show(sample)} read as channels-last and transposed to the model's "
            f"channels-first input {_show(model)} (--layout nchw, or layout='nchw' from Python, refuses this)",
            source,
        )
    raise _refusal(sample, model, layout, source)


def _reshape(sample: tuple[int, ...], model: tuple[int, ...], source: str) -> SampleAdapter:
    notice = f"{source}: samples {_show(sample)} reshaped to the model's input {_show(model)}"
    return SampleAdapter("reshape", sample, model, notice, source)


def _refusal(sample: tuple[int, ...], model: tuple[int, ...], layout: str | None, source: str) -> DataError:
    """Why the samples do not fit the model, and what would."""
    head = f"{source}: samples {_counted(sample)} do not fit the model's input {_counted(model)} per sample"
    last = _channels_last(model)
    if len(sample) == 1 and math.prod(sample) == math.prod(model) + 1:
        # the commonest CSV slip: the label column read as a feature
        fix = "one value too many: is the label among the feature columns? (name it with label_column=)"
    elif math.prod(sample) != math.prod(model):
        fix = (
            "another number of values: resize or crop the data to the model's input, or convert a model "
            "for this data"
        )
    elif layout == "nchw" and sample == last:
        fix = (
            "layout 'nchw' was stated, but the samples have the shape of the model's input channels-last: if "
            "they are channels-last images, pass layout='nhwc' (--layout nhwc), or no layout to let the shapes "
            "decide"
        )
    elif layout == "nhwc" and last is None:
        fix = f"layout 'nhwc' was stated, but the model's input {_show(model)} has no channel axis to move"
    elif layout == "nhwc":
        fix = (
            f"layout 'nhwc' was stated, but channels-last samples for this model would be {_show(last)}: if "
            f"the samples are channels-first, pass layout='nchw' (--layout nchw) or no layout; if they are "
            f"flattened channels-last rows, reshape your data to {_show(last)} yourself"
        )
    else:
        maybe = f"; channels-last images for it would be {_show(last)}" if last else ""
        fix = (
            "the same number of values in another arrangement, which a reshape would scramble: reshape your "
            f"data to {_show(model)} yourself if that is its memory order{maybe}"
        )
    return DataError(f"{head}: {fix}", source)
