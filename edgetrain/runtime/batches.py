"""A batch given to a TrainingSession -> the feeds of its step (numpy only): the data inputs cast or preprocessed
by one rule (edgetrain.runtime.session.input_cast), the target in the program's shape and dtype, class labels
checked against the model's classes, with messages that name the value, the sample and the classes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetrain.core import fastpaths
from edgetrain.core.errors import FeedError
from edgetrain.core.interpreter import check_feeds
from edgetrain.graph.record import ArtifactRecord

from .session import input_cast


class BatchFeeder:
    """The feeds of one artifact's step from a batch: its data inputs, target and labels (see the module)."""

    def __init__(self, record: ArtifactRecord):
        self.record = record
        self.io = record.io
        self.target_info = record.program.values[self.io.target]
        self.n_classes = record.n_classes
        self.class_axis: tuple[int, list] = (1, [])  # (axis, output shape) of a class loss's classes
        if self.n_classes is not None:
            shape = record.program.values[self.io.outputs[0]].shape
            self.class_axis = (
                record.loss.class_axis % len(shape),
                [int(d) if type(d) is int else d for d in shape],
            )
        self.lean = self._fixed_inputs() if fastpaths.enabled("lean_step") else None
        self._data_graph = None

    def _fixed_inputs(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        """(fastpaths "lean_step") each data input's dtype and static shape, for the per-step check that passes a
        batch at once when it has them, as check_feeds would (which runs, to name what is wrong, when it has
        not); None when a shape is not static."""
        specs = {}
        for name in self.io.data_inputs:
            info = self.record.program.values[name]
            if not info.is_static:
                return None
            specs[name] = (np.dtype(info.dtype), tuple(info.shape))
        return specs

    def data(self, x: Any, *, fixed_batch: bool, allow_cast: bool, pipeline: Any, preprocess) -> dict:
        """{input: array} of the batch's data: dtypes the model takes, raw integers through the pipeline
        (preprocess(array, source)); at the training batch when fixed_batch."""
        names = self.io.data_inputs
        data = x if isinstance(x, Mapping) else {names[0]: x} if len(names) == 1 else None
        if data is None:
            raise FeedError(f"the model has {len(names)} inputs ({', '.join(names)}): pass a dict of them")
        out = {}
        pipeline = pipeline if len(names) == 1 else None  # None: no pipeline declared or set (yet)
        for name in names:
            if name not in data:
                raise FeedError(f"input '{name}' is missing; the model's inputs are: {', '.join(names)}")
            want = np.dtype(self.record.program.values[name].dtype)
            arr = np.asarray(data[name])
            how = input_cast(name, arr.dtype, want, allow_cast=allow_cast, pipeline=pipeline, values=arr)
            if how == "pipeline":  # raw integers: the model's input pipeline scales them
                arr = preprocess(arr, source=f"input '{name}'")
            elif how == "cast":
                arr = arr.astype(want)
            out[name] = arr
        if fixed_batch and not self._fits(out):
            if self._data_graph is None:  # the program seen from its data inputs, made once
                self._data_graph = self.record.program.copy(inputs=list(names))
            check_feeds(self._data_graph, out)
        return out

    def _fits(self, data: dict[str, np.ndarray]) -> bool:
        """Whether the batch has the dtypes and static shapes of the step's data inputs (fastpaths "lean_step";
        False without it: check_feeds decides)."""
        specs = self.lean
        if specs is None or len(data) != len(specs):
            return False
        for name, (dtype, shape) in specs.items():
            a = data.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                return False
        return True

    def target(self, y: Any) -> np.ndarray:
        """The target in the program's shape and dtype: class labels checked, numbers cast."""
        info = self.target_info
        try:
            y = np.asarray(y)
        except (TypeError, ValueError) as e:  # ragged lists, objects numpy cannot make an array of
            raise FeedError(f"the labels are not an array: {e}") from None
        classes = np.dtype(info.dtype).kind == "i"
        if classes:
            y = self.labels(_as_target(y, tuple(info.shape)))
        elif y.dtype != info.dtype and y.dtype.kind in "fiub":
            y = y.astype(info.dtype)
        if tuple(y.shape) != tuple(info.shape):
            per = " (one class index per sample)" if classes and not _past_batch(info.shape) else ""
            raise FeedError(f"the target must have shape {list(info.shape)}{per}, got {list(y.shape)}")
        return y

    def labels(self, y: np.ndarray) -> np.ndarray:
        """Integer class labels for the target: integral numbers within [0, classes) (or the loss's ignore_index),
        checked with one min and max before the cast, so that 1e30 or 2**64-1 is named as given, not wrapped."""
        want = self.target_info.dtype
        n = self.n_classes
        if self.lean is not None and n is not None and y.dtype.kind in "iu" and y.size:
            # one reduction: seen as unsigned, a negative label is larger than any class
            if int(np.maximum.reduce(y.view(f"u{y.dtype.itemsize}"), axis=None)) < n:
                return y.astype(want, copy=False)
        if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(np.mod(y, 1) == 0)):
            raise FeedError(f"labels must be integer class indices, got {y.dtype}")
        if n is not None and y.size:
            lo, hi = y.min(), y.max()
            if lo < 0 or hi >= n:
                self._out_of_range(y, n)
        elif y.dtype.kind == "f" and y.size and not np.all(np.abs(y) < 2**62):
            raise FeedError(f"labels must be integer class indices, got {y.dtype} values beyond any int")
        return y.astype(want, copy=False)

    def _out_of_range(self, y: np.ndarray, n: int) -> None:
        """Refuses the first label outside [0, n) that is not the ignore_index, naming it and its sample."""
        ignore = self.record.loss.ignore_index
        bad = (y < 0) | (y >= n)
        if ignore is not None:
            bad &= y != ignore
        if bad.any():
            at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad)[0]), y.shape))
            value = y[at].item()
            text = f"{value:g}" if isinstance(value, float) else str(value)
            where = f"sample {at[0]}" + (f", position {list(at[1:])}," if len(at) > 1 else "")
            also = f", or {ignore} to ignore a sample" if ignore is not None else ""
            axis, shape = self.class_axis
            raise FeedError(
                f"label {text} is out of range: the model has {n} classes (0 to {n - 1}{also}); it is "
                f"{where} of the batch (the classes are axis {axis} of the model's output {shape})"
            )


def _past_batch(shape) -> list:
    """The axes of a shape past the batch, but for those of size 1."""
    return [d for d in tuple(shape)[1:] if d != 1]


def _as_target(y: np.ndarray, shape: tuple) -> np.ndarray:
    """Class labels in the target's shape when they differ from it only by axes of size 1 past the batch: [N, 1, 1]
    labels for a [N] target, or [N] labels for an artifact whose [N, C, 1, 1] output was converted to take
    [N, 1, 1] (before the loss read it as [N, C])."""
    same_batch = y.ndim > 0 and len(shape) > 0 and y.shape[0] == shape[0]
    if same_batch and y.shape != shape and _past_batch(y.shape) == _past_batch(shape):
        return y.reshape(shape)
    return y


# ---- the input pipeline ------------------------------------------------------------------------------------------
def undeclared_pipeline(record: ArtifactRecord) -> Any:
    """The input pipeline of an artifact that declares none: the model's input dtype, nothing else."""
    from loaders import InputPipeline  # start-up: a session of a model without one loads no loaders

    names = record.io.data_inputs
    dtype = np.dtype(record.program.values[names[0]].dtype).name if len(names) == 1 else "float32"
    return InputPipeline(dtype=dtype)


def replaced_pipeline(own: Any, pipeline: Any, path: str) -> Any:
    """The pipeline a session is given (an InputPipeline or its JSON) in place of its own, which may not change
    the model's input dtype, nor replace a pipeline the artifact declares."""
    if not isinstance(pipeline, type(own)):
        pipeline = type(own).from_json(pipeline, source="preprocessing")
    if pipeline.dtype != own.dtype:
        raise FeedError(
            f"the input pipeline makes {pipeline.dtype} values, but the model's input takes {own.dtype}"
        )
    if own.declared and pipeline != own:
        raise FeedError(
            f"'{path}' declares its input pipeline ({own.describe()}), set when it was converted; another "
            f"({pipeline.describe()}) would feed the model other values than it was converted for: convert again "
            "with the preprocessing options you want"
        )
    return pipeline


def preprocess(record: ArtifactRecord, pipeline: Any, x: Any, *, allow_cast: bool, source: str) -> np.ndarray:
    """Raw samples [N, ...] -> the model's input by the pipeline (TrainingSession.preprocess)."""
    from loaders import adapt_samples  # start-up: loaded by the sessions that meet raw data
    from loaders.pipeline import array_facts  # start-up: as above

    x = np.asarray(x)
    names = record.io.data_inputs
    if len(names) != 1:
        raise FeedError(f"preprocess takes one-input models; this one has {len(names)} ({', '.join(names)})")
    want = tuple(int(d) for d in record.program.values[names[0]].shape[1:])
    if x.ndim < 1:
        raise FeedError(f"{source}: a batch [N, ...] is needed, got a scalar")
    input_cast(names[0], x.dtype, pipeline.dtype, allow_cast=allow_cast, pipeline=pipeline, values=x)
    adapter = adapt_samples(x.shape[1:], want, layout=pipeline.layout, source=source)
    pipeline.check(array_facts(x, source))
    return pipeline.preprocess(adapter)(x, np.zeros(len(x)))[0]
