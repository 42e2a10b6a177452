"""LoRA adapters in a graph (numpy only; both sides): the record of one adapted layer, the graph without its
adapters (the merged export's graph) and the merged weights. edgetrain.derive.adapters inserts them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgetrain.core.errors import ModelError
from edgetrain.core.ir import Graph, Node
from loaders.values import number, shown

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
    # where other nodes read the base weight too (a tied weight: GPT-2's head is its token table), the name of the
    # merged weight this layer alone reads in the merged export, so that the others still read W; else ""
    own: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LoraModule:
        """The record to_dict wrote (without 'own' for artifacts made before it was recorded)."""
        m = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d or k != "own"})
        for k in ("weight", "node", "A", "B", "output", "base_output", "own"):
            if not isinstance(getattr(m, k), str):
                raise ValueError(f"'{k}' must be a tensor or node name, not {shown(getattr(m, k))}")
        if not isinstance(m.nodes, list) or not all(isinstance(n, str) for n in m.nodes):
            raise ValueError(f"'nodes' must be a list of node names, not {shown(m.nodes)}")
        if m.merge not in ("same", "transposed"):
            raise ValueError(f"'merge' must be 'same' or 'transposed', not {shown(m.merge)}")
        m.scale = number(m.scale, "'scale'", positive=True)  # alpha / rank, a float32 factor
        return m


def unadapted(graph: Graph, modules: Sequence[LoraModule]) -> Graph:
    """graph without its adapters: each adapted op writes its output again, the adapter nodes and tensors go. A layer
    whose base weight other nodes read too reads its own merged weight (module.own) instead (see _read_own)."""
    drop = {name for m in modules for name in m.nodes}
    back = {m.base_output: m.output for m in modules}
    nodes = []
    for n in graph.nodes:
        if n.name in drop:
            continue
        if any(o in back for o in n.outputs):
            n = n.replace(outputs=tuple(back.get(o, o) for o in n.outputs))
        nodes.append(n)
    for m in modules:
        if m.own:
            _read_own(nodes, m, graph)
    gone = {t for m in modules for t in (m.A, m.B, m.base_output)}
    used = {i for n in nodes for i in n.inputs}
    inits = {
        k: v for k, v in graph.initializers.items() if k not in gone and (k in used or k in graph.outputs)
    }
    values = {k: v for k, v in graph.values.items() if k not in gone}
    return graph.copy(nodes=nodes, initializers=inits, values=values)


def _read_own(nodes: list[Node], m: LoraModule, graph: Graph) -> None:
    """The adapted node reads m.own (in W's layout) where it read W, directly or through a Transpose; in place.
    A Transpose that only this node reads is rewired, another one is added."""
    at = next((k for k, n in enumerate(nodes) if n.name == m.node), None)
    node = None if at is None else nodes[at]
    operand = None if node is None or len(node.inputs) < 2 else node.inputs[1]
    if operand == m.weight:
        nodes[at] = node.replace(inputs=(node.inputs[0], m.own, *node.inputs[2:]))
        return
    k, t = next(((k, n) for k, n in enumerate(nodes) if operand in n.outputs), (None, None))
    if t is None or t.op_type != "Transpose" or t.inputs[0] != m.weight:
        raise ModelError(
            f"the merged export cannot give '{m.node}' its own merged weight: the graph has no such node reading "
            f"'{m.weight}' (directly or through a Transpose); export with adapters='serving'"
        )
    if sum(operand in n.inputs for n in nodes) == 1:
        nodes[k] = t.replace(inputs=(m.own,))
        return
    used = {o for n in nodes for o in n.outputs} | set(graph.initializers) | set(graph.inputs)
    out, j = f"{m.own}_transposed", 0
    while out in used:
        j += 1
        out = f"{m.own}_transposed_{j}"
    nodes.insert(at, Node("Transpose", (m.own,), (out,), dict(t.attrs), f"{m.node}/merged_weight"))
    nodes[at + 1] = node.replace(inputs=(node.inputs[0], out, *node.inputs[2:]))


def merged_weights(
    modules: Sequence[LoraModule], base: dict[str, np.ndarray], values: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each adapted weight with its adapter folded in: W + scale A B (transposed where the weight is), under the
    layer's own name where other nodes read W too. W is its trained value when it trains beside the adapters."""
    out = {}
    for m in modules:
        delta = (values[m.A].astype(np.float64) @ values[m.B].astype(np.float64)) * m.scale
        name = m.own or m.weight
        w = out.get(name, values.get(m.weight, base[m.weight])).astype(np.float64)
        out[name] = (w + (delta.T if m.merge == "transposed" else delta)).astype(F32)
    return out
