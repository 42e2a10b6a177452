"""Activation recomputation (numpy only): a training step that keeps fewer forward values for its backward.

A forward value the backward reads (a saved activation) lives from its forward node to its last backward reader:
those values are most of a training step's peak. Recomputation keeps some of them and computes the others again
when the backward reaches them, from the kept ones, with the same kernels on the same inputs: the step's results
are bit for bit those of the step that kept everything (tests/derive/test_memory_budget.py proves it).

Two levels, as the on-device training literature uses them (Chen et al. 2016, "Training Deep Nets with Sublinear
Memory Cost"; PockEngine):
- "cheap": a saved value made by a cheap op (an activation, a normalization, an add; not a convolution, a matrix
  product or a pooling: the op record's `heavy`) from values that are kept anyway is recomputed. A convolution
  followed by Relu6 keeps the convolution's output (the Relu6's gradient reads it) and recomputes the Relu6's
  output for the next layer's weight gradient: about half of a CNN's saved bytes, for a few elementwise passes.
- "segments": only every k-th heavy output (k about the square root of their count) is kept; the rest of the
  forward is recomputed segment by segment, convolutions included (about a third more forward work).

A recomputed value's nodes must run when the backward needs them, not as soon as their inputs exist (which is
during the forward, and would keep them as long as before): the first of them reads its input through
`After(x, token)`, whose token is a value of the backward computed just before the first reader. The memory
planner then schedules the recomputation late, and its values die soon after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node
from edgetrain.core.ops import PRIVATE_DOMAIN, record

LEVELS = ("none", "cheap", "segments")
_MAX_CHAIN = 8  # a cheap recomputation goes back at most this many nodes


@dataclass
class Recomputed:
    """What a recomputation did: the saved values it recomputes and those it keeps, and the nodes it added."""

    level: str
    recomputed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    recomputed_bytes: int = 0
    kept_bytes: int = 0
    nodes_added: int = 0

    def describe(self) -> str:
        if self.level == "none" or not self.recomputed:
            return "no activation is recomputed"
        return (
            f"{len(self.recomputed)} saved activation(s) recomputed in the backward "
            f"({self.recomputed_bytes / 2**20:.2f} MiB; {self.nodes_added} node(s) run twice), "
            f"{len(self.kept)} kept ({self.kept_bytes / 2**20:.2f} MiB)"
        )


def recompute(graph: Graph, *, forward_outputs: Sequence[str], level: str) -> tuple[Graph, Recomputed]:
    """The training step `graph` with saved activations recomputed at `level` ("none", "cheap", "segments").
    forward_outputs: the values the forward computes (the loss and the model's outputs): their ancestors are
    the forward, every other node is the backward or the update."""
    if level not in LEVELS:
        raise UnsupportedError(f"recomputation level '{level}': use one of {', '.join(LEVELS)}")
    report = Recomputed(level)
    if level == "none":
        return graph, report
    facts = _Facts(graph, forward_outputs)
    kept = facts.choose_kept(level)
    return _Rewrite(graph, facts, kept, level).run(report)


class _Facts:
    """The forward/backward split of a step and its saved activations."""

    def __init__(self, graph: Graph, forward_outputs: Sequence[str]):
        self.graph = graph
        self.producer = graph.producers()
        self.position = {n.name: k for k, n in enumerate(graph.nodes)}
        self.forward: set[str] = set()  # node names
        stack = [v for v in forward_outputs if v in self.producer]
        while stack:
            nd = self.producer[stack.pop()]
            if nd.name not in self.forward:
                self.forward.add(nd.name)
                stack.extend(i for i in nd.inputs if i in self.producer)
        # saved value -> its backward readers, in the graph's order
        self.saved: dict[str, list[Node]] = {}
        for nd in graph.nodes:
            if nd.name in self.forward:
                continue
            for i in dict.fromkeys(nd.inputs):
                p = self.producer.get(i)
                if p is not None and p.name in self.forward:
                    self.saved.setdefault(i, []).append(nd)
        self.pinned = set(graph.outputs)

    def nbytes(self, v: str) -> int:
        return self.graph.values[v].nbytes or 0

    def clonable(self, nd: Node, *, heavy_too: bool) -> bool:
        """Whether a node may run a second time with the same result: deterministic, one output, no Python loop
        over a sequence (its cost), and cheap unless heavy_too."""
        rec = record(nd.op_type)
        if rec.random or rec.sequential or rec.data_dependent or len(nd.outputs) != 1:
            return False
        return heavy_too or not rec.heavy

    def choose_kept(self, level: str) -> set[str]:
        """The saved values that stay (the rest are recomputed from them, constants and inputs)."""
        order = sorted(self.saved, key=lambda v: self.position[self.producer[v].name])
        heavy_too = level == "segments"
        heavy = [v for v in order if not self.clonable(self.producer[v], heavy_too=False)]
        if heavy_too:  # every k-th heavy output is a checkpoint, with what cannot run twice at all
            k = max(1, math.isqrt(len(heavy)))
            kept = {v for j, v in enumerate(heavy) if j % k == k - 1}
            kept |= {v for v in order if not self.clonable(self.producer[v], heavy_too=True)}
        else:
            kept = set(heavy)
        kept |= self.pinned & set(order)
        changed = True
        while changed:  # a value whose recomputation would need a value nobody keeps stays
            changed = False
            for v in order:
                if v not in kept and self._chain(v, kept, heavy_too=heavy_too) is None:
                    kept.add(v)
                    changed = True
        return kept

    def _chain(self, v: str, kept: set[str], *, heavy_too: bool) -> list[Node] | None:
        """The forward nodes that recompute v from kept values, constants and graph inputs (producers first), or
        None when that would need a value that is not kept (or, for cheap, a chain longer than _MAX_CHAIN)."""
        chain: list[Node] = []
        seen: set[str] = set()

        def visit(value: str) -> bool:
            if value in seen or value not in self.producer or (value in kept and value != v):
                return True
            nd = self.producer[value]
            # a value the backward does not read is passed through only by a cheap node: a chain never reaches
            # back beyond the saved values into the forward's heavy work (a head-only step would recompute it all)
            if not self.clonable(nd, heavy_too=heavy_too and value in self.saved):
                return False
            seen.add(value)
            if not all(visit(i) for i in nd.inputs if i):
                return False
            chain.append(nd)
            return heavy_too or len(chain) <= _MAX_CHAIN

        return chain if visit(v) else None


class _Rewrite:
    """Clones the recomputed values' nodes into the backward and points the backward's readers at the clones."""

    def __init__(self, graph: Graph, facts: _Facts, kept: set[str], level: str):
        self.facts, self.kept, self.heavy_too = facts, kept, level == "segments"
        self.b = GraphBuilder(graph)
        self.clone_of: dict[str, str] = {}  # original value -> its recomputed copy

    def run(self, report: Recomputed) -> tuple[Graph, Recomputed]:
        f = self.facts
        g = self.b.graph
        recomputed = [v for v in f.saved if v not in self.kept]
        # the earliest backward reader first: the clones shared by several values get that reader's token
        recomputed.sort(key=lambda v: min(f.position[r.name] for r in f.saved[v]))
        before: dict[str, list[Node]] = {}  # reader node name -> clone nodes to run just before it
        redirect: dict[str, dict[str, str]] = {}  # reader node name -> {original: copy}
        for v in recomputed:
            first = min(f.saved[v], key=lambda r: f.position[r.name])
            token = self._token(first)
            chain = f._chain(v, self.kept, heavy_too=self.heavy_too)
            assert chain is not None, v
            for nd in chain:
                if nd.outputs[0] not in self.clone_of:
                    before.setdefault(first.name, []).extend(self._clone(nd, token))
            for r in f.saved[v]:
                redirect.setdefault(r.name, {})[v] = self.clone_of[v]
        nodes: list[Node] = []
        for nd in g.nodes:
            nodes.extend(before.get(nd.name, ()))
            if nd.name in redirect:
                m = redirect[nd.name]
                nd = nd.replace(inputs=tuple(m.get(i, i) for i in nd.inputs))
            nodes.append(nd)
        report.nodes_added = len(self.clone_of)
        g.nodes = nodes
        report.recomputed = recomputed
        report.kept = [v for v in f.saved if v in self.kept]
        report.recomputed_bytes = sum(f.nbytes(v) for v in recomputed)
        report.kept_bytes = sum(f.nbytes(v) for v in report.kept)
        return g, report

    def _token(self, reader: Node) -> str | None:
        """A backward value the reader reads (a gradient arriving), or None when it reads forward values only."""
        f = self.facts
        for i in reader.inputs:
            p = f.producer.get(i)
            if p is not None and p.name not in f.forward:
                return i
        return None

    def _clone(self, nd: Node, token: str | None) -> list[Node]:
        """nd again, reading the copies of its recomputed inputs; an input that is not recomputed is read through
        After(input, token), so that nothing of the copy can run before the backward reaches it."""
        out: list[Node] = []
        inputs = [self.clone_of.get(i, i) for i in nd.inputs]
        if token is not None:
            gate = [
                k
                for k, i in enumerate(nd.inputs)
                if i and i not in self.clone_of and i in self.facts.producer
            ]
            if not gate and not any(i in self.clone_of for i in nd.inputs):
                # only constants and graph inputs: gate the first of them all the same
                gate = [next(k for k, i in enumerate(inputs) if i)] if any(inputs) else []
            for k in gate:
                node, inputs[k] = after(self.b, inputs[k], token)
                out.append(node)
        copy = self.b.fresh(f"{nd.outputs[0]}/recomputed")
        self.b.graph.values[copy] = self.b.graph.values[nd.outputs[0]]
        self.clone_of[nd.outputs[0]] = copy
        out.append(nd.replace(inputs=tuple(inputs), outputs=(copy,), name=self.b.fresh_node_name(nd.name)))
        return out


def after(b: GraphBuilder, x: str, token: str) -> tuple[Node, str]:
    """(the node After(x, token), its output): x, for nodes that must not run before token exists."""
    gated = b.fresh(f"{x}/after")
    b.graph.values[gated] = b.graph.values[x]
    return Node("After", (x, token), (gated,), {}, b.fresh_node_name("After"), PRIVATE_DOMAIN), gated
