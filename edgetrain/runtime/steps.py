"""What a training step commits (numpy only): the loss as one number, and the new parameters and optimizer state,
from the step graph's outputs or through the fused optimizer, only when every one of them is finite. A step that
cannot stand behind its results raises NonFiniteError and commits nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from edgetrain.core.errors import ExecutionError, NonFiniteError
from edgetrain.graph.record import IORecord

from .fused import FusedOptimizer, finite, usable


def loss_value(value: np.ndarray, name: str) -> float:
    """The step's loss as a float: one element, or an ExecutionError (a program that computes other than it
    declares; load_artifact refuses every declaration that could, but a node's arithmetic is only known by running
    it)."""
    a = np.asarray(value)
    if a.size != 1 or a.dtype.kind not in "fiu":
        raise ExecutionError(
            f"the step's loss '{name}' came out as {a.dtype} of shape {list(a.shape)}, not one number: the "
            "artifact's program does not compute what it declares; convert the model again"
        )
    return float(a.reshape(()))


def non_finite(step: int, lr: float, loss: float, bad: list[str]) -> NonFiniteError:
    """The refusal of step number `step`: its loss is not finite, or the updated values of `bad` are not."""
    what = (
        f"the loss is {loss}"
        if not math.isfinite(loss)
        else f"the loss {loss:.4g} is finite, but the updated value of '{bad[0]}'"
        + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        + " is not finite, or so large that the next step would overflow"
    )
    message = (
        f"training step {step}: {what} (learning rate {lr:g}); nothing was committed: the parameters and optimizer "
        "state are those before the step. Lower the learning rate, clip the gradient norm (convert with "
        "clip_grad_norm= / --clip-grad-norm), or check the batch for non-finite values"
    )
    return NonFiniteError(message, loss=loss, step=step, values=bad)


Refuse = Callable[[float, list[str]], NonFiniteError]  # (loss, the tensors at fault: [] all) -> its refusal


def graph_updates(
    results: dict[str, np.ndarray], io: IORecord, loss: float, refuse: Refuse
) -> dict[str, np.ndarray]:
    """The new parameters and state the step graph computed, each finite (a parameter also far enough from
    overflowing for the next step); a non-finite loss poisons every update."""
    params = set(io.parameters)
    bad = [] if math.isfinite(loss) else list(io.updates)
    bad = bad or [
        n
        for n, new in io.updates.items()
        if not (usable(results[new]) if n in params else finite(results[new]))
    ]
    if bad:
        raise refuse(loss, bad)
    return {name: results[new] for name, new in io.updates.items()}


def fused_update(
    fused: FusedOptimizer,
    results: dict[str, Any],
    pairs: Iterable[tuple[str, str]],
    lr: float,
    loss: float,
    refuse: Refuse,
) -> None:
    """The fused optimizer's update from the step's gradients: those the program did not write into the
    optimizer's views (pairs: (parameter, gradient output)) copied there first."""
    if not math.isfinite(loss):
        raise refuse(loss, [])  # [] : every tensor the step updates
    grads = fused.gradients()
    # a gradient the program did not write into its view (a constant); the bound ones it always writes there
    for p, name in pairs:
        r = results.get(name)
        if r is not None and r is not grads[p]:
            if np.shape(r) != grads[p].shape:  # the program computed other than it declared
                raise ExecutionError(
                    f"the step's gradient '{name}' of '{p}' has shape {list(np.shape(r))}, but the parameter "
                    f"has {list(grads[p].shape)}: the artifact's program does not compute what it declares; "
                    "convert the model again"
                )
            np.copyto(grads[p], r)
    bad = fused.update(lr)
    if bad:
        raise refuse(loss, bad)
