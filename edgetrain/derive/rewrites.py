"""The built-in rewrites of the imported model (edgetrain.derive.rewrite says what a rewrite is and when its hooks
run): int8 fake quantization, what exporters did to tensors undone, the channel split, re-batching, recomputation,
the frozen part in chunks, and the declared input pipeline. LoRA adapters are a rewrite too
(edgetrain.derive.adapters). Each leaves its section of the artifact (edgetrain.graph.sections) or nothing."""

from __future__ import annotations

from typing import Any

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.ir import Graph
from edgetrain.graph.chunked import chunk_prefix
from edgetrain.graph.quantized import lower as lower_quantized
from edgetrain.graph.quantized import refreeze
from edgetrain.graph.rebatch import (
    BatchPlan,
    apply_batch_plan,
    batch_free_states,
    find_batch_plan,
    fixed_batch,
    verify_batch_plan,
)
from edgetrain.graph.recompute import recompute as recompute_activations
from edgetrain.graph.sections import BatchPlanSection, ChannelsSection, PreprocessingSection, QuantizedSection

from .channels import split as split_layers
from .manifest import read_manifest
from .params import apply_manifest, find_roles, refold_copies, tie_copies, untie_merged
from .preprocessing import declared_pipeline
from .rewrite import Conversion, Rewrite


class Int8(Rewrite):
    """An int8 model (onnxruntime's quantizers: QDQ, QOperator or dynamic) trained as float master weights read
    through fake quantization on the model's own grid (edgetrain.graph.quantized); the frozen weights go back to
    int8, and the export writes the model in the form it came in, the trained weights requantized. A float model is
    left as it is."""

    KEY = "int8"

    def imported(self, c: Conversion) -> None:
        lowered = lower_quantized(c.graph)
        if lowered is not None:
            c.found[self.KEY] = lowered
            c.graph = lowered.graph
            c.notes.extend(lowered.notes)

    def chosen(self, c: Conversion) -> None:
        lowered = c.found.get(self.KEY)
        if lowered is not None:  # frozen weights go back to int8
            c.graph = refreeze(lowered, c.graph, set(c.chosen))

    def rebuilds_per_choice(self, c: Conversion) -> bool:
        return self.KEY in c.found

    def section(self, c: Conversion, art: Any) -> QuantizedSection | None:
        lowered = c.found.get(self.KEY)
        if lowered is None:
            return None
        _, consts = lowered.header(art.parameters)
        kept = [w for w in lowered.weights if w.name in art.parameters]
        return QuantizedSection(lowered.form, kept, consts, lowered.original)


class Ties(Rewrite):
    """What exporters did to tensors, undone, and the author's parameter manifest: tensors of different kinds merged
    into one, recurrent states fixed to the export's batch, parameters folded into constants, one tensor written
    twice (tied, unless untie asks to keep the copies apart). parameters: a manifest (a dict or a JSON file) that
    says what trains, else the model's own, if it has one (edgetrain.derive.manifest)."""

    KEY = "ties"

    def __init__(self, untie: Any = False, parameters: Any = None):
        self.untie, self.parameters = untie, parameters

    def imported(self, c: Conversion) -> None:
        manifest = read_manifest(c.graph, self.parameters)
        c.graph, untied = untie_merged(c.graph)
        c.graph, states = batch_free_states(c.graph)
        c.found[self.KEY] = (manifest, untied + states)

    def roles_found(self, c: Conversion) -> None:
        manifest, notes = c.found[self.KEY]
        c.graph, refolded = refold_copies(c.graph, c.roles)
        if refolded:
            c.roles = find_roles(c.graph)
        forced = manifest.ties() if manifest is not None else None
        c.graph, tied = tie_copies(c.graph, c.roles, untie=self.untie, forced=forced)
        if tied:
            c.roles = find_roles(c.graph)
        notes = notes + refolded + tied
        if manifest is not None:
            c.roles = apply_manifest(c.roles, manifest)
            notes.append(
                f"the parameters are those of the model's manifest ({manifest.source}): "
                f"{len(manifest.parameters)} tensor(s) train, {len(manifest.frozen)} frozen by their author"
            )
        c.notes.extend(notes)


class SplitChannels(Rewrite):
    """convert(channels={weight: count}): each named Conv/Gemm/MatMul weight trains on its first `count` input
    channels alone (the sparse update of "On-Device Training Under 256KB Memory", edgetrain.derive.channels); the
    export writes each weight whole."""

    KEY = "channels"

    def __init__(self, channels: dict[str, int] | None):
        self.channels = dict(channels or {})

    def choose(self, c: Conversion) -> None:
        if not self.channels:
            return
        if Int8.KEY in c.found:
            raise UnsupportedError(
                "channels cannot be combined with an int8 model: train whole weights there (trainable=...), or "
                "convert the float model without adapters"
            )
        c.graph, c.roles, splits = split_layers(c.graph, c.roles, self.channels)
        shown = ", ".join(f"'{s.weight}' {s.count} of {s.total}" for s in splits[:6]) + (
            " ..." if len(splits) > 6 else ""
        )
        c.notes.append(
            f'{len(splits)} layer(s) train on their first input channels alone (the sparse update of "On-Device '
            f'Training Under 256KB Memory"): {shown}; the other channels stay frozen, and the export writes each '
            "weight whole"
        )
        if c.trainable is not None:
            named = {s.weight: s.trained for s in splits}
            listed = [c.trainable] if isinstance(c.trainable, str) else list(c.trainable)
            c.trainable = [named.get(t, t) for t in listed] + [
                s.trained for s in splits if s.weight not in listed
            ]
        c.found[self.KEY] = splits

    def section(self, c: Conversion, art: Any) -> ChannelsSection | None:
        splits = c.found.get(self.KEY)
        return ChannelsSection(list(splits)) if splits else None


class Rebatch(Rewrite):
    """A model exported with a fixed batch trains at the batch asked for: the shape constants that hold the batch
    are found, rewritten, and checked sample by sample against the model as exported (edgetrain.graph.rebatch);
    its export keeps the batch it was exported with."""

    KEY = "rebatch"

    def static(self, c: Conversion) -> None:
        plan, notes = _rebatch(c.base, c.batch_size, c.rule)
        c.notes.extend(notes)
        if plan is not None:
            c.found[self.KEY] = plan
            c.static_source = apply_batch_plan(c.base, plan, c.batch_size)

    def section(self, c: Conversion, art: Any) -> BatchPlanSection | None:
        plan = c.found.get(self.KEY)
        return None if plan is None else BatchPlanSection(plan)


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


class Recompute(Rewrite):
    """Saved activations recomputed in the backward instead of kept ("cheap": activations of cheap ops, from kept
    values; "segments": all but every k-th heavy output): the same step, bit for bit, with a smaller arena
    (edgetrain.graph.recompute)."""

    KEY = "recompute"

    def __init__(self, level: str = "none"):
        self.level = level

    def step(self, c: Conversion, graph: Graph, notes: list[str]) -> Graph | None:
        forward = [graph.outputs[0], *c.inference.outputs]
        graph, recomputed = recompute_activations(graph, forward_outputs=forward, level=self.level)
        if self.level != "none":
            notes.append(f"recompute {self.level}: {recomputed.describe()}")
        return graph


class ChunkPrefix(Rewrite):
    """The frozen part of the step runs in `chunks` chunks of the batch, one after the other (edgetrain.graph.chunked):
    its activations for one chunk at a time; a step whose frozen part cannot be cut so is no option (None)."""

    KEY = "chunks"

    def __init__(self, chunks: int = 1):
        self.chunks = chunks

    def step(self, c: Conversion, graph: Graph, notes: list[str]) -> Graph | None:
        if self.chunks <= 1:
            return graph
        graph, why = chunk_prefix(graph, list(c.inference.inputs), self.chunks, rule=c.rule)
        if why:
            return None
        notes.append(f"the frozen part runs in {self.chunks} chunks of the batch, one after the other")
        return graph


class DeclaredPipeline(Rewrite):
    """The input pipeline the model declares (loaders.InputPipeline): given to convert, else read from the model's
    metadata, checked against its input (edgetrain.derive.preprocessing); the session applies it to raw data and
    the export writes it into the model's graph."""

    KEY = "preprocessing"

    def __init__(self, given: Any = None):
        self.given = given

    def finished(self, art: Any) -> PreprocessingSection | None:
        spec, notes = declared_pipeline(art.base, self.given)
        art.notes.extend(notes)
        return None if spec is None else PreprocessingSection(spec)
