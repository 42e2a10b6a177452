"""Reverse-mode autodiff over the IR: (graph, loss value, parameters) -> gradient values, appended to the graph.

The driver alone handles what every rule would otherwise repeat: which nodes need a backward at all (only those
between a trainable parameter and the loss: a frozen prefix gets none), fan-out accumulation (Sum), reduction
of broadcast gradients back to the input's shape, and integer or boolean paths (no gradient).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgetrain.core.alternatives import SEE_RULES, rule_alternative
from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node
from edgetrain.core.ops import record

from .context import GradContext


def _is_float(ctx: GradContext, name: str) -> bool:
    info = ctx.graph.values.get(name)
    return info is not None and np.dtype(info.dtype).kind == "f"


def differentiate(ctx: GradContext, loss: str, wrt: Sequence[str]) -> dict[str, str | None]:
    """Appends the backward of ctx's graph to it and returns {parameter: its gradient value}, or None for a
    parameter the loss does not depend on."""
    nodes = list(ctx.graph.nodes)
    if loss not in _active(ctx, nodes, wrt):
        raise UnsupportedError(
            f"the loss '{loss}' does not depend on any trainable parameter; "
            "check the trainable= names or patterns"
        )
    seed = ctx.scalar_like(1.0, loss, hint="loss_grad_seed")
    if ctx.shape(loss) != ():
        seed = ctx.op("Expand", seed, ctx.ints(ctx.shape(loss), hint="shape"))
    return backprop(ctx, nodes, {loss: seed}, wrt)


def _active(ctx: GradContext, nodes: Sequence[Node], wrt: Sequence[str]) -> set[str]:
    """The values that depend on a value in wrt through float paths."""
    active = set(wrt)
    for n in nodes:
        if any(i in active for i in n.inputs if i):
            active.update(o for o in n.outputs if o and _is_float(ctx, o))
    return active


def backprop(
    ctx: GradContext, nodes: Sequence[Node], seeds: dict[str, str], wrt: Sequence[str]
) -> dict[str, str | None]:
    """The vector-Jacobian product through nodes (in topological order, already in ctx's graph): given the
    gradients (seeds) of some of their values, appends the backward and returns {w: gradient of w} for w in wrt
    (None where no seed depends on w)."""
    active = _active(ctx, nodes, wrt)
    grads: dict[str, list[str]] = {v: [s] for v, s in seeds.items() if s}

    def total(value: str) -> str | None:
        parts = grads.get(value)
        if not parts:
            return None
        if len(parts) > 1:  # fan-out: the gradients of every reader add up
            parts[:] = [ctx.op("Sum", *parts, name=f"{value}_grad_sum")]
        return parts[0]

    for node in reversed(nodes):
        dys = [total(o) if o else None for o in node.outputs]
        if all(d is None for d in dys):
            continue
        needs = [bool(i) and i in active for i in node.inputs]
        if not any(needs):
            continue
        rule = record(node.op_type).rule
        if rule is None:
            raise UnsupportedError(_no_rule_message(ctx, node, nodes, wrt))
        dxs = rule(ctx, node, dys, needs)
        assert len(dxs) <= len(node.inputs), f"{node.label}: rule returned {len(dxs)} gradients"
        for i, dx, need in zip(node.inputs, dxs, needs):
            if not need or dx is None:
                continue
            dx = ctx.sum_to(dx, ctx.shape(i))
            assert ctx.dtype(dx) == ctx.dtype(i), f"{node.label}: gradient of '{i}' is {ctx.dtype(dx)}"
            grads.setdefault(i, []).append(dx)
    return {w: total(w) for w in wrt}


def _no_rule_message(ctx: GradContext, node: Node, nodes: Sequence[Node], wrt: Sequence[str]) -> str:
    producer = {o: n for n in nodes for o in n.outputs if o}
    upstream: set[str] = set()
    todo = [i for i in node.inputs if i]
    while todo:
        v = todo.pop()
        if v in upstream:
            continue
        upstream.add(v)
        if v in producer:
            todo.extend(i for i in producer[v].inputs if i)
    before = [w for w in wrt if w in upstream]
    after = [w for w in wrt if w not in upstream]
    hint = (
        f"train only the parameters after it, e.g. trainable={after[:4]}{' + ...' if len(after) > 4 else ''}"
        if after
        else "no trainable parameter comes after it, so the model cannot be trained past this op"
    )
    advice = rule_alternative(node.op_type)
    return (
        f"{node.label} has no gradient rule, and {len(before)} trainable parameter(s) lie before it "
        f"(e.g. '{before[0]}'). To avoid it, freeze the parameters before it: {hint}. "
        + (f"{'Or, to train them too' if after else 'To train them'}, {advice}. " if advice else "")
        + f"{SEE_RULES[0].upper()}{SEE_RULES[1:]}."
    )
