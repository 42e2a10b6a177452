"""ILoss modules: (training builder, model output, target) -> a scalar loss value, built from standard ONNX ops
appended after the model's output (the autodiff then differentiates through them like any other op).

A custom loss is a subclass with `build` (and `target_info` when its target is not shaped like the output); the
README's Huber loss is one (tests/derive/test_losses_optimizers.py runs it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError, UnsupportedError
from edgetrain.core.ir import TensorInfo
from edgetrain.core.ops import record
from loaders.values import count

from .autodiff.context import GradContext
from .autodiff.rules.math import cross_entropy_graph

REDUCTIONS = ("mean", "sum")


class ILoss(ABC):
    """A loss module: inserts the nodes of a scalar loss after the model's output."""

    reduction: str = "mean"

    @abstractmethod
    def build(self, builder: GradContext, prediction: str, target: str) -> str:
        """Appends the loss nodes and returns the name of the scalar loss value."""

    def prepare(self, builder: GradContext, prediction: str) -> list[str]:
        """Reads what the loss needs to know of the graph before its target is made; returns notes for the user
        about what it decided (default: nothing to read)."""
        return []

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        """The dtype and shape of the target this loss reads, given the model output's (default: the same)."""
        return prediction

    def config(self) -> dict[str, Any]:
        """The loss's settings, as recorded in the artifact (JSON values)."""
        return {"type": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def describe_target(self, prediction: TensorInfo) -> str:
        """How the targets must look, in words, for a model output of this dtype and shape (`edgetrain check`
        and `convert` print it): the default is the target's shape and dtype."""
        info = self.target_info(prediction)
        return f"targets of shape {dims(info.shape)} ({np.dtype(info.dtype).name})"

    def _reduce(self, g: GradContext, per_element: str) -> str:
        op = "ReduceMean" if self.reduction == "mean" else "ReduceSum"
        return g.op(op, per_element, keepdims=0, name="loss")


def _label(value: Any, name: str) -> int:
    """A class label given to a loss (ignore_index): a whole number an int64 target holds."""
    try:
        return count(value, name, lo=-(2**63), hi=2**63 - 1)
    except ConfigError as e:
        raise UnsupportedError(f"{e}: give a whole number, e.g. {name}=-100") from None


def _check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise UnsupportedError(
            f"reduction='{reduction}' is not supported for training; use one of {REDUCTIONS} "
            "(a training loss must be a scalar)"
        )
    return reduction


class CrossEntropyLoss(ILoss):
    """Softmax cross-entropy against integer class labels, as torch.nn.CrossEntropyLoss computes it. The model's
    output holds the classes along `class_axis`: 1 as in PyTorch ([batch, classes] or [batch, classes, d1, ...],
    labels [batch, d1, ...]); -1 for a language model's [batch, positions, vocabulary] (labels [batch, positions],
    averaged over every position, as Hugging Face flattens them); "auto" reads it from the graph (the axis the
    model's own Softmax runs over, else the last axis after a MatMul/Gemm head, axis 1 after a Conv) and says so in
    the artifact's notes. An output whose axes past the class axis all have size 1 ([batch, classes, 1, 1]:
    SqueezeNet's pooled Conv head) holds one sample's class scores: its labels are [batch], one per sample. When the
    output comes from a Softmax (or LogSoftmax) over the class axis, the loss reads the logits under it, through a
    stable log-softmax. Labels equal to ignore_index count for nothing (PyTorch's -100 is a common choice)."""

    def __init__(
        self,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        ignore_index: int | None = None,
        class_axis: int | str = 1,
    ):
        self.reduction = _check_reduction(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise UnsupportedError(f"label_smoothing={label_smoothing} must be between 0 and 1")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = None if ignore_index is None else _label(ignore_index, "ignore_index")
        if class_axis != "auto" and (
            isinstance(class_axis, bool) or not isinstance(class_axis, (int, np.integer))
        ):
            raise UnsupportedError(
                f"class_axis must be an axis number (1, -1, ...) or 'auto', not {class_axis!r}"
            )
        self.class_axis = class_axis if class_axis == "auto" else int(class_axis)
        self._decided: int | None = None  # the axis "auto" found in the graph (prepare)

    def config(self) -> dict[str, Any]:
        cfg = {
            "type": type(self).__name__,
            "reduction": self.reduction,
            "label_smoothing": self.label_smoothing,
            "ignore_index": self.ignore_index,
        }
        axis = self.axis
        if axis != 1:  # PyTorch's axis 1 is what an artifact without the key means
            cfg["class_axis"] = axis
        return cfg

    @property
    def axis(self) -> int | None:
        """The class axis: class_axis, or the one "auto" found in the graph (None until prepare has run)."""
        return self._decided if self.class_axis == "auto" else self.class_axis

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        shape = tuple(prediction.shape or ())
        if len(shape) < 2:
            raise UnsupportedError(
                f"{type(self).__name__} needs a model output of shape [batch, classes, ...], got {prediction}"
            )
        axis = _class_axis(self.axis, prediction)
        if singleton_tail(shape, axis):  # [N, C, 1, 1]: one label per sample, as for [N, C]
            return TensorInfo(np.dtype("int64"), shape[:axis])
        return TensorInfo(np.dtype("int64"), shape[:axis] + shape[axis + 1 :])

    def describe_target(self, prediction: TensorInfo) -> str:
        """e.g. "one class index 0..999 per sample, shape [N] (the output [N,1000,1,1] has singleton spatial
        axes)"."""
        shape = tuple(prediction.shape or ())
        target = self.target_info(prediction).shape
        axis = _class_axis(self.axis, prediction)
        what = "token id" if axis == len(shape) - 1 == 2 else "class index"
        per = "per sample" if len(target) == 1 else "per position"
        if singleton_tail(shape, axis):
            why = f"the output {dims(shape)} has singleton spatial axes"
        elif len(shape) == 2:
            why = f"the output {dims(shape)} holds {shape[1]} class scores per sample"
        elif axis == 1:
            why = f"the output {dims(shape)} holds the class scores on axis 1, at every position"
        else:
            why = f"class axis {axis - len(shape)} of the output {dims(shape)}"
        if self.ignore_index is not None:
            why += f"; {self.ignore_index} counts for nothing"
        return f"one {what} 0..{_last(shape[axis])} {per}, shape {dims(target)} ({why})"

    def prepare(self, g: GradContext, prediction: str) -> list[str]:
        """class_axis="auto": finds the axis that holds the classes in the graph, before the target is made."""
        if self.class_axis != "auto":
            return []
        notes: list[str] = []
        self._decided = _auto_axis(g, prediction, notes)
        return notes

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        info = g.graph.values[prediction]
        axis = _class_axis(self.axis, info)
        if singleton_tail(info.shape, axis):  # [N, C, 1, 1] read as the [N, C] scores of each sample
            prediction = _scores(g, prediction, info.shape[: axis + 1])
        rank = len(g.shape(prediction))
        if rank == 2:  # [n, c] logits: one fused op (and one for its gradient)
            return self._fused(g, _logits(g, prediction, 1), target)
        if axis == 1:  # PyTorch's [batch, classes, d1, ...]
            return cross_entropy_graph(
                g,
                _log_probabilities(g, prediction),
                target,
                self.reduction,
                self.label_smoothing,
                self.ignore_index,
            )
        logits = _logits(g, prediction, axis)
        if axis != rank - 1:  # the classes last, where the fused op reads them
            logits = g.op("Transpose", logits, perm=[k for k in range(rank) if k != axis] + [axis])
        return self._fused(g, _rows(g, logits), g.op("Reshape", target, g.ints([-1], hint="flat")))

    def _fused(self, g: GradContext, logits: str, target: str) -> str:
        attrs = {"reduction": self.reduction, "label_smoothing": self.label_smoothing}
        if self.ignore_index is not None:
            attrs["ignore_index"] = self.ignore_index
        return g.private("SoftmaxCrossEntropy", logits, target, name="loss", **attrs)


class NextTokenLoss(CrossEntropyLoss):
    """The loss of a causal language model (Hugging Face's GPT2LMHeadModel(labels=ids).loss): the output is
    [batch, positions, vocabulary] logits, the target the token ids [batch, positions] themselves (padding marked
    ignore_index, -100 by default), and position t predicts the token at t + 1: the logits of every position but
    the last against the labels of every position but the first, shifted inside the graph, averaged over the tokens
    not ignored."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"):
        super().__init__(reduction, label_smoothing, ignore_index, class_axis=-1)

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        shape = tuple(prediction.shape or ())
        if len(shape) != 3 or (isinstance(shape[1], int) and shape[1] < 2):
            raise UnsupportedError(
                "NextTokenLoss needs a model output of [batch, positions, vocabulary] logits with 2 positions or "
                f"more, got {prediction}"
            )
        return TensorInfo(np.dtype("int64"), shape[:2])

    def describe_target(self, prediction: TensorInfo) -> str:
        shape = tuple(prediction.shape)
        return (
            f"the token ids themselves, 0..{_last(shape[2])} per position, shape {dims(shape[:2])} (position t "
            f"learns token t + 1; {self.ignore_index} marks padding, which counts for nothing)"
        )

    def build(self, g: GradContext, prediction: str, target: str) -> str:
        t = g.shape(prediction)[1]
        one = g.ints([1], hint="axis")
        logits = g.op(
            "Slice", _logits(g, prediction, 2), g.ints([0], hint="start"), g.ints([t - 1], hint="end"), one
        )
        labels = g.op("Slice", target, g.ints([1], hint="start"), g.ints([t], hint="end"), one)
        return self._fused(g, _rows(g, logits), g.op("Reshape", labels, g.ints([-1], hint="flat")))


def _class_axis(axis: int | None, prediction: TensorInfo) -> int:
    """The class axis as a non-negative number; not the batch axis 0."""
    rank = len(prediction.shape or ())
    if axis is None or not -rank <= axis < rank or axis % rank == 0:
        raise UnsupportedError(
            f"class_axis {axis} is not an axis of the model output {prediction} past its batch axis 0; use 1 "
            "(PyTorch's [batch, classes, ...]) or -1 (a language model's [batch, positions, vocabulary])"
        )
    return axis % rank


def singleton_tail(shape: Any, axis: int) -> bool:
    """Whether the axes past the class axis all have size 1 ([N, C, 1, 1]: SqueezeNet's pooled Conv head): class
    scores per sample, which take one label per sample; a segmentation's [N, C, H, W] takes one per position."""
    rest = tuple(shape or ())[axis + 1 :]
    return bool(rest) and all(d == 1 for d in rest)


def dims(shape: Any) -> str:
    """A shape as the user reads it, the batch axis named N: [N,1000,1,1]."""
    return "[" + ",".join(["N", *(str(d) for d in tuple(shape)[1:])]) + "]"


def _last(classes: Any) -> Any:
    """The last class index of a class axis of this size (of a symbolic size, in words)."""
    return classes - 1 if isinstance(classes, (int, np.integer)) else f"{classes}-1"


def _scores(g: GradContext, value: str, shape: tuple) -> str:
    """`value` ([N, C, 1, 1]) as `shape` ([N, C]): the value under it when the model only added the singleton
    axes (the zoo SqueezeNet reshapes its Softmax's [N, C] output; the loss must see that Softmax to read its
    logits), else a Reshape of it."""
    producers = g.graph.producers()
    under = value
    while tuple(g.shape(under)) != tuple(shape):
        p = producers.get(under)
        if p is None or p.op_type not in _SAME_ORDER or not p.inputs:
            return g.op("Reshape", value, g.ints(list(shape), hint="scores"))
        under = p.inputs[0]
    return under


_SAME_ORDER = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")  # the elements in the same order


def _auto_axis(g: GradContext, prediction: str, notes: list[str]) -> int:
    """The axis that holds the classes, by the graph: the axis of the model's own Softmax, else the last one after a
    MatMul/Gemm head (a linear layer writes its features last), else 1 after a Conv, or for [batch, classes]."""
    shape = list(g.shape(prediction))
    rank = len(shape)
    producer = _producer(g, prediction)
    head = _head(g, prediction)
    if producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        axis, why = g.attr(producer, "axis") % rank, f"the model's {producer.op_type} runs over it"
    elif rank == 2:
        axis, why = 1, "the output is [batch, classes]"
    elif singleton_tail(shape, 1):
        axis, why = 1, "the output's axes past axis 1 have size 1 (the class scores of each sample)"
    elif head in ("MatMul", "Gemm", "Einsum"):
        axis, why = rank - 1, f"the model's last {head} writes its classes last"
    elif head in ("Conv", "ConvTranspose"):
        axis, why = 1, f"the model ends in a {head}, whose channels are axis 1"
    else:
        raise UnsupportedError(
            f"class_axis='auto' cannot tell which axis of the output '{prediction}' {shape} holds the classes; "
            "give class_axis=1 (PyTorch's) or -1"
        )
    notes.append(f"class axis {axis} of the output '{prediction}' {shape} ({shape[axis]} classes): {why}")
    return axis


def _rows(g: GradContext, logits: str) -> str:
    """[..., classes] logits as [rows, classes]: every position one row of the fused softmax cross-entropy."""
    return g.op("Reshape", logits, g.ints([-1, g.shape(logits)[-1]], hint="rows"))


def _head(g: GradContext, value: str) -> str:
    """The op that computes `value`, looking through ops that only rearrange it and through an added bias."""
    producers = g.graph.producers()
    p = producers.get(value)
    while p is not None and (record(p.op_type).rearranges or p.op_type == "Add") and p.inputs:
        computed = [i for i in p.inputs if i in producers]  # through a bias: the operand a node computes
        p = producers.get(computed[0] if computed else p.inputs[0])
    return p.op_type if p is not None else ""


def _producer(g: GradContext, value: str):
    """The node that computes the model output `value`, through the fake quantization an int8 model puts on its
    output (the loss reads the values under it, as PyTorch's QAT computes its loss on float logits)."""
    producers = g.graph.producers()
    p = producers.get(value)
    if p is not None and p.op_type == "FakeQuantize":
        p = producers.get(p.inputs[0])
    return p


def _logits(g: GradContext, prediction: str, axis: int) -> str:
    """The logits under the model output: its Softmax/LogSoftmax input when it has one over the class axis."""
    producer = _producer(g, prediction)
    if producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        if g.attr(producer, "axis") % len(g.shape(prediction)) == axis:
            return producer.inputs[0]
    return prediction


def _log_probabilities(g: GradContext, prediction: str) -> str:
    """log-softmax over axis 1 of the logits under the model output: the output's Softmax/LogSoftmax input when
    it has one over that axis, else the output itself taken as logits."""
    producer = _producer(g, prediction)
    rank = len(g.shape(prediction))
    if producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        axis = g.attr(producer, "axis") % rank
        if axis == 1:
            if producer.op_type == "LogSoftmax":
                return producer.outputs[0]
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
