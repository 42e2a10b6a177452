"""edgetrain's own graph IR: frozen Node records, a Graph, and a GraphBuilder that makes deterministic fresh names.

Nothing here imports onnx: ONNX protobuf exists only at the edges (edgetrain.onnx_io). Node inputs and outputs are
value names; an empty string stands for an omitted optional input, as in ONNX. Every pass takes a Graph and
returns a new one (nodes are immutable; the containers of a Graph are copied by the builder).
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import EdgeTrainError, LimitError, ModelError, ShapeError

Dim = int | str | None  # int: static; str: symbolic (e.g. "N"); None: unknown
DEFAULT_DOMAIN = ""


@dataclass(frozen=True)
class TensorInfo:
    """dtype and shape of one value; shape is None when even the rank is unknown."""

    dtype: np.dtype
    shape: tuple[Dim, ...] | None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)

    @property
    def nbytes(self) -> int | None:
        """The bytes a value of this static shape holds, as an exact Python int (no int64 overflow); None when
        the shape is not static. A string (object) element counts as one pointer."""
        if not self.is_static:
            return None
        n = np.dtype(self.dtype).itemsize
        for d in self.shape:  # type: ignore[union-attr]
            n *= int(d)
        return n

    def __str__(self) -> str:
        shape = self.shape
        dims = "?" if shape is None else "x".join("?" if d is None else str(d) for d in shape[:12])
        if shape is not None and len(shape) > 12:  # a hostile model's rank: the message stays readable
            dims += f"x...({len(shape)} dims)"
        return f"{np.dtype(self.dtype).name}[{dims}]"


@dataclass(frozen=True, eq=False)
class Node:
    """One operation. attrs holds plain Python values (int, float, str, lists of them, numpy arrays)."""

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = DEFAULT_DOMAIN

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", dict(self.attrs))

    @property
    def label(self) -> str:
        """How errors name this node: its name and op, e.g. "node 'conv1' (Conv)"."""
        return f"node '{self.name or self.outputs[0]}' ({self.op_type})"

    def replace(self, **changes: Any) -> Node:
        fields = dict(
            op_type=self.op_type,
            inputs=self.inputs,
            outputs=self.outputs,
            attrs=self.attrs,
            name=self.name,
            domain=self.domain,
        )
        fields.update(changes)
        return Node(**fields)


@dataclass
class Graph:
    """A dataflow graph. values holds the TensorInfo of every value known (inputs, initializers, node outputs)."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, np.ndarray]
    values: dict[str, TensorInfo]
    opset: int
    name: str = "graph"
    opsets: dict[str, int] = field(default_factory=dict)  # other domains, e.g. {"com.edgetrain": 1}
    # node name -> the module path an exporter recorded for it ('/layer4/layer4.0/layer4.0.conv1'), when its name
    # does not say it (torch's dynamo exporter names nodes node_Conv_340); used to select layers by pattern
    scopes: dict[str, str] = field(default_factory=dict)
    # the model's metadata_props (an exporter's, a manifest of its parameters): read by the build side, not stored
    metadata: dict[str, str] = field(default_factory=dict)

    # ---- queries -------------------------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    uses.setdefault(i, []).append(n)
        return uses

    def info(self, name: str) -> TensorInfo:
        try:
            return self.values[name]
        except KeyError:
            raise ShapeError(f"value '{name}' has no known dtype or shape") from None

    def copy(self, **changes: Any) -> Graph:
        fields = dict(
            nodes=list(self.nodes),
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            initializers=dict(self.initializers),
            values=dict(self.values),
            opset=self.opset,
            name=self.name,
            opsets=dict(self.opsets),
            scopes=dict(self.scopes),
            metadata=dict(self.metadata),
        )
        fields.update(changes)
        return Graph(**fields)

    def toposorted(self) -> Graph:
        return self.copy(nodes=toposort(self.nodes, available=set(self.inputs) | set(self.initializers)))

    def verify(self, *, static: bool = False) -> None:
        """Check the structural invariants every pass must keep; static=True also asks for static shapes."""
        defined: set[str] = set()
        for name in list(self.inputs) + list(self.initializers):
            if name in defined and name not in self.initializers:
                raise ModelError(f"value '{name}' is declared twice as a graph input")
            defined.add(name)
        for name, arr in self.initializers.items():
            assert isinstance(arr, np.ndarray), f"initializer '{name}' is {type(arr).__name__}, not ndarray"
        for node in self.nodes:
            for i in node.inputs:
                if i and i not in defined:
                    raise ModelError(
                        f"{node.label} reads '{i}', which is not defined before it "
                        "(graph not in topological order, or a dangling name)"
                    )
            for o in node.outputs:
                if o and o in defined:
                    raise ModelError(f"{node.label} writes '{o}', which is already defined")
                if o:
                    defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise ModelError(f"graph output '{o}' is produced by no node, input or initializer")
        if static:
            for name in defined:
                info = self.values.get(name)
                if info is None or not info.is_static:
                    raise ShapeError(f"value '{name}' has no static shape ({info})")


@contextmanager
def about(source: str | os.PathLike | None) -> Iterator[None]:
    """Prefixes the message of every EdgeTrainError raised inside with `source` (the model file the user named)
    when it does not name it already, so that a fault found deep in a pass still says which file it is in; the
    exception keeps its class and attributes."""
    try:
        yield
    except EdgeTrainError as e:
        where = os.fspath(source) if source is not None else ""
        if where and e.args and isinstance(e.args[0], str) and where not in e.args[0]:
            e.args = (f"{where}: {e.args[0]}", *e.args[1:])
        if where and isinstance(e, LimitError) and e.path is None:
            e.path = where
        raise


def toposort(nodes: Sequence[Node], available: Iterable[str]) -> list[Node]:
    """Kahn's algorithm, stable: among ready nodes the earliest in the given order goes first."""
    ready_values = set(available)
    producer = {o: idx for idx, n in enumerate(nodes) for o in n.outputs if o}
    waiting = [0] * len(nodes)
    dependents: dict[int, list[int]] = {}
    for idx, n in enumerate(nodes):
        deps = {producer[i] for i in n.inputs if i and i not in ready_values and i in producer}
        missing = [i for i in n.inputs if i and i not in ready_values and i not in producer]
        if missing:
            raise ModelError(f"{n.label} reads '{missing[0]}', which no node, input or initializer defines")
        waiting[idx] = len(deps)
        for d in deps:
            dependents.setdefault(d, []).append(idx)
    heap = [idx for idx in range(len(nodes)) if waiting[idx] == 0]
    heapq.heapify(heap)
    order: list[Node] = []
    while heap:
        idx = heapq.heappop(heap)
        order.append(nodes[idx])
        for d in dependents.get(idx, ()):
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(heap, d)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i in range(len(nodes)) if waiting[i] > 0)
        raise ModelError(
            f"the graph has a cycle through {stuck.label}: a value it reads depends on its own output; ONNX graphs "
            "are acyclic (the file is corrupt, or its exporter is broken)"
        )
    return order


_SUFFIX = re.compile(r"^(.*?)(?:_(\d+))?$")


class GraphBuilder:
    """Adds nodes and initializers to a copy of a graph, with fresh names that are deterministic.

    A fresh name is the hint itself when unused, else hint_1, hint_2, ...: building the same model twice
    gives the same names, so the artifacts are byte-identical.
    """

    def __init__(self, graph: Graph):
        self.graph = graph.copy()
        # Values and nodes have separate namespaces (as in ONNX): a node may share its output's name.
        self._used: set[str] = set(graph.values) | set(graph.initializers) | set(graph.inputs)
        self._used.update(o for n in graph.nodes for o in n.outputs if o)
        self._node_names: set[str] = {n.name for n in graph.nodes if n.name}
        self._counters: dict[tuple[bool, str], int] = {}

    def reserve(self, names: Iterable[str], *, nodes: Iterable[str] = ()) -> None:
        """Marks value (and node) names as taken, e.g. those of a model still being imported."""
        self._used.update(n for n in names if n)
        self._node_names.update(n for n in nodes if n)

    def _fresh(self, used: set[str], hint: str, node: bool) -> str:
        hint = hint or "v"
        if hint not in used:
            used.add(hint)
            return hint
        k = self._counters.get((node, hint), 0)
        while True:
            k += 1
            cand = f"{hint}_{k}"
            if cand not in used:
                self._counters[(node, hint)] = k
                used.add(cand)
                return cand

    def fresh(self, hint: str) -> str:
        """A value name not used yet: the hint itself, else hint_1, hint_2, ..."""
        return self._fresh(self._used, hint, False)

    def fresh_node_name(self, hint: str) -> str:
        return self._fresh(self._node_names, hint, True)

    def add(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        attrs: Mapping[str, Any] | None = None,
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        domain: str = DEFAULT_DOMAIN,
        infos: Sequence[TensorInfo] | None = None,
    ) -> list[str]:
        """Appends one node and returns its output names (fresh ones when outputs is a count)."""
        base = name or op_type
        if isinstance(outputs, int):
            out_names = [
                self.fresh(f"{base}_out" if outputs == 1 else f"{base}_out{k}") for k in range(outputs)
            ]
        else:
            out_names = list(outputs)
            self._used.update(out_names)
        node_name = self.fresh_node_name(base)
        self.graph.nodes.append(
            Node(op_type, tuple(inputs), tuple(out_names), dict(attrs or {}), node_name, domain)
        )
        if infos is not None:
            for o, info in zip(out_names, infos):
                self.graph.values[o] = info
        return out_names

    def add1(self, op_type: str, *inputs: str, **kw: Any) -> str:
        """add() for the common one-output case: returns the single output name."""
        return self.add(op_type, inputs, **kw)[0]

    def initializer(self, hint: str, array: np.ndarray) -> str:
        name = self.fresh(hint)
        array = np.asarray(array)
        self.graph.initializers[name] = array
        self.graph.values[name] = TensorInfo(array.dtype, tuple(int(d) for d in array.shape))
        return name

    def finish(self, outputs: Sequence[str] | None = None) -> Graph:
        g = self.graph
        if outputs is not None:
            g.outputs = list(outputs)
        return g
