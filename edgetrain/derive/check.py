"""The trainability report (`edgetrain check`, needs onnx): ONNX model -> which ops have gradient rules, which
parameters would train, how the labels must look, and whether a training step can be derived, with the reason when
it cannot. The list of the ops edgetrain supports (`edgetrain check --ops`) is edgetrain.derive.supported."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, UnsupportedError
from edgetrain.core.ir import Graph, about
from edgetrain.core.ops import record
from edgetrain.graph.passes import fold_constants, make_static
from edgetrain.onnx_io.reader import from_onnx, load_model, source_of
from edgetrain.onnx_io.shapes import check_types, node_shapes

from .autodiff import GradContext, ShapedBuilder, differentiate
from .autodiff.registry import RULES
from .losses import CrossEntropyLoss, dims
from .params import FIXED, Role, Roles
from .pipeline import read_roles


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
    trainable: bool  # trains by default (a parameter by role)
    kind: str  # "parameter", "constant" (trains only when named) or "fixed" (never trains)
    role: str  # e.g. "weight of Conv", "running mean of BatchNormalization", "constant"
    nodes: list[str] = field(default_factory=list)  # the nodes that read it
    aliases: list[str] = field(default_factory=list)  # other names the exporter gave it (Identity copies)
    author: str = ""  # its author's name (a parameter manifest's)


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
    labels: str = ""  # how the labels must look for the first output (see _labels)
    frozen: list[str] = field(default_factory=list)  # see frozen_tensors

    @property
    def missing_rules(self) -> list[str]:
        return [o.op_type for o in self.ops if o.on_gradient_path and not o.has_rule]

    def text(self) -> str:
        lines = [f"model      {self.model}  (opset {self.opset}, canonical form)"]
        lines += [f"input      {n}  {t}" for n, t in self.inputs] + [
            f"output     {n}  {t}" for n, t in self.outputs
        ]
        lines += [f"labels     {self.labels}"] if self.labels else []
        lines += ["", f"{'op':24s} {'nodes':>5s} {'on grad path':>12s}  gradient rule"]
        for o in self.ops:
            rule = "yes" if o.has_rule else ("MISSING" if o.on_gradient_path else "no (not needed)")
            lines.append(f"{o.op_type:24s} {o.count:5d} {o.on_gradient_path:12d}  {rule}")
        by_kind = {k: [p for p in self.parameters if p.kind == k] for k in ("parameter", "constant", "fixed")}
        lines += ["", self._count_line(by_kind)]
        titles = {
            "parameter": "parameters (train by default)",
            "constant": "constants (train only when named in --trainable / trainable=)",
            "fixed": "statistics and shape values (never trained)",
        }
        for kind, title in titles.items():
            shown = [p for p in by_kind[kind] if kind != "constant" or int(np.prod(p.shape)) > 1]
            if shown:
                w = min(max(len(p.name) for p in shown), 60)
                lines += ["", f"{title}:", f"  {'name':{w}s}  {'shape':14s} {'role':38s} read by"]
                lines += [_param_line(p, w) for p in shown]
            if len(shown) < len(by_kind[kind]):
                lines.append(
                    f"  (and {len(by_kind[kind]) - len(shown)} one-value constants: eps, exponents, ...)"
                )
        if by_kind["parameter"]:
            example = next((p.nodes[0] for p in by_kind["parameter"] if p.nodes and "/" in p.nodes[0]), None)
            hint = "select some with --trainable NAME-OR-PATTERN; a pattern also matches the nodes that read them"
            lines += ["", hint + (f" (e.g. '{example.rsplit('/', 1)[0]}/*')" if example else "")]
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

    def _count_line(self, by_kind: dict[str, list[ParameterInfo]]) -> str:
        """How many tensors train and how many are frozen, counted as `convert` counts them (frozen_tensors)."""
        size = sum(int(np.prod(p.shape)) for p in by_kind["parameter"])
        fixed, constants = (sum(int(np.prod(p.shape)) > 1 for p in by_kind[k]) for k in ("fixed", "constant"))
        computed = len(self.frozen) - fixed - constants
        return (
            f"parameters: {len(by_kind['parameter'])} trainable by default ({size:,} values), "
            f"{len(self.frozen)} frozen: {fixed} statistics and shape values never train, {constants} float "
            "constants train only when named"
            + (f", {computed} computed from constants" if computed > 0 else "")
        )


def frozen_tensors(graph: Graph, trained: Any) -> list[str]:
    """The float tensors of more than one value in a model (its graph folded, as convert reads it) that do not
    train: frozen parameters, statistics, float constants. `check` and `convert` count these as frozen."""
    trained = set(trained)
    return [
        n for n, a in graph.initializers.items() if n not in trained and a.dtype.kind == "f" and a.size > 1
    ] + int8_weights(graph)


def int8_weights(graph: Graph) -> list[str]:
    """The integer weights of an int8 model that stay integer (read through a DequantizeLinear: frozen)."""
    read = {n.inputs[0] for n in graph.nodes if n.op_type == "DequantizeLinear" and n.inputs}
    return [n for n, a in graph.initializers.items() if n in read and a.dtype.kind in "iu" and a.size > 1]


def _param_line(p: ParameterInfo, width: int) -> str:
    """name, shape, the decision's reason, and what a pattern can target: its author's name, else the module paths
    (or names) of the nodes that read it."""
    nodes = ", ".join(p.nodes[:2]) + (f" (+{len(p.nodes) - 2} more)" if len(p.nodes) > 2 else "")
    target = f"'{p.author}', read by {nodes}" if p.author else nodes
    return f"  {p.name:{width}s}  {str(list(p.shape)).replace(' ', ''):14s} {p.role:38s} {target}"


def check(model: Any, *, batch_size: int | None = 1) -> CheckReport:
    """Builds the report; never raises for a model that imports (a failure to derive is in the report). A model
    that does not import is an EdgeTrainError naming the file and the fault."""
    with about(source_of(model)):
        return _check(model, batch_size)


def _check(model: Any, batch_size: int | None) -> CheckReport:
    proto = load_model(model)
    imported, roles, untied, lowered = read_roles(from_onnx(proto))
    base = fold_constants(imported, fold_shapes=False, keep=roles.parameters, rule=node_shapes)
    roles = _with_folded_statistics(roles.finalize(base), base)
    graph = make_static(base, batch_size=batch_size, keep=roles.parameters, rule=node_shapes)
    check_types(graph)
    params = [p for p in roles.parameters if p in graph.initializers]
    infos = _parameters(roles)
    report = CheckReport(
        model=str(model) if isinstance(model, (str, os.PathLike)) else (proto.graph.name or "model"),
        opset=graph.opset,
        inputs=[(n, str(graph.values[n])) for n in graph.inputs],
        outputs=[(n, str(graph.values[n])) for n in graph.outputs],
        ops=_coverage(graph, params),
        parameters=infos,
        derivable=False,
        labels=_labels(graph),
        frozen=frozen_tensors(base, roles.parameters),
    )
    report.notes.extend(untied)
    tied = [p for p in infos if p.trainable and p.aliases]
    if tied:
        report.notes.append(
            f"{len(tied)} parameter(s) are each read under several names (e.g. '{tied[0].name}' also as "
            f"'{tied[0].aliases[0]}'): the exporter merged initializers whose values were identical (freshly "
            "initialized weights often are), so each trains as one tensor; export a model whose weights differ "
            "to train them apart"
        )
    _derive(report, graph, params, batch_size)
    return report


def _with_folded_statistics(roles: Roles, graph: Graph) -> Roles:
    """The roles, with the statistics a model computes from constants, which folding made initializers (the onnx
    zoo's light models fill BatchNorm's running mean and variance with ConstantOfShape): they never train, as
    statistics stored as initializers do, and the report counts both."""
    entries = dict(roles.entries)
    for n in graph.nodes:
        for pos, what in record(n.op_type).statistics.items():
            name = n.inputs[pos] if pos < len(n.inputs) else ""
            arr = graph.initializers.get(name)
            if arr is not None and name not in entries:
                shape = tuple(int(d) for d in arr.shape)
                scope = graph.scopes.get(n.name, "")
                entries[name] = Role(
                    name, FIXED, f"{what} of {n.op_type}", [n.name], shape, arr.dtype.name, scopes=[scope]
                )
    return Roles(entries)


def _labels(graph: Graph) -> str:
    """How the labels must look for the first output with the default loss (cross-entropy over axis 1), or with
    the options its layout needs: the class axis a language model writes last, a regression's loss."""
    out = graph.outputs[0]
    info = graph.values[out]
    shape = tuple(info.shape or ())
    if np.dtype(info.dtype).kind != "f" or not shape:
        return ""  # nothing to train on per sample: the report's problem says so
    if len(shape) < 2 or shape[1:] == (1,):
        return (
            f"one value per sample, shape {dims(shape)} ({np.dtype(info.dtype).name}): convert with --loss "
            "mse (a regression) or --loss bce (a yes/no logit); cross-entropy needs 2 classes or more"
        )
    auto = CrossEntropyLoss(class_axis="auto")
    try:
        auto.prepare(GradContext(ShapedBuilder(graph, rule=node_shapes)), out)
    except UnsupportedError:  # no axis to read from the graph: PyTorch's axis 1, the default
        return CrossEntropyLoss().describe_target(info)
    if auto.axis == 1:
        return CrossEntropyLoss().describe_target(info)
    axis = auto.axis - len(shape)
    text = CrossEntropyLoss(class_axis=axis).describe_target(info) + f": convert with --class-axis {axis}"
    if axis == -1 and len(shape) == 3:
        text += ", or --loss next-token when the labels are the input ids themselves"
    return text


def _coverage(graph: Graph, params: list[str]) -> list[OpCoverage]:
    """Each op of the graph: its nodes, whether it has a gradient rule, how many of its nodes lie between a
    parameter and the output (through float values)."""
    active = set(params)
    on_path: Counter = Counter()
    for n in graph.nodes:
        if any(i in active for i in n.inputs if i):
            on_path[n.op_type] += 1
            active.update(o for o in n.outputs if o and np.dtype(graph.values[o].dtype).kind == "f")
    counts = Counter(n.op_type for n in graph.nodes)
    return [OpCoverage(op, c, op in RULES, on_path[op]) for op, c in sorted(counts.items())]


def _parameters(roles: Roles) -> list[ParameterInfo]:
    """Every float tensor with its role, and every tensor that could train (named in --trainable)."""
    return [
        ParameterInfo(
            r.name,
            r.shape or (),
            r.kind == "parameter",
            r.kind,
            r.role,
            [
                scope or node for node, scope in zip(r.nodes, r.scopes)
            ],  # module paths where the names lack them
            r.aliases,
            r.author,
        )
        for r in roles.entries.values()
        if r.kind != FIXED or r.dtype.startswith("float")
    ]


def _derive(report: CheckReport, graph: Graph, params: list[str], batch_size: int | None) -> None:
    """Tries to differentiate a scalar of the first output with respect to the parameters; says in the report
    whether it could, and why not."""
    if not params:
        report.problem = (
            "no initializer is in a parameter role (weights, biases, scales, embedding tables); "
            "name constants to train with --trainable"
        )
        return
    b = ShapedBuilder(graph, rule=node_shapes)
    ctx = GradContext(b)
    out = graph.outputs[0]
    if np.dtype(graph.values[out].dtype).kind != "f":
        report.problem = (
            f"the first output '{out}' is {graph.values[out]}, not a float tensor: nothing to train on"
        )
        return
    loss = ctx.op("ReduceMean", out, keepdims=0)
    n_before = len(b.graph.nodes)
    try:
        grads = differentiate(ctx, loss, params)
    except EdgeTrainError as e:
        report.problem = str(e)
        return
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
