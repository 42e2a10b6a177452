"""The trainability report (`edgetrain check`): ONNX model -> which ops have gradient rules, which parameters
would train, and whether a training step can be derived, with the reason when it cannot."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import EdgeTrainError


@dataclass
class OpCoverage:
    op_type: str
    count: int
    has_rule: bool
    on_gradient_path: int  # how many of its nodes lie between a trainable parameter and the output


@dataclass
class ParameterInfo:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    why_not: str = ""


@dataclass
class CheckReport:
    model: str
    opset: int
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    ops: list[OpCoverage]
    parameters: list[ParameterInfo]
    derivable: bool
    problem: str = ""
    backward_nodes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def missing_rules(self) -> list[str]:
        return [o.op_type for o in self.ops if o.on_gradient_path and not o.has_rule]

    def text(self) -> str:
        lines = [f"model      {self.model}  (opset {self.opset}, canonical form)"]
        lines += [f"input      {n}  {t}" for n, t in self.inputs] + [
            f"output     {n}  {t}" for n, t in self.outputs
        ]
        lines += ["", f"{'op':24s} {'nodes':>5s} {'on grad path':>12s}  gradient rule"]
        for o in self.ops:
            rule = "yes" if o.has_rule else ("MISSING" if o.on_gradient_path else "no (not needed)")
            lines.append(f"{o.op_type:24s} {o.count:5d} {o.on_gradient_path:12d}  {rule}")
        n_train = sum(p.trainable for p in self.parameters)
        size = sum(int(np.prod(p.shape)) for p in self.parameters if p.trainable)
        lines += [
            "",
            f"parameters: {len(self.parameters)} float initializers, {n_train} trainable by default "
            f"({size:,} values)",
        ]
        for p in self.parameters:
            mark = "trainable" if p.trainable else f"frozen ({p.why_not})"
            lines.append(f"  {p.name:40s} {str(list(p.shape)):18s} {mark}")
        lines.append("")
        if self.derivable:
            lines.append(
                f"OK: a training step derives for every default parameter ({self.backward_nodes} backward "
                "nodes, with a mean-of-output stand-in loss)"
            )
        else:
            lines.append(f"NOT TRAINABLE as is: {self.problem}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def check(model: Any, *, batch_size: int | None = 1) -> CheckReport:
    """Builds the report; never raises for a model that imports (a failure to derive is in the report)."""
    from .autodiff.context import GradContext, ShapedBuilder
    from .autodiff.driver import RULES, differentiate
    from .convert import parameter_candidates
    from .onnx_io import import_model, load_model

    proto = load_model(model)
    graph = import_model(proto, batch_size=batch_size)
    from .autodiff import rules  # noqa: F401  (registers the rule table)

    params, never = parameter_candidates(graph)
    active = set(params)
    on_path: Counter = Counter()
    for n in graph.nodes:
        if any(i in active for i in n.inputs if i):
            on_path[n.op_type] += 1
            active.update(o for o in n.outputs if o and np.dtype(graph.values[o].dtype).kind == "f")
    counts = Counter(n.op_type for n in graph.nodes)
    ops = [OpCoverage(op, c, op in RULES, on_path[op]) for op, c in sorted(counts.items())]
    infos = []
    for name, arr in graph.initializers.items():
        if arr.dtype.kind != "f":
            continue
        why = "" if name in params else ("statistic or shape input" if name in never else "constant")
        infos.append(ParameterInfo(name, tuple(arr.shape), name in params, why))
    report = CheckReport(
        model=str(model) if isinstance(model, (str, os.PathLike)) else (proto.graph.name or "model"),
        opset=graph.opset,
        inputs=[(n, str(graph.values[n])) for n in graph.inputs],
        outputs=[(n, str(graph.values[n])) for n in graph.outputs],
        ops=ops,
        parameters=infos,
        derivable=False,
    )
    if not params:
        report.problem = "no float initializers look like parameters (weights, biases, scales)"
        return report
    b = ShapedBuilder(graph)
    ctx = GradContext(b)
    out = graph.outputs[0]
    if np.dtype(graph.values[out].dtype).kind != "f":
        report.problem = (
            f"the first output '{out}' is {graph.values[out]}, not a float tensor: nothing to train on"
        )
        return report
    loss = ctx.op("ReduceMean", out, keepdims=0)
    n_before = len(b.graph.nodes)
    try:
        grads = differentiate(ctx, loss, params)
    except EdgeTrainError as e:
        report.problem = str(e)
        return report
    report.derivable = True
    report.backward_nodes = len(b.graph.nodes) - n_before
    unreached = [p for p, g in grads.items() if g is None]
    if unreached:
        report.notes.append(
            f"{len(unreached)} parameter(s) do not affect the output and would not train: "
            f"{', '.join(unreached[:5])}"
        )
    if batch_size is not None:
        report.notes.append(f"shapes checked at batch size {batch_size}")
    return report
