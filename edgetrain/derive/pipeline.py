"""The conversion pipeline: ONNX inference model -> TrainingArtifact (one training step as a pure graph:
(data, target, lr, parameters, optimizer state) -> (loss, model outputs, new parameters, new state)).

The stages are the same for every model; what changes a model on its way (int8, ties, the channel split, LoRA
adapters, re-batching, recomputation, chunks, the input pipeline, and any rewrite a caller gives) is a Rewrite whose
hooks run at the stages (edgetrain.derive.rewrite), and whose section of the artifact the device reads."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.interpreter import compile_step
from edgetrain.core.ir import Graph, TensorInfo, about
from edgetrain.graph.fuse import fuse_for_training
from edgetrain.graph.passes import fold_constants, make_static, prune
from edgetrain.graph.quantized import Lowered

from .adapters import IAdapter
from .artifact import UPDATED, FusedStep, TrainingArtifact
from .autodiff.context import ShapedBuilder, default_shape_rule
from .autodiff.driver import differentiate
from .budget import Option
from .budget import fit as fit_budget
from .budget import options as budget_options
from .channels import FROZEN_PART
from .losses import ILoss
from .optimizers import IOptimizer, TrainingContext
from .params import Roles, find_roles, select_trainable
from .request import ConvertRequest
from .rewrite import Conversion, Rewrite
from .rewrites import Int8, Ties


def _rename(graph: Graph, mapping: dict[str, str]) -> None:
    """Renames values everywhere in graph (in place), in one pass."""
    graph.nodes[:] = [
        n.replace(
            inputs=tuple(mapping.get(i, i) for i in n.inputs),
            outputs=tuple(mapping.get(o, o) for o in n.outputs),
        )
        if any(v in mapping for v in n.inputs + n.outputs)
        else n
        for n in graph.nodes
    ]
    graph.outputs[:] = [mapping.get(o, o) for o in graph.outputs]
    for old, new in mapping.items():
        graph.values[new] = graph.values.pop(old)


def convert(
    model: Any,
    *,
    loss: ILoss,
    optimizer: IOptimizer,
    trainable: str | Sequence[str] | None = None,
    batch_size: int | None = None,
    output: str | None = None,
    untie: bool | Sequence[str] = False,
    parameters: Any = None,
    preprocessing: Any = None,
    adapters: IAdapter | None = None,
    recompute: str = "none",
    memory_budget: int | str | None = None,
    progress: Any = None,
    channels: dict[str, int] | None = None,
    rewrites: Sequence[Rewrite] | None = None,
) -> TrainingArtifact:
    """ONNX inference model (path, bytes, onnx.ModelProto, or a static edgetrain Graph) -> TrainingArtifact.
    loss: any ILoss; optimizer: any IOptimizer; trainable: None for every parameter, or names / glob patterns;
    batch_size fixes a symbolic batch dimension; output names the model output the loss reads (default: the
    first); untie=True (or names) keeps apart the copies of one tensor that would train as one (see the notes);
    parameters is a parameter manifest (a dict or a JSON file) that says what trains, when the model does not carry
    its own (edgetrain.torch_export writes one into the model); preprocessing is the input pipeline (a
    loaders.InputPipeline or its JSON dict) that turns raw data into the model's input, stored in the artifact (default:
    the model's metadata_props "edgetrain.preprocessing", else none); adapters is an adapter module (et.LoRA(rank=8,
    alpha=16, targets=[...])) inserted into the graph: then only the adapters train, with what trainable adds;
    recompute ("none", "cheap", "segments") recomputes saved activations in the backward instead of keeping them
    (edgetrain.graph.recompute: the same step, bit for bit, with a smaller arena); memory_budget (bytes, or "24MB")
    chooses what trains (at most what trainable asks) and what is recomputed so that the step's planned peak fits
    (edgetrain.derive.budget), and progress (a callable taking a line of text) hears each option weighed; channels
    ({weight: count}) trains each named Conv/Gemm/MatMul weight on its first `count` input channels alone, the rest
    frozen (the sparse update of "On-Device Training Under 256KB Memory": edgetrain.derive.channels); the export
    writes the weights whole. rewrites: the caller's own edgetrain.derive.rewrite.Rewrite objects, applied after the
    built-in ones at each stage. The arguments are checked together first (edgetrain.derive.request)."""
    with about(os.fspath(model) if isinstance(model, (str, os.PathLike)) else None):
        request = ConvertRequest.make(
            loss=loss,
            optimizer=optimizer,
            trainable=trainable,
            batch_size=batch_size,
            output=output,
            untie=untie,
            parameters=parameters,
            preprocessing=preprocessing,
            adapters=adapters,
            recompute=recompute,
            memory_budget=memory_budget,
            progress=progress,
            channels=channels,
            rewrites=rewrites,
        )
        return convert_request(model, request)


def convert_request(model: Any, request: ConvertRequest) -> TrainingArtifact:
    """The artifact a ConvertRequest asks for (convert, with its arguments checked)."""
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    with about(source):  # every fault found on the way names the model file
        conv = _Converter(model, request)
        if request.memory_budget is None:
            art = conv.once()
        else:
            art = fit_budget(
                conv.build,
                request.memory_budget,
                trainable=conv.trainable,
                adapters=request.adapters is not None,
                progress=request.progress,
            )
        for r in conv.rewrites:
            section = r.finished(art)
            if section is not None:
                art.sections[section.KEY] = section
        return art


def memory_options(
    model: Any,
    *,
    loss: ILoss,
    optimizer: IOptimizer,
    memory_budget: int | str,
    trainable: str | Sequence[str] | None = None,
    batch_size: int | None = None,
    progress: Any = None,
) -> tuple[list[Option], Option | None]:
    """The ways to train `model` that `convert(..., memory_budget=...)` weighs, each with its planned peak and what
    it trains, and the one convert picks (None: nothing fits) (edgetrain.derive.budget.options): what `edgetrain
    check --memory-budget` prints."""
    request = ConvertRequest.make(
        loss=loss,
        optimizer=optimizer,
        trainable=trainable,
        batch_size=batch_size,
        memory_budget=memory_budget,
        progress=progress,
    )
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    with about(source):
        conv = _Converter(model, request)
        return budget_options(
            conv.build, request.memory_budget, trainable=conv.trainable, adapters=False, progress=progress
        )


class _Converter:
    """One model imported once, converted by build() with what trains, the recomputation level, chunks of the
    frozen part and the split channels as asked (convert's one way, or a memory budget's many): the stages up to
    the static model run once, or once per set of trained tensors where a rewrite makes the model depend on it (an
    int8 model: its frozen weights go back to int8), and the step is derived once per such set."""

    def __init__(self, model: Any, request: ConvertRequest):
        self.request = request
        # onnx's shape inference where onnx is installed: large values stay unallocated
        self.rule = default_shape_rule()
        self.imported, self.provenance = _import(model)
        for node in self.imported.nodes:  # an op edgetrain does not run is the first thing to say (int8, say)
            compile_step(node)
        t = request.trainable
        self.trainable = t if t is None or isinstance(t, str) else list(t)
        self.rewrites = request.applied()
        self._ceiling: Conversion | None = None
        self._last: dict[tuple, Any] = {}

    def once(self) -> TrainingArtifact:
        """The artifact the request asks for, without a memory budget."""
        c = self._model(None, None, self.rewrites)
        return _derive(c, _step(c, self.trainable, self.request), self.rewrites, provenance=self.provenance)

    def build(self, chosen, level: str, chunks: int = 1, channels: dict[str, int] | None = None):
        """The artifact that trains `chosen` (None: what the request asks) with recomputation `level` and its frozen
        prefix in `chunks` chunks of the batch, or None when its prefix cannot be cut so."""
        rewrites = self.request.applied(channels=channels, recompute=level, chunks=chunks)
        key = (tuple(chosen) if chosen is not None else (), tuple(sorted((channels or {}).items())))
        if key not in self._last:
            c = self._model(chosen, channels, rewrites)
            self._last.clear()
            self._last[key] = (c, _step(c, chosen, self.request))
        c, step = self._last[key]
        return _derive(c, step, rewrites, provenance=self.provenance)

    def _model(self, chosen, channels, rewrites) -> Conversion:
        """The static model for `chosen` (see the class's docstring)."""
        if self._ceiling is None:
            self._ceiling = static_model(
                self.imported, self.trainable, self.request.batch_size, self.rule, self.rewrites
            )
        ceiling = self._ceiling
        if channels:  # the split layers change the graph: made static again
            return static_model(self.imported, chosen, self.request.batch_size, self.rule, rewrites)
        if chosen is not None and any(r.rebuilds_per_choice(ceiling) for r in rewrites):
            return static_model(self.imported, chosen, self.request.batch_size, self.rule, rewrites)
        if chosen is not None:
            return _with_chosen(ceiling, [p for p in ceiling.chosen if p in set(chosen)])
        return ceiling


def _with_chosen(c: Conversion, chosen: list[str]) -> Conversion:
    """A copy of the ceiling's static model with fewer parameters chosen."""
    return replace(c, chosen=chosen)


def _step(c: Conversion, trainable, request: ConvertRequest):
    """The static model + the loss, gradient and update nodes -> the step as a pure function."""
    prediction, params = _trainable(c.inference, c.chosen, trainable, request.output)
    ext = _extend(c.inference, prediction, params, trainable, request.loss, request.optimizer, c.rule)
    graph, initial, updates = _pure_step(c.inference, ext, c.rule)
    return request, ext, graph, initial, updates


def _derive(c: Conversion, step, rewrites: list[Rewrite], *, provenance) -> TrainingArtifact | None:
    """The static model and its step -> the TrainingArtifact, with the rewrites' step hooks applied (recomputed
    activations, the frozen part in chunks; None when one cannot be), the fused step, and the rewrites' sections."""
    request, ext, graph, initial, updates = step
    outputs = list(c.inference.outputs)
    notes: list[str] = []
    for r in rewrites:
        graph = r.step(c, graph, notes)
        if graph is None:
            return None
    fused = _fused_program(
        graph, request.optimizer, ext.ctx, ext.params, ext.grads, graph.outputs[0], outputs
    )
    art = TrainingArtifact(
        graph=graph,
        inference=c.inference,
        base=c.base,
        parameters=ext.params,
        state=list(ext.ctx.state_inputs),
        initial=initial,
        updates=updates,
        data_inputs=list(c.inference.inputs),
        target=ext.target,
        lr=ext.lr,
        loss=graph.outputs[0],
        outputs=outputs,
        loss_config=request.loss.config(),
        optimizer_config=request.optimizer.config(),
        provenance=provenance,
        roles=c.roles,
        notes=c.notes + ext.notes + notes,
        fused=fused,
    )
    for r in rewrites:
        section = r.section(c, art)
        if section is not None:
            art.sections[section.KEY] = section
    return art


def _import(model: Any) -> tuple[Graph, dict[str, Any]]:
    """The model as an IR graph, and its provenance (the ONNX model's digest and file name)."""
    if isinstance(model, Graph):  # an IR graph (numpy only): made static later
        return model, {}
    from edgetrain.onnx_io.reader import from_onnx, load_model  # needs onnx: only for an ONNX model

    proto = load_model(model)
    provenance = {"source_sha256": hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()}
    if isinstance(model, (str, os.PathLike)):
        provenance["source"] = os.path.basename(os.fspath(model))
    return from_onnx(proto), provenance


def _read_roles(c: Conversion, rewrites: list[Rewrite]) -> None:
    """Stages 1 and 2: the graph as imported, with what exporters did undone, and every initializer's role."""
    for r in rewrites:
        r.imported(c)
    c.roles = find_roles(c.graph)
    for r in rewrites:
        r.roles_found(c)


def static_model(
    imported: Graph, trainable, batch_size: int | None, rule, rewrites: list[Rewrite]
) -> Conversion:
    """Stages 1 to 5 and the static model: roles decided on the graph as imported, before anything is folded
    (folding then never goes through a parameter: an embedding table gathered at constant positions stays a table
    that trains); what trains; the base graph; the inference graph made static at the training batch."""
    c = Conversion(imported, trainable, batch_size, rule)
    _read_roles(c, rewrites)
    for r in rewrites:
        r.choose(c)
    if c.chosen is None:
        c.chosen = select_trainable(c.roles, c.trainable)
    for r in rewrites:
        r.chosen(c)
    c.base = fold_constants(
        c.graph, fold_shapes=False, keep=set(c.roles.parameters) | set(c.chosen), rule=rule
    )
    c.roles = c.roles.finalize(c.base)
    c.notes.extend(_decisions(c.roles))
    c.static_source = c.base
    for r in rewrites:
        r.static(c)
    c.inference = make_static(c.static_source, batch_size=batch_size, keep=c.chosen, rule=rule)
    c.inference.verify(static=True)
    if rule is not None:  # onnx is installed: its schemas say which inputs share a type
        from edgetrain.onnx_io.shapes import check_types  # onnx is installed: the rule came from it

        check_types(c.inference)
    return c


def _decisions(roles: Roles) -> list[str]:
    """What was decided beyond the weight roles, and why: the learned tensors that train, and the float tensors
    that meet an activation but do not (masks, position tables, preprocessing, the exporter's fills)."""
    learned = [
        n for n, r in roles.entries.items() if r.kind == "parameter" and r.role.startswith("learned constant")
    ]
    kept = [
        (n, r.role)
        for n, r in roles.entries.items()
        if r.kind == "constant"
        and r.role not in ("constant", "a literal number")
        and not r.role.startswith(FROZEN_PART)  # a split layer's: its own note says so
        and not r.role.endswith("manifest)")
    ]
    notes = []
    if learned:
        shown = ", ".join(f"'{n}'" for n in learned[:6]) + (" ..." if len(learned) > 6 else "")
        notes.append(
            f"{len(learned)} learned tensor(s) outside a weight role train, as their author trains them: {shown} "
            "(`edgetrain check` says why, for every tensor)"
        )
    if kept:
        shown = "; ".join(f"'{n}': {why}" for n, why in kept[:4]) + (" ..." if len(kept) > 4 else "")
        notes.append(f"{len(kept)} tensor(s) that meet the data do not train: {shown}")
    return notes


def _trainable(inference: Graph, chosen: list[str], trainable, output: str | None) -> tuple[str, list[str]]:
    """(the output the loss reads, the parameters that train); a parameter asked for by name that nothing reads
    any more is an error."""
    prediction = output or inference.outputs[0]
    if prediction not in inference.outputs:
        raise UnsupportedError(
            f"output '{prediction}' is not an output of the model; its outputs are: "
            f"{', '.join(inference.outputs)}"
        )
    params = [p for p in chosen if p in inference.initializers]
    unused = [p for p in chosen if p not in params]
    if unused and trainable is not None:
        raise UnsupportedError(
            f"trainable parameter(s) {unused[:5]} do not affect the model's outputs (nothing reads them once the "
            "graph is made static)"
        )
    return prediction, params


@dataclass
class _Extended:
    """The inference graph extended in place: + the loss (ILoss), + gradient nodes, + update nodes (IOptimizer)."""

    builder: ShapedBuilder
    ctx: TrainingContext
    lr: str
    target: str
    loss: str
    params: list[str]  # those the loss depends on
    grads: dict[str, str | None]
    new_values: list[str]  # each parameter's next value, in params' order
    notes: list[str]  # what the loss decided (class_axis="auto")


def _extend(inference: Graph, prediction: str, params, trainable, loss: ILoss, optimizer: IOptimizer, rule):
    g = inference.copy()
    g.inputs = list(inference.inputs)
    b = ShapedBuilder(g, rule=rule)
    lr = b.fresh("lr")
    target = b.fresh("target")
    ctx = TrainingContext(b, lr=lr)
    notes = loss.prepare(ctx, prediction)
    for name, info in (
        (target, loss.target_info(g.info(prediction))),
        (lr, TensorInfo(np.dtype("float32"), ())),
    ):
        b.graph.inputs.append(name)
        b.graph.values[name] = info
    loss_value = loss.build(ctx, prediction, target)
    if ctx.shape(loss_value) != ():
        raise UnsupportedError(
            f"the loss must be a scalar; {type(loss).__name__} built a value of shape "
            f"{list(ctx.shape(loss_value))}"
        )
    fuse_for_training(b, params)  # the transformer fast paths, where a gradient will flow (graph/fuse.py)
    grads = differentiate(ctx, loss_value, params)
    unreached = [p for p in params if grads[p] is None]
    if unreached and trainable is not None:
        raise UnsupportedError(f"the loss does not depend on trainable parameter(s) {unreached[:5]}")
    params = [p for p in params if grads[p] is not None]
    new_values = optimizer.make_multiple(ctx, params, [grads[p] for p in params])
    return _Extended(b, ctx, lr, target, loss_value, params, grads, new_values, notes)


def _pure_step(inference: Graph, ext: _Extended, rule) -> tuple[Graph, dict[str, np.ndarray], dict[str, str]]:
    """The step as a pure function: parameters and optimizer state become inputs; its outputs are the loss, the
    model's outputs and the next value of every parameter and state tensor (`name.updated`). Returns (the step,
    the initial values of its parameters and state, {parameter or state: the output holding its next value})."""
    b, ctx, params = ext.builder, ext.ctx, ext.params
    graph = b.finish()
    initial = {p: inference.initializers[p] for p in params}
    for p in params:
        del graph.initializers[p]
    graph.inputs = list(inference.inputs) + [ext.target, ext.lr] + params + list(ctx.state_inputs)
    initial.update(ctx.state_inputs)
    updates = dict(zip(params, ext.new_values)) | dict(ctx.state_updates)
    loss_name = b.fresh("loss")
    renames = {ext.loss: loss_name}
    for name, value in list(updates.items()):
        assert value not in renames, f"'{value}' is the next value of two state tensors"
        updates[name] = renames[value] = b.fresh(name + UPDATED)
    _rename(graph, renames)
    graph.outputs = [loss_name] + list(inference.outputs) + list(updates.values())
    # constant-only pieces the loss or optimizer built, dead branches
    graph = prune(fold_constants(graph, rule=rule))
    graph.verify(static=True)
    return graph, initial, updates


def _fused_program(
    graph: Graph, optimizer: IOptimizer, ctx, params, grads, loss: str, outputs
) -> FusedStep | None:
    """For an optimizer the runtime runs as a fused kernel over flat buffers (SGD, Adam, AdamW): the step without
    its update nodes, whose outputs are the loss, the model's outputs and each parameter's gradient; with the
    gradient names and the role of each state tensor. The step graph itself stays whole (training_onnx, other
    runtimes); the device runs this and updates every parameter in a few numpy calls."""
    if not optimizer.fusable():
        return None
    gradients = {p: grads[p] for p in params}
    wanted = list(dict.fromkeys([loss, *outputs, *gradients.values()]))
    reduced = prune(graph.copy(outputs=wanted))
    read = {i for n in reduced.nodes for i in n.inputs if i} | set(reduced.outputs)
    reduced.inputs = [i for i in reduced.inputs if i in read or i in params]
    reduced.verify(static=True)
    roles = {name: (role[0], role[1]) for name, role in ctx.state_roles.items()}
    return FusedStep(graph=reduced, gradients=gradients, state_roles=roles)


def read_roles(
    imported: Graph, *, untie: bool | Sequence[str] = False, parameters: Any = None
) -> tuple[Graph, Roles, list[str], Lowered | None]:
    """The graph as imported, with what exporters did to tensors undone (merged tensors of different kinds,
    batch-fixed recurrent states, parameters folded into constants, one tensor written twice), and every
    initializer's role on it; the notes that say what was undone. `convert` and `check` read a model the same
    way (the Int8 and Ties rewrites' first stages). parameters: a parameter manifest (a dict or a JSON file; see
    edgetrain.derive.manifest), else the model's own, if it has one: then it alone decides what trains. An int8
    model is lowered first (edgetrain.graph.quantized: float master weights read through fake quantization), and the
    lowering comes back as the fourth value (None for a float model)."""
    c = Conversion(imported, None, None, None)
    _read_roles(c, [Int8(), Ties(untie=untie, parameters=parameters)])
    return c.graph, c.roles, c.notes, c.found.get(Int8.KEY)
