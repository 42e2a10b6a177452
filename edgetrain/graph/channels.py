"""A weight that trains on a subset of its input channels (numpy only; both sides): the record of one split layer,
the graph with its layers whole again (the export's graph) and the whole weights.

The sparse tensor update of "On-Device Training Under 256KB Memory" (Lin et al. 2022): a layer's weight trains on
its first `count` input channels only. edgetrain.derive.channels splits such a layer in the imported graph,

    y = op(x, W) (+ b)   becomes   y = op(x[:count], W_trained) (+ b) + op(x[count:], W_frozen)

(the channel axis of x and the matching axis of W), so that the step keeps x[:count] alone for the weight's
gradient, and the gradient and optimizer state are those of W_trained. W_frozen is a constant of the model, like
any frozen weight. The export puts the layer back as it was, reading W = concat(W_trained, W_frozen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgetrain.core.declared import MAX_DIMS
from edgetrain.core.ir import Graph, Node
from loaders.values import shown


@dataclass
class ChannelSplit:
    """One split layer: what trains, what stays, and the node it replaced."""

    weight: str  # the weight as the model names it (what the export writes again)
    node: str  # the layer's node (Conv, Gemm or MatMul), as the model names it
    trained: str  # the parameter: W's first `count` input channels
    frozen: str  # the constant: the others
    axis: int  # W's input-channel axis
    count: int  # input channels that train
    total: int  # W's input channels
    output: str  # the layer's output (now the sum of the two halves)
    nodes: list[str]  # the nodes the split inserted in place of `node`
    op_type: str = ""  # the replaced node, to put it back: its op, inputs, attributes
    inputs: tuple[str, ...] = ()
    attrs: dict | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ChannelSplit:
        s = cls(**{k: d[k] for k in cls.__dataclass_fields__})
        for k in ("weight", "node", "trained", "frozen", "output"):
            if not isinstance(getattr(s, k), str):
                raise ValueError(f"'{k}' must be a tensor or node name, not {shown(getattr(s, k))}")
        if not (
            type(s.count) is int
            and type(s.total) is int
            and type(s.axis) is int
            and 0 < s.count < s.total
            and 0 <= s.axis < MAX_DIMS
            and s.op_type in ("Conv", "Gemm", "MatMul")
        ):
            raise ValueError(
                f"split of {shown(s.weight)}: count {shown(s.count)} of {shown(s.total)} on axis {shown(s.axis)} "
                f"of a {shown(s.op_type)}"
            )
        for k in ("nodes", "inputs"):
            v = getattr(s, k)
            if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
                raise ValueError(f"'{k}' must be a list of names, not {shown(v)}")
        if s.attrs is not None and not isinstance(s.attrs, dict):
            raise ValueError(f"'attrs' must be an object of the node's attributes, not {shown(s.attrs)}")
        s.inputs = tuple(s.inputs)
        s.attrs = dict(s.attrs or {})
        return s


def unsplit(graph: Graph, splits: Sequence[ChannelSplit]) -> Graph:
    """graph with each split layer whole again: the original node reads W where the split's nodes stood; the
    halves, their slices and the sum go."""
    drop = {name for s in splits for name in s.nodes}
    first = {s.nodes[0]: s for s in splits}
    nodes = []
    for n in graph.nodes:
        s = first.get(n.name)
        if s is not None:
            nodes.append(Node(s.op_type, s.inputs, (s.output,), dict(s.attrs or {}), s.node))
        if n.name not in drop:
            nodes.append(n)
    gone = {t for s in splits for t in (s.trained, s.frozen)}
    made = {o for n in graph.nodes if n.name in drop for o in n.outputs} - {s.output for s in splits}
    used = {i for n in nodes for i in n.inputs}
    inits = {
        k: v for k, v in graph.initializers.items() if k not in gone and (k in used or k in graph.outputs)
    }
    values = {k: v for k, v in graph.values.items() if k not in gone and k not in made}
    return graph.copy(nodes=nodes, initializers=inits, values=values)


def whole_weights(
    splits: Sequence[ChannelSplit], base: dict[str, np.ndarray], values: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each split weight whole again: its trained channels (their value in `values`, else the base graph's) and its
    frozen ones, concatenated on the input-channel axis."""
    return {
        s.weight: np.ascontiguousarray(
            np.concatenate([values.get(s.trained, base.get(s.trained)), base[s.frozen]], axis=s.axis)
        )
        for s in splits
    }
