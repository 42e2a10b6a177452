"""The app's home for a classifier's (or a regression model's) samples, the digits of the page: a labelled sample
or a data file in, fitted to the model's input by its input pipeline; predictions out. Everything else a home does
(files, versions, bursts, reports) is home.BaseHome's; a text home (text.TextHome) takes sentences instead.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import edgetrain as et
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataLoader
from loaders.values import number

from .burst import BurstResult, json_number
from .home import BaseHome
from .settings import AppError, VersionError

__all__ = ["AppError", "BurstResult", "Home"]

_QUANTIZERS = ("FakeQuantize", "QuantizeLinear", "DequantizeLinear")


def _ends_in_softmax(sess: et.TrainingSession) -> bool:
    """Whether the model's output is a Softmax's, read directly or through an int8 model's output quantization."""
    graph = sess.artifact.base
    producers = graph.producers()
    node = producers.get(graph.outputs[0])
    while node is not None and node.op_type in _QUANTIZERS:
        node = producers.get(node.inputs[0])
    return node is not None and node.op_type == "Softmax"


def _numbers(v: Any, what: str) -> np.ndarray:
    """v as a numeric array (integers or floats, not text, booleans or objects); AppError naming `what`."""
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise AppError(f"{what} is not an array of numbers ({e})") from None
    if a.dtype.kind not in "iuf":
        raise AppError(f"{what} holds {a.dtype} values; give numbers (integers or floats)")
    return a


def _finite(x: np.ndarray, what: str, first: int) -> None:
    """Refuses samples holding NaN or infinity (what a file's numbers can become once scaled), naming the first."""
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        k = int(np.argmin(np.isfinite(x).reshape(len(x), -1).all(axis=1)))
        raise AppError(
            f"{what} {first + k} is not finite once fed to the model (NaN or infinity: its values, or a --scale or "
            f"--normalize that takes them beyond float32); check the data, or use a smaller scale"
        )


def _checked_options(options: DataOptions) -> DataOptions:
    """The file options' numbers checked (loaders/values.py): a scale, means and stds a float32 input can hold."""
    if options.scale is not None:
        number(options.scale, "--scale", positive=True, fix="give a factor such as 1/255")
    for name, values in (("mean", options.mean), ("std", options.std)):
        for v in () if values is None else np.ravel(np.asarray(values, dtype=object)):
            number(v, f"--normalize {name}", positive=name == "std", fix="give MEAN,STD such as 0.5,0.25")
    return options


class Home(BaseHome):
    """A home whose samples are labelled: one at a time from the page (add), or a data file's (add_data); the
    current version predicts."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        if self.settings.get("mode") != "digits":
            raise AppError(
                f"{self.path} is a {self.settings.get('mode')} home, not one of labelled samples "
                "(android_demo.text.open_home opens a home as its kind)"
            )

    def _model_input(self, sess: et.TrainingSession, x: np.ndarray) -> np.ndarray:
        """Raw samples [N, ...] -> the model's input, by the model's input pipeline (checked against it)."""
        name = sess.data_inputs[0]
        want = tuple(int(d) for d in sess.artifact.program.values[name].shape[1:])
        if not sess.preprocessing.declared and tuple(x.shape[1:]) == want:
            return x
        return sess.preprocess(x, source="the sample")

    def predict(self, x: np.ndarray, *, with_version: bool = False):
        """The current model's output for samples [N, ...] (class probabilities for a classifier); with_version:
        (output, the version that computed it), read together so that a burst ending meanwhile cannot mislabel it."""
        with self._cache_lock:  # one interpreter: its buffers serve one run at a time
            v, sess = self._cached()
            out = np.asarray(sess.run(self._model_input(sess, np.asarray(x))), np.float64)
        if not np.isfinite(out).all():
            raise VersionError(
                f"version {v} gives NaN or infinity for this sample: nothing is predicted. {self._kept_sentence(v)}"
            )
        # logits become probabilities; a Softmax's output stays as the model gives it, an int8 model's too, whose
        # quantized probabilities sum to 1 only within its output's steps (a softmax of them would flatten them)
        if sess.num_classes is not None and not _ends_in_softmax(sess):
            if not np.allclose(out.sum(axis=1), 1.0, atol=1e-3):
                out = np.exp(out - out.max(axis=1, keepdims=True))
                out /= out.sum(axis=1, keepdims=True)
        return (out, v) if with_version else out

    # ---- samples -------------------------------------------------------------------------------------------------
    def add(self, x: Any, y: Any) -> int:
        """Adds one labelled sample, raw (the model's input pipeline makes it the model's input, as for files);
        returns its id once it is committed."""
        sess = self._inference()
        name = sess.data_inputs[0]
        info = sess.artifact.program.values[name]
        raw = _numbers(x, "the sample")
        try:
            x = self._model_input(sess, raw[None])[0]
        except et.EdgeTrainError as e:
            raise AppError(f"a sample of shape {list(raw.shape)}: {e}") from None
        _finite(x.astype(info.dtype, copy=False)[None], "the sample", 0)
        y = self._label(sess, y)
        with self.store() as s:
            sid = s.add(x.astype(info.dtype, copy=False), y)
        self._log("add", id=sid, label=y.tolist())
        return sid

    def add_data(self, path: str, *, layout: str | None = None, options: DataOptions | None = None):
        """Adds every sample of a data file (anything loaders.open_data reads), fitted to the model's input as
        `edgetrain train` fits it, by the model's input pipeline (or the scaling the options give, which a home
        whose model declares none adopts for all its samples); returns (count, notices)."""
        options = _checked_options(options or DataOptions(layout=layout))
        sess = self._inference()
        before = sess.preprocessing
        feed = open_feed(path, "train", sess, options)
        adopted = (
            sess.preprocessing != before
        )  # the options declared a pipeline: every sample must be fed by it
        n = feed.view.size()

        def batches():
            for start in range(0, n, 256):
                idx = np.arange(start, min(n, start + 256))
                x, y = feed.transform(*feed.view.get_batch(idx))
                _finite(x, f"{path}: sample", start)  # a scale can take values beyond float32
                yield list(x), [self._label(sess, v) for v in y]

        try:
            if adopted:
                self._adopt(sess)
            with self.store() as s:
                added = len(s.add_stream(batches()))  # one transaction: a refused file adds nothing
        except BaseException:
            if adopted:  # nor does it leave its pipeline adopted, in the settings or the cached session
                with self._cache_lock:
                    self._session_cache = None
                self.reset_settings("preprocessing")
            raise
        self._log("add_data", path=os.path.basename(path), samples=added)
        return added, feed.notices

    def _adopt(self, sess: et.TrainingSession) -> None:
        """Records the input pipeline a file's options declared, for every later sample, page and burst; refused
        when the store already holds samples fed without it."""
        held = self.sample_count()
        if held:
            with self._cache_lock:
                self._session_cache = None
            raise AppError(
                f"the store holds {held} samples fed as they were read; --scale/--normalize now would feed the "
                f"model two kinds of values: set up a new home and add every file with the same options"
            )
        self.update_settings(preprocessing=sess.preprocessing.to_json())

    def _label(self, sess: et.TrainingSession, y: Any) -> np.ndarray:
        """A class number (an integer, or a float that is one) for a classifier; finite float32 numbers for a
        regression model. Text, booleans and anything else are refused, never converted."""
        y = _numbers(y, "the label")
        classes = sess.num_classes
        if classes is not None:
            v = y.ravel()[0] if y.size == 1 else None
            if v is None or not np.isfinite(v) or not float(v).is_integer() or not 0 <= v < classes:
                shown = repr(y.tolist()) if y.size <= 8 else f"of shape {list(y.shape)}"
                raise AppError(f"label {shown}: the model takes a class from 0 to {classes - 1}")
            return np.asarray(int(v), np.int64)
        out = y.astype(np.float32)
        if not np.isfinite(out).all():
            bad = y.ravel()[~np.isfinite(out.ravel())][0]
            raise AppError(
                f"label value {bad!r} is not a finite float32 number (the model's targets are float32): give values "
                f"within +-{np.finfo(np.float32).max:.3g}"
            )
        return out

    # ---- reports -------------------------------------------------------------------------------------------------
    def evaluate_data(self, path: str, *, layout: str | None = None) -> dict[str, Any]:
        """{"accuracy", "loss", "samples"} of the current model on a data file."""
        sess = self.session()
        feed = open_feed(path, "test", sess, DataOptions(layout=layout))
        batch = session_batch(sess) or 32
        loader = DataLoader(feed.view, batch, batch_transform=feed.transform)
        loss, acc = evaluate(sess, loader, classification=sess.num_classes is not None)
        if not np.isfinite(loss):
            raise VersionError(
                f"version {self.version} gives a loss of {loss} on {path} (NaN or infinity). {self._kept_sentence()}"
            )
        return {"accuracy": json_number(acc), "loss": json_number(loss), "samples": feed.view.size()}
