"""A data file + a TrainingSession's model -> a view and the batch transform that feeds the model, with notices
(device side: numpy, loaders and the session only).

Samples are adapted to the model's input only where that keeps their meaning: a flatten or unflatten in the same
memory order, or channels-last images transposed to channels first (loaders.adapt_samples); integer token ids
stay integers, float inputs get the model's float dtype, then the optional scale and per-channel normalization.
Integers for a float input need a pipeline that scales them, or the user's word (--cast, allow_cast) to be cast
as they are. Anything else is refused with a message that says what would work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, FeedError
from loaders import (
    DataError,
    ImageFilesView,
    InputPipeline,
    MnistDataView,
    Preprocess,
    adapt_samples,
    check_labels,
    data_facts,
    open_data,
    parse_normalize,
    parse_scale,
)
from loaders.preprocess import divisor

from .session import input_cast


@dataclass(frozen=True)
class DataOptions:
    """How the user says their data must be read: its layout, a scale and a per-channel normalization (for an
    artifact that declares no input pipeline, or the same as it declares), and the keys of an .npz's arrays."""

    layout: str | None = None  # "nchw" or "nhwc": the data's own layout (None: decide from the shapes)
    scale: float | None = None  # samples are multiplied by it (1/255 for 8-bit images)
    mean: tuple[float, ...] | None = None  # then (x - mean[c]) / std[c] per channel
    std: tuple[float, ...] | None = None
    x_key: str | None = None  # an .npz's array of samples (default "x") and of labels (default "y")
    y_key: str | None = None


@dataclass
class Feed:
    """What train and eval need of one data file: the view, the batch transform, and what was done."""

    view: Any
    transform: Preprocess
    notices: list[str]
    pipeline: InputPipeline | None = None  # the input pipeline the transform applies


def model_input(session) -> tuple[str, tuple[int, ...], np.dtype]:
    """(name, per-sample shape, dtype) of the model's one input; the command line trains one-input models."""
    names = session.data_inputs
    if len(names) != 1:
        raise EdgeTrainError(
            f"the model has {len(names)} inputs ({', '.join(names)}); the command line trains one-input models: "
            f"use TrainingSession with a dict of inputs from Python"
        )
    info = session.artifact.program.values[names[0]]
    return names[0], tuple(int(d) for d in info.shape[1:]), np.dtype(info.dtype)


def input_pipeline(session, options: DataOptions = DataOptions()) -> InputPipeline:
    """The pipeline that feeds the session: the one it declares (at convert, or recorded by a checkpoint it
    loaded), which options may repeat but not contradict; else one made of the options (an artifact from before
    pipelines, or converted without preprocessing options)."""
    own = session.preprocessing
    asked = {"scale": options.scale, "mean": options.mean, "std": options.std}
    asked = {k: v for k, v in asked.items() if v is not None}
    if not own.declared:
        spec = {**own.to_json(), **asked, "layout": options.layout}
        if options.scale is not None and divisor(options.scale) == 255:
            spec["raw_dtype"] = "uint8"
        return InputPipeline.from_json({k: v for k, v in spec.items() if v is not None})
    for key, value in asked.items():
        have = getattr(own, key)
        if have is None or not np.allclose(np.ravel(have), np.ravel(value), rtol=1e-9, atol=0):
            raise FeedError(
                f"--{'scale' if key == 'scale' else 'normalize'} contradicts the model's input pipeline "
                f"({own.describe()}), which was declared when it was converted (or recorded by its checkpoint) and "
                f"is applied to every batch already: leave the option out"
            )
    if options.layout is not None and own.layout is not None and options.layout != own.layout:
        raise FeedError(
            f"--layout {options.layout} contradicts the model's input pipeline, which reads {own.layout} data "
            f"({own.describe()}): leave the option out"
        )
    if options.layout is not None and own.layout is None:
        return InputPipeline.from_json({**own.to_json(), "layout": options.layout})
    return own


def open_feed(path: str, split: str, session, options: DataOptions) -> Feed:
    """The view of `path` (recognised by content) and the transform that makes its batches the model's input."""
    pipeline = input_pipeline(session, options)
    view = _open_view(path, split, session, pipeline, options)
    feed = feed_view(view, session, pipeline)
    if pipeline.declared and not session.preprocessing.declared:
        session.preprocessing = (
            pipeline  # recorded in the run's checkpoints, applied by their eval and export
        )
    return feed


def _open_view(path: str, split: str, session, pipeline: InputPipeline, options: DataOptions):
    """open_data(path) with what the pipeline asks of the reader: raw MNIST pixels when the pipeline scales, the
    npz keys given."""
    kwargs = {k: v for k, v in (("x_key", options.x_key), ("y_key", options.y_key)) if v is not None}
    if os.path.isdir(path):
        kwargs["split"] = split
    view = open_data(path, **kwargs)
    if isinstance(view, MnistDataView) and pipeline.reads_raw():
        # the pipeline divides by 255 itself: the reader's own x / 255 would scale a second time
        view = view.raw()
    if isinstance(
        view, ImageFilesView
    ):  # decoded with the model's channels, resized and cropped by the pipeline
        _, want, _ = model_input(session)
        images = {"channels": want[0]} if len(want) == 3 and want[0] in (1, 3) else {}
        images.update({k: v for k, v in (("size", pipeline.size), ("crop", pipeline.crop)) if v is not None})
        if images:
            view = open_data(path, **kwargs, **images)
    return view


def feed_view(view, session, pipeline: InputPipeline | None = None) -> Feed:
    """The transform that makes `view`'s batches the input of the session's model (its input pipeline, or the
    one given), after checking the data against it: notices say what is done to the data, a FeedError or
    DataError what contradicts the model. Integer or bool samples for a float input follow the sessions' rule
    (edgetrain.runtime.session.input_cast): fed when the pipeline takes integers (it scales them), cast as they
    are when the session's allow_cast is set (the command line's --cast), else refused with what to do."""
    pipeline = session.preprocessing if pipeline is None else pipeline
    path = view.source
    name, want, dtype = model_input(session)
    x0, _ = view.get_item(0)
    x0 = np.asarray(x0)
    try:
        adapter = adapt_samples(x0.shape, want, layout=pipeline.layout, source=path)
    except DataError as e:
        if isinstance(view, ImageFilesView) and len(want) == 3 and x0.shape[:2] != want[1:]:
            raise DataError(
                f"{e}; images of another size are resized by the model's input pipeline: convert with --resize "
                f"{want[1]},{want[2]} (or --resize H,W --crop {want[1]},{want[2]})",
                path,
            ) from None
        raise
    notices = [adapter.notice] if adapter.notice else []
    if dtype.kind in "iu":  # token ids, class indices: integers stay integers
        notices += _integer_input(view, x0, name, dtype, path)
    else:
        facts = data_facts(view)
        allow = bool(getattr(session, "allow_cast", False))
        how = input_cast(
            name,
            facts.dtype,
            dtype,
            allow_cast=allow,
            pipeline=pipeline,
            values=(facts.lo, facts.hi),
            ways="command line",
        )
        checked = pipeline.check(facts)  # an 8-bit note says they are fed as they are, and how to scale them
        if how == "cast" and facts.dtype.kind in "biu" and not checked:
            checked = [f"{path}: {facts.describe()}, cast to {dtype} as they are, unscaled (--cast)"]
        notices += checked
    transform = pipeline.preprocess(adapter)
    classes = session.num_classes
    if classes is not None:
        target = session.record.program.values[session.record.io.target]
        check_labels(view, classes, per_sample=tuple(int(d) for d in (target.shape or ())[1:]))
    return Feed(view, transform, notices, pipeline)


def _integer_input(view, x0: np.ndarray, name: str, dtype: np.dtype, path: str) -> list[str]:
    if x0.dtype.kind == "f":
        if not _integral(view):
            raise FeedError(
                f"{path}: the samples are {x0.dtype} with fractional values, but the model's input '{name}' "
                f"takes {dtype} (token ids or indices): store them as integers (e.g. x.astype(np.int64))"
            )
        return [f"samples are whole-number {x0.dtype} values: read as {dtype} for input '{name}'"]
    if x0.dtype.kind not in "iub":
        raise FeedError(f"{path}: samples of dtype {x0.dtype} cannot feed the {dtype} input '{name}'")
    return []


def _integral(view, limit: int = 256) -> bool:
    """Whether the first samples of a float view hold whole numbers only."""
    n = min(view.size(), limit)
    x, _ = view.get_batch(np.arange(n))
    x = np.asarray(x)
    return bool(np.all(np.isfinite(x)) and np.all(x == np.round(x)))


def parse_options(
    layout: str | None,
    scale: str | None,
    normalize: str | None,
    x_key: str | None = None,
    y_key: str | None = None,
) -> DataOptions:
    """The command line's --layout, --scale, --normalize, --x-key and --y-key -> DataOptions (ValueError on bad
    text)."""

    mean = std = None
    if normalize is not None:
        mean, std = parse_normalize(normalize)
    return DataOptions(
        layout=layout,
        scale=None if scale is None else parse_scale(scale),
        mean=mean,
        std=std,
        x_key=x_key,
        y_key=y_key,
    )


__all__ = [
    "DataError",
    "DataOptions",
    "Feed",
    "feed_view",
    "input_pipeline",
    "model_input",
    "open_feed",
    "parse_options",
]
