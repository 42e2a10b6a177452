"""edgetrain's fused ops (domain com.edgetrain) in standard ONNX: each has a body builder that emits standard
ops computing the same outputs, so an emitted training graph runs in any ONNX runtime (as ONNX functions),
while edgetrain's interpreter runs the fused numpy kernel."""

from __future__ import annotations

import numpy as np

from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import PRIVATE_DOMAIN, record

from .context import GradContext, ShapedBuilder


def expand_body(graph: Graph, node: Node) -> Graph:
    """The standard-op subgraph computing one private node: inputs are the node's inputs (constants become
    Constant-free initializers of the subgraph), outputs are the node's outputs."""
    ins = [i for i in node.inputs if i]
    sub = Graph(
        nodes=[],
        inputs=ins,
        outputs=[],
        initializers={},
        values={i: graph.values[i] for i in ins},
        opset=graph.opset,
        name=f"{node.op_type}_body",
    )
    b = ShapedBuilder(sub)
    b.reserve(node.outputs)
    ctx = GradContext(b)
    results = record(node.op_type).body(ctx, node)
    g = b.finish()
    # Rename the results to the node's output names (an Identity where a result is an input or reused).
    rename = {}
    for r, o in zip(results, node.outputs):
        if not o:
            continue
        producer = next((k for k, n in enumerate(g.nodes) if r in n.outputs), None)
        if producer is None or r in rename or r in g.outputs:
            b.add("Identity", [r], outputs=[o])
            continue
        rename[r] = o
    g = b.finish()
    nodes = []
    for n in g.nodes:
        nodes.append(
            n.replace(
                inputs=tuple(rename.get(i, i) for i in n.inputs),
                outputs=tuple(rename.get(o, o) for o in n.outputs),
            )
        )
    values = dict(g.values)
    for r, o in rename.items():
        values[o] = g.values[r]
    out = g.copy(nodes=nodes, outputs=[o for o in node.outputs if o], values=values)
    if any(n.domain == PRIVATE_DOMAIN for n in out.nodes):  # a body built by gradient rules may use fused ops
        out = inline_private(out)
    return out


def inline_private(graph: Graph) -> Graph:
    """The same graph with every private node replaced by its standard-op body (for checking and viewing)."""
    out = graph.copy(nodes=[])
    for node in graph.nodes:
        if node.domain != PRIVATE_DOMAIN:
            out.nodes.append(node)
            continue
        sub = expand_body(graph, node)
        prefix = f"{node.name}/"
        internal = {o for n in sub.nodes for o in n.outputs if o} - set(sub.outputs)
        internal |= set(sub.initializers)
        ren = {v: prefix + v for v in internal}
        for n in sub.nodes:
            out.nodes.append(
                n.replace(
                    name=prefix + n.name,
                    inputs=tuple(ren.get(i, i) for i in n.inputs),
                    outputs=tuple(ren.get(o, o) for o in n.outputs),
                )
            )
        for k, v in sub.initializers.items():
            out.initializers[ren[k]] = np.asarray(v)
        for k, v in sub.values.items():
            out.values[ren.get(k, k)] = v
    return out
