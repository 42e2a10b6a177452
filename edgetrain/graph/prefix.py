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
from dataclasses import dataclass, field

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
    # the axis each value computed from the data holds its samples along, where it is not 0 (a recurrence's Y)
    batch_axes: dict[str, int] = field(default_factory=dict)


def split_step(
    graph: Graph, data_inputs: Sequence[str], *, exclude: Collection[str] = ()
) -> tuple[Split | None, str]:
    """(the step cut after its frozen prefix, "") or (None, why there is nothing worth caching). Nodes that
    compute a value named in exclude (found to move rows, see FeatureCache.position_dependent) end the prefix."""
    first = graph.values[data_inputs[0]]
    if not first.is_static or not first.shape:
        return None, "the training program's batch is symbolic"
    f, in_prefix, const_nodes, stop = _walk(graph, data_inputs, int(first.shape[0]), exclude)
    in_prefix = _settle(graph, f, in_prefix)
    if not in_prefix:
        if stop:
            return None, f"nothing frozen can be cached from the first node on ({stop})"
        return None, "the first node that reads the input also reads a trained parameter (full fine-tuning)"
    if not any(record(n.op_type).heavy for n in in_prefix):
        ops = sorted({n.op_type for n in in_prefix})
        return None, f"the frozen part ({', '.join(ops)}) is too cheap to be worth caching"
    return _cut(graph, data_inputs, f, in_prefix, const_nodes), ""


def _walk(
    graph: Graph, data_inputs: Sequence[str], batch: int, exclude: Collection[str]
) -> tuple[RowFacts, list[Node], list[Node], str]:
    """In node order, the state of every value the data reaches before a parameter does: (the facts, the nodes
    that keep rows apart, the nodes of constants alone, the first node the prefix stops at, as users read it)."""
    f = RowFacts(graph, batch)
    for name in data_inputs:
        info = graph.values[name]
        f.state[name] = ROW if info.is_static and info.shape and info.shape[0] == batch else MIXED
    in_prefix: list[Node] = []  # data-dependent, rows apart
    const_nodes: list[Node] = []
    stop = ""
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        rec = record(n.op_type)
        if (
            any(i not in f.state for i in ins)
            or rec.random
            or (n.domain not in ("", "ai.onnx") and not rec.rows)
        ):
            continue  # reads a parameter, the target, the learning rate or a value after the prefix (edgetrain's
            # own ops are backward ops, but for FakeQuantize, an int8 model's forward, which keeps rows apart)
        if all(f.state[i] == CONST for i in ins):
            state, why = CONST, ""
            const_nodes.append(n)
        elif any(f.state[i] == MIXED for i in ins):
            continue
        else:
            state, why = _rows_of(n, f, exclude)
            if state == MIXED:
                stop = stop or f"{n.label}: {why}"
            else:
                in_prefix.append(n)
        states = state if isinstance(state, list) else [state] * len(n.outputs)
        for o, st in zip(n.outputs, states):
            if o:
                f.state[o] = st
    return f, in_prefix, const_nodes, stop


def _settle(graph: Graph, f: RowFacts, in_prefix: list[Node]) -> list[Node]:
    """The prefix without the nodes whose results the rest would read with the samples along another axis than 0
    (a recurrence's Y in layout 0): the cache keeps rows. What such a node feeds in the prefix goes too."""
    while True:
        moved = {id(n) for n in in_prefix}
        read_later = {i for n in graph.nodes if id(n) not in moved for i in n.inputs if i} | set(
            graph.outputs
        )
        bad = {id(n) for n in in_prefix if any(o in read_later and not f.is_row(o) for o in n.outputs if o)}
        if not bad:
            return in_prefix
        dropped: set[str] = set()
        kept = []
        for n in in_prefix:
            if id(n) in bad or any(i in dropped for i in n.inputs):
                dropped.update(o for o in n.outputs if o)
            else:
                kept.append(n)
        in_prefix = kept


def _rows_of(n: Node, f: RowFacts, exclude: Collection[str]) -> tuple[str | list[str], str]:
    """(its state, "") when node n keeps its rows apart by its op's row rule (one state, or one per output: ROW,
    or the samples along another axis), else (MIXED, why not)."""
    rule = record(n.op_type).rows
    try:
        state = rule(n, f) if rule is not None else MIXED
    except (IndexError, KeyError, TypeError, ValueError):  # a shape or constant the rule cannot read
        state = MIXED
    if isinstance(state, list) and MIXED in state:
        state = MIXED
    if any(o in exclude for o in n.outputs if o):
        return MIXED, "its results for a sample change with the sample's position in the batch"
    if state == MIXED:
        return (
            MIXED,
            "no rule says it keeps samples apart" if rule is None else "it mixes the samples of a batch",
        )
    return state, ""


def _cut(
    graph: Graph, data_inputs: Sequence[str], f: RowFacts, in_prefix: list[Node], const_nodes: list[Node]
):
    """The step cut in two: the prefix (its nodes and the constants they read) and the rest."""
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
    axes = {o: f.batch_axis(o) for n in in_prefix for o in n.outputs if o}
    axes = {v: a for v, a in axes.items() if a}
    return Split(prefix, suffix, boundary, len(in_prefix), len(graph.nodes), axes)
