"""IOptimizer modules: (training builder, weight, gradient) -> updated weight, built from standard ONNX ops that
follow the gradients in the same graph. The graph stays stateless: optimizer state (momentum, Adam moments, the
step count) comes in as graph inputs and leaves as outputs; the learning rate is a graph input."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError, UnsupportedError
from edgetrain.core.ir import TensorInfo
from edgetrain.core.kernels.cast import onnx_type
from loaders.values import number

from .autodiff.context import GradContext


class TrainingContext(GradContext):
    """A GradContext that also holds the training step's interface: the learning-rate input, the optimizer's
    state tensors (inputs with initial values, and their updated values as outputs) and the step counter."""

    def __init__(self, builder, *, lr: str):
        super().__init__(builder)
        self.lr = lr
        self.state_inputs: dict[str, np.ndarray] = {}  # state input name -> initial value
        self.state_updates: dict[str, str] = {}  # state input name -> its updated value
        # state input name -> (what it is, the weight it belongs to): how the runtime's fused optimizer finds it
        self.state_roles: dict[str, tuple[str, str]] = {}
        self._step: tuple[str, str] | None = None

    def state(self, name: str, initial: np.ndarray, *, role: tuple[str, str] | None = None) -> str:
        """A state tensor: a graph input called `name` (starting at `initial`); set its next value with
        update_state. role: (kind, weight), e.g. ("momentum", "fc.weight"), for the runtime's fused optimizer."""
        assert name not in self.state_inputs, f"state '{name}' declared twice"
        name = self.b.fresh(name)
        if role is not None:
            self.state_roles[name] = role
        initial = np.asarray(initial)
        self.state_inputs[name] = initial
        self.b.graph.inputs.append(name)
        self.b.graph.values[name] = TensorInfo(initial.dtype, tuple(initial.shape))
        return name

    def update_state(self, name: str, value: str) -> None:
        assert name in self.state_inputs and name not in self.state_updates
        self.state_updates[name] = value

    def step(self) -> tuple[str, str]:
        """(steps taken so far, that count plus one) as float32 scalars; the counter is state 'optimizer.step'."""
        if self._step is None:
            t = self.state("optimizer.step", np.zeros((), np.float32), role=("step", ""))
            t1 = self.op("Add", t, self.const(np.ones((), np.float32), hint="one"), name="optimizer_step")
            self.update_state(t, t1)
            self._step = (t, t1)
        return self._step


class IOptimizer(ABC):
    """An optimizer module. Subclasses implement make(); make_multiple() (clipping, then one make per weight) is
    implemented once here."""

    lr: float
    clip_grad_norm: float | None = None

    @abstractmethod
    def make(self, builder: TrainingContext, weight: str, grad: str) -> str:
        """Appends the update of one weight and returns the name of its updated value."""

    def make_multiple(
        self, builder: TrainingContext, weights: Sequence[str], grads: Sequence[str]
    ) -> list[str]:
        """Updates every weight; with clip_grad_norm, first scales all gradients so that their global L2 norm is
        at most clip_grad_norm (torch.nn.utils.clip_grad_norm_)."""
        grads = list(grads)
        if self.clip_grad_norm is not None:
            grads = _clip_by_global_norm(builder, grads, self.clip_grad_norm)
        return [self.make(builder, w, g) for w, g in zip(weights, grads)]

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def fusable(self) -> bool:
        """Whether the runtime may run this optimizer's update as its own fused kernel over flat buffers (the
        same arithmetic, in the same order): true for SGD, Adam and AdamW as defined here, false for subclasses
        that change the update and for other optimizers, whose graph the runtime then runs as it is."""
        return False


def _clip_by_global_norm(g: TrainingContext, grads: list[str], max_norm: float) -> list[str]:
    # total = sqrt(sum_i |g_i|^2); coef = min(1, max_norm / (total + 1e-6)); g_i *= coef
    squares = [g.op("ReduceSumSquare", d, keepdims=0) for d in grads]
    total = g.op("Sqrt", squares[0] if len(squares) == 1 else g.op("Sum", *squares), name="grad_norm")
    coef = g.op("Div", g.scalar_like(max_norm, total), g.op("Add", total, g.scalar_like(1e-6, total)))
    coef = g.op("Min", coef, g.scalar_like(1.0, total))
    return [g.op("Mul", d, coef) for d in grads]


def _check(
    name: str, value: float, *, low: float = 0.0, high: float | None = None, positive: bool = False
) -> float:
    """A hyperparameter: a finite real number (not a bool or a string) that float32 holds, >= low (> 0 when
    positive) and < high; an UnsupportedError naming it otherwise (a step computes with it in float32: an infinite
    or NaN rate, momentum or epsilon would make every parameter NaN from the first step)."""
    try:
        v = number(value, name, positive=positive)
    except ConfigError as e:
        raise UnsupportedError(f"{e}: give a finite number (e.g. {name}=0.01)") from None
    if v < low or (high is not None and v >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise UnsupportedError(f"{name}={v} is out of range: it must be {bound}")
    return v


class SGD(IOptimizer):
    """Stochastic gradient descent with PyTorch's semantics (torch.optim.SGD):
    g += weight_decay * w; v = momentum * v + (1 - dampening) * g (v = g on the first step);
    w -= lr * (g + momentum * v if nesterov else v)."""

    def __init__(
        self,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        dampening: float = 0.0,
        clip_grad_norm: float | None = None,
    ):
        self.lr = _check("lr", lr)
        self.momentum = _check("momentum", momentum)
        self.weight_decay = _check("weight_decay", weight_decay)
        self.dampening = _check("dampening", dampening)
        self.nesterov = bool(nesterov)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise UnsupportedError(
                "nesterov=True needs momentum > 0 and dampening = 0 (as in torch.optim.SGD)"
            )
        self.clip_grad_norm = (
            None if clip_grad_norm is None else _check("clip_grad_norm", clip_grad_norm, positive=True)
        )

    def make(self, g: TrainingContext, weight: str, grad: str) -> str:
        d = grad
        if self.weight_decay:
            d = g.op("Add", d, g.op("Mul", weight, g.scalar_like(self.weight_decay, weight)))
        if self.momentum:
            v = g.state(
                f"{weight}.momentum", np.zeros(g.shape(weight), g.dtype(weight)), role=("momentum", weight)
            )
            v_new = g.op("Mul", v, g.scalar_like(self.momentum, weight))
            scaled = d if self.dampening == 0 else g.op("Mul", d, g.scalar_like(1.0 - self.dampening, weight))
            v_new = g.op("Add", v_new, scaled)
            if self.dampening:  # PyTorch's first step sets v = g, undamped
                first = g.op("Equal", g.step()[0], g.const(np.zeros((), np.float32), hint="zero"))
                v_new = g.op("Where", first, d, v_new)
            g.update_state(v, v_new)
            d = (
                g.op("Add", d, g.op("Mul", v_new, g.scalar_like(self.momentum, weight)))
                if self.nesterov
                else v_new
            )
        return g.op("Sub", weight, g.op("Mul", d, _lr(g, weight)), name=f"{weight}_update")

    def fusable(self) -> bool:
        return type(self).make is SGD.make and type(self).make_multiple is IOptimizer.make_multiple


def _lr(g: TrainingContext, like: str) -> str:
    """The learning-rate input in like's dtype."""
    if g.dtype(g.lr) == g.dtype(like):
        return g.lr
    return g.op("Cast", g.lr, to=onnx_type(g.dtype(like)))


class Adam(IOptimizer):
    """Adam with bias correction (torch.optim.Adam, amsgrad=False): weight_decay adds weight_decay * w to the
    gradient (L2); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""

    decoupled = False

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        clip_grad_norm: float | None = None,
    ):
        self.lr = _check("lr", lr)
        self.betas = (_check("betas[0]", betas[0], high=1.0), _check("betas[1]", betas[1], high=1.0))
        self.eps = _check("eps", eps, positive=True)
        self.weight_decay = _check("weight_decay", weight_decay)
        self.clip_grad_norm = (
            None if clip_grad_norm is None else _check("clip_grad_norm", clip_grad_norm, positive=True)
        )

    def make(self, g: TrainingContext, weight: str, grad: str) -> str:
        b1, b2 = self.betas
        lr = _lr(g, weight)
        d = grad
        if self.weight_decay and not self.decoupled:
            d = g.op("Add", d, g.op("Mul", weight, g.scalar_like(self.weight_decay, weight)))
        w = weight
        if self.weight_decay and self.decoupled:  # AdamW: w *= 1 - lr * weight_decay, before the Adam step
            w = g.op(
                "Mul",
                weight,
                g.op(
                    "Sub",
                    g.scalar_like(1.0, weight),
                    g.op("Mul", lr, g.scalar_like(self.weight_decay, weight)),
                ),
            )
        zeros = np.zeros(g.shape(weight), g.dtype(weight))
        m = g.state(f"{weight}.exp_avg", zeros, role=("exp_avg", weight))
        v = g.state(f"{weight}.exp_avg_sq", zeros, role=("exp_avg_sq", weight))
        m_new = g.op(
            "Add", g.op("Mul", m, g.scalar_like(b1, weight)), g.op("Mul", d, g.scalar_like(1 - b1, weight))
        )
        v_new = g.op(
            "Add",
            g.op("Mul", v, g.scalar_like(b2, weight)),
            g.op("Mul", g.op("Mul", d, d), g.scalar_like(1 - b2, weight)),
        )
        g.update_state(m, m_new)
        g.update_state(v, v_new)
        t = g.step()[1]
        if g.dtype(t) != g.dtype(weight):
            t = g.op("Cast", t, to=onnx_type(g.dtype(weight)))
        one = g.scalar_like(1.0, weight)
        bc1 = g.op("Sub", one, g.op("Pow", g.scalar_like(b1, weight), t))
        bc2 = g.op("Sub", one, g.op("Pow", g.scalar_like(b2, weight), t))
        denom = g.op("Add", g.op("Sqrt", g.op("Div", v_new, bc2)), g.scalar_like(self.eps, weight))
        step = g.op("Mul", g.op("Div", lr, bc1), g.op("Div", m_new, denom))
        return g.op("Sub", w, step, name=f"{weight}_update")

    def fusable(self) -> bool:
        return type(self).make is Adam.make and type(self).make_multiple is IOptimizer.make_multiple


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW; default weight_decay 0.01)."""

    decoupled = True

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        clip_grad_norm: float | None = None,
    ):
        super().__init__(lr, betas, eps, weight_decay, clip_grad_norm)
