"""ILoss modules: (training builder, model output, target) -> a scalar loss value, built from standard ONNX ops
appended after the model's output (the autodiff then differentiates through them like any other op).

A custom loss is a subclass with `build` (and `target_info` when its target is not shaped like the output); the
README's Huber loss is one (tests/test_losses_optimizers.py runs it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import TensorInfo

from .autodiff.context import GradContext
from .autodiff.rules.math import cross_entropy_graph

REDUCTIONS = ("mean", "sum")


class ILoss(ABC):
    """A loss module: inserts the nodes of a scalar loss after the model's output."""

    reduction: str = "mean"

    @abstractmethod
    def build(self, builder: GradContext, prediction: str, target: str) -> str:
        """Appends the loss nodes and returns the name of the scalar loss value."""

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        """The dtype and shape of the target this loss reads, given the model output's (default: the same)."""
        return prediction

    def config(self) -> dict[str, Any]:
        """The loss's settings, as recorded in the artifact (JSON values)."""
        return {"type": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def _reduce(self, g: GradContext, per_element: str) -> str:
        op = "ReduceMean" if self.reduction == "mean" else "ReduceSum"
        return g.op(op, per_element, keepdims=0, name="loss")


def _check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise UnsupportedError(
            f"reduction='{reduction}' is not supported for training; use one of {REDUCTIONS} "
            "(a training loss must be a scalar)"
        )
    return reduction


class CrossEntropyLoss(ILoss):
    """Softmax cross-entropy against integer class labels [batch] (or [batch, d1, ...] for per-position classes,
    class axis 1), as torch.nn.CrossEntropyLoss computes it. When the model's output comes from a Softmax (or
    LogSoftmax) over the class axis, the loss reads the logits under it, through a stable log-softmax."""

    def __init__(
        self, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int | None = None
    ):
        self.reduction = _check_reduction(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise UnsupportedError(f"label_smoothing={label_smoothing} must be between 0 and 1")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = None if ignore_index is None else int(ignore_index)

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        shape = tuple(prediction.shape or ())
        if len(shape) < 2:
            raise UnsupportedError(
                f"CrossEntropyLoss needs a model output of shape [batch, classes, ...], got {prediction}"
            )
        return TensorInfo(np.dtype("int64"), shape[:1] + shape[2:])

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        if len(g.shape(prediction)) == 2:  # [n, c] logits: one fused op (and one for its gradient)
            attrs = {"reduction": self.reduction, "label_smoothing": self.label_smoothing}
            if self.ignore_index is not None:
                attrs["ignore_index"] = self.ignore_index
            return g.private("SoftmaxCrossEntropy", _logits(g, prediction), target, name="loss", **attrs)
        return cross_entropy_graph(
            g,
            _log_probabilities(g, prediction),
            target,
            self.reduction,
            self.label_smoothing,
            self.ignore_index,
        )


def _logits(g: GradContext, prediction: str) -> str:
    """The logits under the model output: its Softmax/LogSoftmax input when it has one over axis 1."""
    producer = g.graph.producers().get(prediction)
    if producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        if g.attr(producer, "axis") % len(g.shape(prediction)) == 1:
            return producer.inputs[0]
    return prediction


def _log_probabilities(g: GradContext, prediction: str) -> str:
    """log-softmax over axis 1 of the logits under the model output: the output's Softmax/LogSoftmax input when
    it has one over that axis, else the output itself taken as logits."""
    producer = g.graph.producers().get(prediction)
    rank = len(g.shape(prediction))
    if producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        axis = g.attr(producer, "axis") % rank
        if axis == 1:
            if producer.op_type == "LogSoftmax":
                return prediction
            return g.op("LogSoftmax", producer.inputs[0], axis=1)
    return g.op("LogSoftmax", prediction, axis=1)


class MSELoss(ILoss):
    """Mean squared error over all elements (torch.nn.MSELoss); the target has the output's shape and dtype."""

    def __init__(self, reduction: str = "mean"):
        self.reduction = _check_reduction(reduction)

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        d = g.op("Sub", prediction, target)
        return self._reduce(g, g.op("Mul", d, d))


class L1Loss(ILoss):
    """Mean absolute error over all elements (torch.nn.L1Loss)."""

    def __init__(self, reduction: str = "mean"):
        self.reduction = _check_reduction(reduction)

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        return self._reduce(g, g.op("Abs", g.op("Sub", prediction, target)))


class BCEWithLogitsLoss(ILoss):
    """Binary cross-entropy on logits with float targets in [0, 1] (torch.nn.BCEWithLogitsLoss), in the stable
    form max(x, 0) - x*y + log(1 + exp(-|x|)); pos_weight (per class, broadcast on the last axis) weights the
    positive term."""

    def __init__(self, reduction: str = "mean", pos_weight: Any = None):
        self.reduction = _check_reduction(reduction)
        self.pos_weight = None if pos_weight is None else np.asarray(pos_weight, np.float64).tolist()

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        x, y = prediction, target
        softplus_neg_abs = g.op("Softplus", g.op("Neg", g.op("Abs", x)))  # log(1 + exp(-|x|))
        if self.pos_weight is None:
            per = g.op("Add", g.op("Sub", g.op("Relu", x), g.op("Mul", x, y)), softplus_neg_abs)
        else:
            # (1 - y) x + (1 + (pw - 1) y) (log(1 + exp(-|x|)) + max(-x, 0))
            pw = g.const(np.asarray(self.pos_weight, g.dtype(x)), hint="pos_weight")
            one = g.scalar_like(1.0, x)
            weight = g.op("Add", one, g.op("Mul", g.op("Sub", pw, one), y))
            log_sig_neg = g.op("Add", softplus_neg_abs, g.op("Relu", g.op("Neg", x)))
            per = g.op("Add", g.op("Mul", g.op("Sub", one, y), x), g.op("Mul", weight, log_sig_neg))
        return self._reduce(g, per)
