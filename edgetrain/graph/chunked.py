"""The frozen prefix of a training step in chunks of the batch (numpy only): the same step in a smaller arena.

The frozen part in front of the trainable parameters (edgetrain.graph.prefix) has no backward: its activations
live only until the next layer has read them, but all of them at the training batch. Its nodes keep the samples of
a batch apart (their row rules say so), so it can run on a few samples at a time: the batch is split into equal
chunks, the prefix (re-batched to the chunk by edgetrain.graph.rebatch, its baked-in batch constants rewritten)
runs once per chunk, one chunk after the other (After(x, token) holds each chunk back until the one before has
finished), and the chunks' boundary values are concatenated for the rest of the step. The peak of the prefix's
activations falls by the number of chunks; the step's results are those of the unchunked step (each sample meets
the same kernels; tests/derive/test_memory_budget.py compares them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import EdgeTrainError
from edgetrain.core.ir import Graph, GraphBuilder, Node

from .passes import infer_shapes
from .prefix import split_step
from .rebatch import apply_batch_plan, find_batch_plan
from .recompute import after


def chunk_prefix(graph: Graph, data_inputs: Sequence[str], chunks: int, *, rule=None) -> tuple[Graph, str]:
    """(the step with its frozen prefix run in `chunks` chunks of the batch, "") or (the step unchanged, why
    not): no frozen prefix, a batch the chunks do not divide, or a prefix that cannot move to the chunk's batch."""
    if chunks < 2:
        return graph, "one chunk"
    split, why = split_step(graph, data_inputs)
    if split is None:
        return graph, why
    batch = int(graph.values[data_inputs[0]].shape[0])
    if batch % chunks:
        return graph, f"the batch of {batch} does not split into {chunks} equal chunks"
    small = batch // chunks
    try:
        plan = find_batch_plan(split.prefix, small, rule=rule)
        prefix = infer_shapes(apply_batch_plan(split.prefix, plan, small), rule=rule)
    except EdgeTrainError as e:
        return graph, f"the frozen part cannot run at a batch of {small}: {e}"
    moved = {n.name for n in split.prefix.nodes}
    rest = [n for n in graph.nodes if n.name not in moved]
    b = GraphBuilder(graph)
    g = b.graph
    nodes: list[Node] = []
    parts: dict[str, list[str]] = {v: [] for v in split.boundary}
    slices = {x: _split(b, nodes, x, chunks) for x in split.prefix.inputs}
    for k, init in prefix.initializers.items():  # the rewritten batch constants, shared by every chunk
        if k not in g.initializers:
            g.initializers[k] = init
            g.values[k] = prefix.values[k]
    token: str | None = None
    for c in range(chunks):
        names = {x: slices[x][c] for x in slices}
        if token is not None:  # this chunk starts once the one before has finished
            for x in slices:
                node, names[x] = after(b, names[x], token)
                nodes.append(node)
        for nd in prefix.nodes:
            outs = []
            for o in nd.outputs:
                if not o:
                    outs.append(o)
                    continue
                names[o] = b.fresh(f"{o}/chunk{c}")
                g.values[names[o]] = prefix.values[o]
                outs.append(names[o])
            inputs = tuple(names.get(i, i) for i in nd.inputs)
            nodes.append(
                nd.replace(inputs=inputs, outputs=tuple(outs), name=b.fresh_node_name(f"{nd.name}/chunk{c}"))
            )
        for v in split.boundary:
            parts[v].append(names[v])
        token = names[split.boundary[0]]
    for v in split.boundary:
        nodes.append(Node("Concat", tuple(parts[v]), (v,), {"axis": 0}, b.fresh_node_name(f"{v}/concat")))
    g.nodes = nodes + rest
    g.verify(static=True)
    return g, ""


def _split(b: GraphBuilder, nodes: list[Node], x: str, chunks: int) -> list[str]:
    """x split into `chunks` equal parts along its batch axis (views: Split copies nothing)."""
    info = b.graph.values[x]
    n = int(info.shape[0]) // chunks
    sizes = b.initializer(f"{x}/chunk_sizes", np.full(chunks, n, np.int64))
    outs = [b.fresh(f"{x}/chunk{c}") for c in range(chunks)]
    for o in outs:
        b.graph.values[o] = type(info)(info.dtype, (n, *info.shape[1:]))
    nodes.append(Node("Split", (x, sizes), tuple(outs), {"axis": 0}, b.fresh_node_name(f"{x}/split")))
    return outs
