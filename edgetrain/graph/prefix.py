"""The frozen prefix of a training step (numpy only): split_step cuts the step program where its frozen part ends.

In head-only or partial fine-tuning, the part of the network in front of the trainable parameters is frozen: with
inference semantics (BatchNorm on its running statistics, Dropout off), it computes the same activations for a
sample every epoch. The prefix maps the data inputs to the boundary values the rest reads; the suffix maps the
boundary values, the targets and the parameters to the step's outputs (edgetrain.runtime.feature_cache caches the
boundary rows per sample). Rows can be cached only where sample i's results depend on sample i alone: each op's
record says, by its row rule (edgetrain.core.rows), when a node keeps its rows apart; anything without a rule, or a
node that mixes samples, ends the prefix before it. A check on the first batch (the prefix on the batch and on the
batch reversed must give the same rows, bit for bit) guards the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import record
from edgetrain.core.rows import CONST, MIXED, ROW, RowFacts

from .passes import prune


@dataclass
class Split:
    prefix: Graph  # the data inputs it reads -> the boundary values
    suffix: Graph  # the boundary values and the step's other inputs -> the step's outputs, in the same order
    boundary: list[str]
    prefix_nodes: int  # data-dependent nodes moved into the prefix
    total_nodes: int


def split_step(
    graph: Graph, data_inputs: Sequence[str], *, exclude: Collection[str] = ()
) -> tuple[Split | None, str]:
    """(the step cut after its frozen prefix, "") or (None, why there is nothing worth caching). Nodes that
    compute a value named in exclude (found to move rows, see FeatureCache.position_dependent) end the prefix."""
    first = graph.values[data_inputs[0]]
    if not first.is_static or not first.shape:
        return None, "the training program's batch is symbolic"
    batch = int(first.shape[0])
    f = RowFacts(graph, batch)
    for name in data_inputs:
        info = graph.values[name]
        f.state[name] = ROW if info.is_static and info.shape and info.shape[0] == batch else MIXED
    consumers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                consumers.setdefault(i, []).append(n)
    in_prefix: list[Node] = []  # data-dependent, rows apart
    const_nodes: list[Node] = []
    stop = ""  # the first node the cut stops at, as users read it
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if any(i not in f.state for i in ins) or record(n.op_type).random or n.domain not in ("", "ai.onnx"):
            continue  # reads a parameter, the target, the learning rate or a value after the prefix
        if all(f.state[i] == CONST for i in ins):
            for o in n.outputs:
                if o:
                    f.state[o] = CONST
            const_nodes.append(n)
            continue
        if any(f.state[i] == MIXED for i in ins):
            continue
        rule = record(n.op_type).rows
        try:
            st = rule(n, f) if rule is not None else MIXED
        except (IndexError, KeyError, TypeError, ValueError):  # a shape or constant the rule cannot read
            st = MIXED
        moves = any(o in exclude for o in n.outputs if o)
        if st == MIXED or moves:
            why = (
                "its results for a sample change with the sample's position in the batch"
                if moves
                else "no rule says it keeps samples apart"
                if rule is None
                else "it mixes the samples of a batch"
            )
            stop = stop or f"{n.label}: {why}"
            for o in n.outputs:
                if o:
                    f.state[o] = MIXED
            continue
        for o in n.outputs:
            if o:
                f.state[o] = ROW
        in_prefix.append(n)
    if not in_prefix:
        if stop:
            return None, f"nothing frozen can be cached from the first node on ({stop})"
        return None, "the first node that reads the input also reads a trained parameter (full fine-tuning)"
    if not any(record(n.op_type).heavy for n in in_prefix):
        ops = sorted({n.op_type for n in in_prefix})
        return None, f"the frozen part ({', '.join(ops)}) is too cheap to be worth caching"
    moved, constant = {id(n) for n in in_prefix}, {id(n) for n in const_nodes}
    rest = [n for n in graph.nodes if id(n) not in moved]
    read_later = {i for n in rest for i in n.inputs if i} | set(graph.outputs)
    boundary = [v for v in dict.fromkeys(o for n in in_prefix for o in n.outputs if o) if v in read_later]
    assert all(f.is_row(v) for v in boundary), boundary
    reads = {i for n in in_prefix for i in n.inputs if i}
    prefix = prune(
        graph.copy(
            nodes=[n for n in graph.nodes if id(n) in moved or id(n) in constant],
            inputs=[d for d in data_inputs if d in reads],
            outputs=boundary,
        )
    )
    suffix_inputs = [i for i in graph.inputs if i in read_later or i not in data_inputs]
    suffix = prune(graph.copy(nodes=rest, inputs=suffix_inputs + boundary))
    return Split(prefix, suffix, boundary, len(in_prefix), len(graph.nodes)), ""
