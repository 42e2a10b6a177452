"""A data file + a TrainingSession's model -> a view and the batch transform that feeds the model, with notices
(device side: numpy, loaders and the session only).

Samples are adapted to the model's input only where that keeps their meaning: a flatten or unflatten in the same
memory order, or channels-last images transposed to channels first (loaders.adapt_samples); integer token ids
stay integers, float inputs get the model's float dtype, then the optional scale and per-channel normalization.
Anything else is refused with a message that says what would work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, FeedError
from loaders import (
    DataError,
    Preprocess,
    adapt_samples,
    check_labels,
    open_data,
    parse_normalize,
    parse_scale,
)


@dataclass(frozen=True)
class DataOptions:
    """How the user says their data must be read: its layout, a scale and a per-channel normalization."""

    layout: str | None = None  # "nchw" or "nhwc": the data's own layout (None: decide from the shapes)
    scale: float | None = None  # samples are multiplied by it (1/255 for 8-bit images)
    mean: tuple[float, ...] | None = None  # then (x - mean[c]) / std[c] per channel
    std: tuple[float, ...] | None = None


@dataclass
class Feed:
    """What train and eval need of one data file: the view, the batch transform, and what was done."""

    view: Any
    transform: Preprocess
    notices: list[str]


def model_input(session) -> tuple[str, tuple[int, ...], np.dtype]:
    """(name, per-sample shape, dtype) of the model's one input; the command line trains one-input models."""
    names = session.artifact.io["data_inputs"]
    if len(names) != 1:
        raise EdgeTrainError(
            f"the model has {len(names)} inputs ({', '.join(names)}); the command line trains one-input models: "
            f"use TrainingSession with a dict of inputs from Python"
        )
    info = session.artifact.program.values[names[0]]
    return names[0], tuple(int(d) for d in info.shape[1:]), np.dtype(info.dtype)


def open_feed(path: str, split: str, session, options: DataOptions) -> Feed:
    """The view of `path` (recognised by content) and the transform that makes its batches the model's input."""
    view = open_data(path, split=split) if os.path.isdir(path) else open_data(path)
    name, want, dtype = model_input(session)
    x0, _ = view.get_item(0)
    x0 = np.asarray(x0)
    adapter = adapt_samples(x0.shape, want, layout=options.layout, source=path)
    notices = [adapter.notice] if adapter.notice else []
    arithmetic = options.scale is not None or options.mean is not None
    if dtype.kind in "iu":  # token ids, class indices: integers stay integers
        if arithmetic:
            raise FeedError(
                f"the model's input '{name}' takes {dtype} values (token ids or indices): --scale and "
                f"--normalize apply to float inputs only"
            )
        if x0.dtype.kind == "f":
            if not _integral(view):
                raise FeedError(
                    f"{path}: the samples are {x0.dtype} with fractional values, but the model's input '{name}' "
                    f"takes {dtype} (token ids or indices): store them as integers (e.g. x.astype(np.int64))"
                )
            notices.append(f"samples are whole-number {x0.dtype} values: read as {dtype} for input '{name}'")
        elif x0.dtype.kind not in "iub":
            raise FeedError(f"{path}: samples of dtype {x0.dtype} cannot feed the {dtype} input '{name}'")
    elif x0.dtype == np.uint8 and not arithmetic:
        notices.append(
            "samples are 8-bit (0-255) and are fed as they are; if the model was trained on [0, 1] inputs, "
            "pass --scale 1/255"
        )
    transform = Preprocess(adapter, scale=options.scale, mean=options.mean, std=options.std, dtype=dtype)
    classes = session.num_classes
    if classes is not None:
        check_labels(view, classes)
    return Feed(view, transform, notices)


def _integral(view, limit: int = 256) -> bool:
    """Whether the first samples of a float view hold whole numbers only."""
    n = min(view.size(), limit)
    x, _ = view.get_batch(np.arange(n))
    x = np.asarray(x)
    return bool(np.all(np.isfinite(x)) and np.all(x == np.round(x)))


def parse_options(layout: str | None, scale: str | None, normalize: str | None) -> DataOptions:
    """The command line's --layout, --scale and --normalize texts -> DataOptions (ValueError on bad text)."""

    mean = std = None
    if normalize is not None:
        mean, std = parse_normalize(normalize)
    return DataOptions(
        layout=layout,
        scale=None if scale is None else parse_scale(scale),
        mean=mean,
        std=std,
    )


__all__ = ["DataError", "DataOptions", "Feed", "model_input", "open_feed", "parse_options"]
