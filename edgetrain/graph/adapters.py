"""LoRA adapters in a graph (numpy only; both sides): the record of one adapted layer, the graph without its
adapters (the merged export's graph) and the merged weights. edgetrain.derive.adapters inserts them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgetrain.core.ir import Graph

F32 = np.float32


@dataclass
class LoraModule:
    """One adapted layer: where its adapter sits and how it merges into the base weight."""

    weight: str  # the base weight initializer
    node: str  # the MatMul/Gemm node
    A: str
    B: str
    scale: float  # alpha / rank
    output: str  # the layer's output (now the sum of base and adapter)
    base_output: str  # the base op's own output, renamed
    nodes: list[str]  # the inserted nodes' names
    # how A B lands on the weight for a merge: "same" (W is the [in, out] operand), "transposed" (W^T is)
    merge: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LoraModule:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def unadapted(graph: Graph, modules: Sequence[LoraModule]) -> Graph:
    """graph without its adapters: each adapted op writes its output again, the adapter nodes and tensors go."""
    drop = {name for m in modules for name in m.nodes}
    back = {m.base_output: m.output for m in modules}
    nodes = []
    for n in graph.nodes:
        if n.name in drop:
            continue
        if any(o in back for o in n.outputs):
            n = n.replace(outputs=tuple(back.get(o, o) for o in n.outputs))
        nodes.append(n)
    gone = {t for m in modules for t in (m.A, m.B, m.base_output)}
    used = {i for n in nodes for i in n.inputs}
    inits = {
        k: v for k, v in graph.initializers.items() if k not in gone and (k in used or k in graph.outputs)
    }
    values = {k: v for k, v in graph.values.items() if k not in gone}
    return graph.copy(nodes=nodes, initializers=inits, values=values)


def merged_weights(
    modules: Sequence[LoraModule], base: dict[str, np.ndarray], values: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each adapted weight with its adapter folded in: W + scale A B (transposed where the weight is)."""
    out = {}
    for m in modules:
        delta = (values[m.A].astype(np.float64) @ values[m.B].astype(np.float64)) * m.scale
        w = out.get(m.weight, base[m.weight]).astype(np.float64)
        out[m.weight] = (w + (delta.T if m.merge == "transposed" else delta)).astype(F32)
    return out
