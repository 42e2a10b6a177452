"""The conversion pipeline: ONNX inference model -> TrainingArtifact (one training step as a pure graph:
(data, target, lr, parameters, optimizer state) -> (loss, model outputs, new parameters, new state))."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.interpreter import compile_step
from edgetrain.core.ir import Graph, TensorInfo, about
from edgetrain.graph.adapters import LoraModule
from edgetrain.graph.channels import ChannelSplit
from edgetrain.graph.chunked import chunk_prefix
from edgetrain.graph.fuse import fuse_for_training
from edgetrain.graph.passes import fold_constants, make_static, prune
from edgetrain.graph.quantized import Lowered, refreeze
from edgetrain.graph.quantized import lower as lower_quantized
from edgetrain.graph.rebatch import (
    BatchPlan,
    apply_batch_plan,
    batch_free_states,
    find_batch_plan,
    fixed_batch,
    verify_batch_plan,
)
from edgetrain.graph.recompute import recompute as recompute_activations

from .adapters import IAdapter
from .artifact import UPDATED, TrainingArtifact
from .autodiff.context import ShapedBuilder, default_shape_rule
from .autodiff.driver import differentiate
from .budget import Option, parse_bytes
from .budget import fit as fit_budget
from .budget import options as budget_options
from .channels import FROZEN_PART
from .channels import split as split_layers
from .losses import ILoss
from .manifest import read_manifest
from .optimizers import IOptimizer, TrainingContext
from .params import (
    Roles,
    apply_manifest,
    find_roles,
    refold_copies,
    select_trainable,
    tie_copies,
    untie_merged,
)
from .preprocessing import declared_pipeline


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
    writes the weights whole."""
    if not isinstance(loss, ILoss):
        raise UnsupportedError(
            f"loss must be an ILoss (e.g. et.CrossEntropyLoss()), not {type(loss).__name__}"
        )
    if adapters is not None and not isinstance(adapters, IAdapter):
        raise UnsupportedError(
            f"adapters must be an adapter module (e.g. et.LoRA(rank=8)), not {type(adapters).__name__}"
        )
    if not isinstance(optimizer, IOptimizer):
        raise UnsupportedError(
            f"optimizer must be an IOptimizer (e.g. et.SGD(lr=0.01)), not {type(optimizer).__name__}"
        )
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    with about(source):  # every fault found on the way names the model file
        budget = None if memory_budget is None else parse_bytes(memory_budget)
        if channels is not None and not isinstance(channels, Mapping):
            raise UnsupportedError(
                f"channels must map weight names to counts, e.g. {{'fc.weight': 32}}, not {type(channels).__name__}"
            )
        if channels and budget is not None:
            raise UnsupportedError(
                "give channels or memory_budget, not both: the budget chooses which layers train on part of their "
                "input channels itself (`edgetrain check --memory-budget` lists its options)"
            )
        art = _convert(
            model,
            (loss, optimizer, output),
            trainable,
            batch_size,
            (untie, parameters, adapters, dict(channels or {})),
            (recompute, budget, progress),
        )
        art.preprocessing, notes = declared_pipeline(art.base, preprocessing)
        art.notes.extend(notes)
        return art


def _convert(model, objective, trainable, batch_size, reading, memory) -> TrainingArtifact:
    """The stages: import -> parameter roles -> static shapes (re-batched) -> loss -> autodiff -> optimizer -> the
    step as a pure function -> recomputation -> the fused step. The memory plan and the file come with
    TrainingArtifact.save. With a memory budget, the stages after the import run once per option weighed."""
    # onnx's shape inference where onnx is installed: large values stay unallocated
    rule = default_shape_rule()
    imported, provenance = _import(model)
    for (
        node
    ) in imported.nodes:  # an op edgetrain does not run is the first thing to say (a quantized model, say)
        compile_step(node)
    recompute, budget, progress = memory
    if budget is None:
        m = _static_model(imported, trainable, batch_size, rule, reading)
        return _derive(m, _step(m, trainable, objective, rule), (recompute, 1, rule), provenance=provenance)
    build = _builder(imported, objective, trainable, batch_size, reading, rule, provenance)
    weigh = fit_budget if recompute != "options" else budget_options
    return weigh(build, budget, trainable=trainable, adapters=reading[2] is not None, progress=progress)


def _builder(imported, objective, trainable, batch_size, reading, rule, provenance):
    """build(chosen, level, chunks) -> the artifact that trains `chosen` with recomputation `level` and its frozen
    prefix in `chunks` chunks of the batch (None when it has no prefix to chunk so), for the options of
    a memory budget: they differ in what trains and what is recomputed, so a float model is made static once (an
    int8 one once per option: its frozen weights go back to int8), and each option's step is derived once for
    its levels."""
    ceiling = _static_model(imported, trainable, batch_size, rule, reading)
    last: dict[tuple[str, ...], Any] = {}

    def build(
        chosen, level: str, chunks: int = 1, channels: dict[str, int] | None = None
    ) -> TrainingArtifact | None:
        key = (tuple(chosen) if chosen is not None else (), tuple(sorted((channels or {}).items())))
        if key not in last:
            m = ceiling
            if channels:  # the split layers change the graph: made static again
                m = _static_model(imported, chosen, batch_size, rule, (*reading[:3], channels))
            elif chosen is not None and ceiling.lowered is not None:
                m = _static_model(imported, chosen, batch_size, rule, reading)
            elif chosen is not None:
                m = replace(ceiling, chosen=[p for p in ceiling.chosen if p in set(chosen)])
            last.clear()
            last[key] = (m, _step(m, chosen, objective, rule))
        m, step = last[key]
        return _derive(m, step, (level, chunks, rule), provenance=provenance)

    return build


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
    budget = parse_bytes(memory_budget)
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    with about(source):
        return _convert(
            model,
            (loss, optimizer, None),
            trainable,
            batch_size,
            (False, None, None, {}),
            ("options", budget, progress),
        )


def _step(m: _StaticModel, trainable, objective, rule):
    """The static model + the loss, gradient and update nodes -> the step as a pure function."""
    loss, optimizer, output = objective
    prediction, params = _trainable(m.inference, m.chosen, trainable, output)
    ext = _extend(m.inference, prediction, params, trainable, loss, optimizer, rule)
    graph, initial, updates = _pure_step(m.inference, ext, rule)
    return objective, ext, graph, initial, updates


def _derive(m: _StaticModel, step, memory: tuple, *, provenance) -> TrainingArtifact | None:
    """The static model and its step -> the TrainingArtifact, with saved activations recomputed at `level`, its
    frozen prefix run in `chunks` chunks of the batch (None when that cannot be), and the fused step."""
    level, chunks, rule = memory
    (loss, optimizer, _), ext, graph, initial, updates = step
    outputs = list(m.inference.outputs)
    graph, recomputed = recompute_activations(
        graph, forward_outputs=[graph.outputs[0], *outputs], level=level
    )
    notes = [] if level == "none" else [f"recompute {level}: {recomputed.describe()}"]
    if chunks > 1:
        graph, why = chunk_prefix(graph, list(m.inference.inputs), chunks, rule=rule)
        if why:
            return None
        notes.append(f"the frozen part runs in {chunks} chunks of the batch, one after the other")
    fused = _fused_program(graph, optimizer, ext.ctx, ext.params, ext.grads, graph.outputs[0], outputs)
    return TrainingArtifact(
        graph=graph,
        inference=m.inference,
        base=m.base,
        parameters=ext.params,
        state=list(ext.ctx.state_inputs),
        initial=initial,
        updates=updates,
        data_inputs=list(m.inference.inputs),
        target=ext.target,
        lr=ext.lr,
        loss=graph.outputs[0],
        outputs=outputs,
        loss_config=loss.config(),
        optimizer_config=optimizer.config(),
        provenance=provenance,
        roles=m.roles,
        notes=m.notes + ext.notes + notes,
        batch_plan=m.batch_plan,
        fused=fused,
        quantized=None if m.lowered is None else m.lowered.header(ext.params),  # (header, its constants)
        quantized_model=None if m.lowered is None else m.lowered.original,
        adapters=m.adapters,
        channels=m.channels,
    )


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


@dataclass
class _StaticModel:
    inference: Graph  # static (at the training batch), folded, parameters still initializers
    base: Graph  # folded, symbolic batch kept: for run() and export
    roles: Roles
    chosen: list[str]  # the parameters asked to train
    batch_plan: BatchPlan | None
    notes: list[str]
    lowered: Lowered | None = None  # an int8 model's lowering (the model as imported, for its int8 export)
    adapters: dict | None = None  # {"config": the adapter module's, "modules": [LoraModule]}
    channels: list[ChannelSplit] | None = None  # layers that train on a subset of their input channels


def _static_model(imported: Graph, trainable, batch_size: int | None, rule, reading) -> _StaticModel:
    """Roles decided on the graph as imported, before anything is folded (folding then never goes through a
    parameter: an embedding table gathered at constant positions stays a table that trains); the base graph;
    the inference graph made static at the training batch (a fixed-batch export re-batched, and checked)."""
    untie, parameters, adapters, channels = reading
    imported, roles, untied, lowered = read_roles(imported, untie=untie, parameters=parameters)
    modules: list[LoraModule] = []
    imported, roles, splits, trainable, split = _split_channels(
        imported, roles, channels, trainable, (lowered, adapters)
    )
    untied = untied + split
    if adapters is None:
        chosen = select_trainable(roles, trainable)
    else:  # the adapters train, and what trainable adds
        imported, roles, modules, inserted = adapters.insert(imported, roles)
        untied = untied + inserted
        chosen = [p for m in modules for p in (m.A, m.B)]
        if trainable is not None:
            chosen += [p for p in select_trainable(roles, trainable) if p not in chosen]
    if lowered is not None:  # frozen weights go back to int8
        imported = refreeze(lowered, imported, set(chosen))
    base = fold_constants(imported, fold_shapes=False, keep=set(roles.parameters) | set(chosen), rule=rule)
    roles = roles.finalize(base)
    plan, notes = _rebatch(base, batch_size, rule)
    static_source = base if plan is None else apply_batch_plan(base, plan, batch_size)
    inference = make_static(static_source, batch_size=batch_size, keep=chosen, rule=rule)
    inference.verify(static=True)
    if rule is not None:  # onnx is installed: its schemas say which inputs share a type
        from edgetrain.onnx_io.shapes import check_types  # onnx is installed: the rule came from it

        check_types(inference)
    m = _StaticModel(inference, base, roles, chosen, plan, untied + _decisions(roles) + notes, lowered)
    m.adapters = None if adapters is None else {"config": adapters.config(), "modules": modules}
    m.channels = splits or None
    return m


def _split_channels(imported: Graph, roles: Roles, channels, trainable, others):
    """convert(channels=...): (the graph with those layers split, their roles, the records, trainable with each
    split weight's name replaced by its trained part's); as it was without channels."""
    if not channels:
        return imported, roles, [], trainable, []
    lowered, adapters = others
    if lowered is not None or adapters is not None:
        raise UnsupportedError(
            "channels cannot be combined with "
            + ("an int8 model" if lowered is not None else "adapters")
            + ": train whole weights there (trainable=...), or convert the float model without adapters"
        )
    imported, roles, splits = split_layers(imported, roles, channels)
    shown = ", ".join(f"'{s.weight}' {s.count} of {s.total}" for s in splits[:6]) + (
        " ..." if len(splits) > 6 else ""
    )
    notes = [
        f'{len(splits)} layer(s) train on their first input channels alone (the sparse update of "On-Device '
        f'Training Under 256KB Memory"): {shown}; the other channels stay frozen, and the export writes each '
        "weight whole"
    ]
    if trainable is not None:
        named = {s.weight: s.trained for s in splits}
        listed = [trainable] if isinstance(trainable, str) else list(trainable)
        trainable = [named.get(t, t) for t in listed] + [s.trained for s in splits if s.weight not in listed]
    return imported, roles, splits, trainable, notes


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
) -> dict | None:
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
    return {
        "graph": reduced,
        "gradients": gradients,
        "state_roles": {name: list(role) for name, role in ctx.state_roles.items()},
    }


def read_roles(
    imported: Graph, *, untie: bool | Sequence[str] = False, parameters: Any = None
) -> tuple[Graph, Roles, list[str], Lowered | None]:
    """The graph as imported, with what exporters did to tensors undone (merged tensors of different kinds,
    batch-fixed recurrent states, parameters folded into constants, one tensor written twice), and every
    initializer's role on it; the notes that say what was undone. `convert` and `check` read a model the same
    way. parameters: a parameter manifest (a dict or a JSON file; see edgetrain.derive.manifest), else the model's
    own, if it has one: then it alone decides what trains. An int8 model is lowered first (edgetrain.graph.quantized:
    float master weights read through fake quantization), and the lowering comes back as the fourth value (None for a
    float model)."""
    lowered = lower_quantized(imported)
    if lowered is not None:
        imported = lowered.graph
    manifest = read_manifest(imported, parameters)
    imported, untied = untie_merged(imported)
    imported, states = batch_free_states(imported)
    roles = find_roles(imported)
    imported, refolded = refold_copies(imported, roles)
    if refolded:
        roles = find_roles(imported)
    forced = manifest.ties() if manifest is not None else None
    imported, tied = tie_copies(imported, roles, untie=untie, forced=forced)
    if tied:
        roles = find_roles(imported)
    notes = untied + states + refolded + tied
    if manifest is not None:
        roles = apply_manifest(roles, manifest)
        notes.append(
            f"the parameters are those of the model's manifest ({manifest.source}): {len(manifest.parameters)} "
            f"tensor(s) train, {len(manifest.frozen)} frozen by their author"
        )
    if lowered is not None:
        notes = lowered.notes + notes
    return imported, roles, notes, lowered


def _rebatch(base: Graph, batch_size: int | None, rule=None) -> tuple[BatchPlan | None, list[str]]:
    """The batch plan when batch_size asks for another batch than the one the model was exported with, checked
    sample by sample against the model as exported; and the notes that say what was done."""
    found = fixed_batch(base)
    if batch_size is None or found is None or found[1] == batch_size:
        return None, []
    names, b0 = found
    if b0 == 0:
        raise ShapeError(
            f"the model's input '{names[0]}' ({base.values[names[0]]}) has a fixed batch of 0: it holds no sample "
            "to train on; export it with a batch of 1 or more, or with a dynamic batch"
        )
    plan = find_batch_plan(base, batch_size, rule=rule)
    verify_batch_plan(base, apply_batch_plan(base, plan, batch_size), plan, batch_size, rule=rule)
    shown = ", ".join(f"'{n}' {base.values[n]}" for n in names)
    notes = [
        f"re-batched: the model was exported with a fixed batch of {b0} ({shown}); it trains at batch "
        f"{batch_size}, and its exported ONNX keeps batch {b0}"
    ]
    notes += _rewrites(plan, base, batch_size)
    notes.append("  checked: the re-batched model gives the exported model's outputs, sample by sample")
    return plan, notes


def _rewrites(plan: BatchPlan, base: Graph, batch_size: int, shown: int = 3) -> list[str]:
    """The rewritten shape constants, one line per op: a node alone as it reads, several by their count, the first
    few names and the first change (ShuffleNet has 33 Reshapes). plan.describe(base, batch_size) lists every one
    (`edgetrain convert --debug` prints it)."""
    ops = {n.name: n.op_type for n in base.nodes}
    by_op: dict[str, dict[str, str]] = {}  # op -> {node: its first line}
    for edit, line in zip(plan.edits, plan.describe(base, batch_size)):
        by_op.setdefault(ops[edit.node], {}).setdefault(edit.node, line)
    lines = []
    for op, first in by_op.items():
        names = list(first)
        if len(names) == 1:
            lines.append(f"  rewrote {first[names[0]]}")
            continue
        listed = ", ".join(f"'{n}'" for n in names[:shown])
        if len(names) > shown:
            listed += f" and {len(names) - shown} more (`edgetrain convert --debug` lists them all)"
        change = first[names[0]].rsplit(": ", 1)[1]
        lines.append(f"  rewrote {len(names)} {op} nodes: {listed}; e.g. '{names[0]}': {change}")
    return lines
