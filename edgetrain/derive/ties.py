"""What exporters did to tensors, undone (numpy only), on the graph as imported: tensors of different kinds that an
exporter merged because their values were equal get their own initializers again (untie_merged), a parameter folded
into a constant is read from the parameter again (refold_copies), and a tensor written under several names (a tied
weight, stored twice or transposed) becomes one tensor again (tie_copies). Each returns the graph and notes that say
what it did; the roles they read come from edgetrain.derive.params.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from edgetrain.core.errors import ModelError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo

from .params import FIXED, PARAMETER, Roles, find_roles


def untie_merged(graph: Graph) -> tuple[Graph, list[str]]:
    """Undoes an exporter's merging where it joined tensors of different kinds: the TorchScript exporter merges
    initializers whose values are identical (a fresh BatchNorm weight of ones and a running variance of ones) and
    reads the merged one through Identity nodes named after the originals. Aliases that fill a parameter role and
    a statistic role were never one tensor: each gets its own initializer again. (Aliases that are all parameters
    stay one tensor: torch merges truly shared weights the same way, and the graph cannot tell them apart.)"""
    families: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op_type == "Identity" and n.inputs and n.inputs[0] in graph.initializers and n.outputs[0]:
            if n.outputs[0] not in graph.outputs:
                families.setdefault(n.inputs[0], []).append(n)
    if not families:
        return graph, []
    split = _materialize(graph, {n for ns in families.values() for n in ns})
    roles = find_roles(split)
    notes, untie = [], set()
    for src, copies in families.items():
        members = [src] + [n.outputs[0] for n in copies]
        used = [roles.entries[m] for m in members if m in roles.entries and roles.entries[m].nodes]
        if {PARAMETER, FIXED} <= {r.kind for r in used}:
            untie.update(copies)
            shown = ", ".join(f"'{r.name}' ({r.role})" for r in used[:3]) + (" ..." if len(used) > 3 else "")
            notes.append(
                f"the exporter merged tensors with identical values into '{src}': {shown}; they are a parameter "
                "and a statistic, so edgetrain reads them as the separate tensors they are"
            )
    return (_materialize(graph, untie), notes) if untie else (graph, [])


def _materialize(graph: Graph, identities: set[Node]) -> Graph:
    """The graph with the given Identity-of-initializer nodes replaced by initializers of their own."""
    copies: dict[str, list[str]] = {}
    for n in identities:
        copies.setdefault(n.inputs[0], []).append(n.outputs[0])
    inits, values = {}, dict(graph.values)
    for name, arr in graph.initializers.items():  # each copy right after its source: listings read in order
        inits[name] = arr
        for alias in copies.get(name, []):
            inits[alias] = arr
            values[alias] = TensorInfo(arr.dtype, tuple(int(d) for d in arr.shape))
    kept = [n for n in graph.nodes if n not in identities]
    return graph.copy(nodes=kept, initializers=inits, values=values)


def refold_copies(graph: Graph, roles: Roles) -> tuple[Graph, list[str]]:
    """Undoes an exporter's folding of a parameter into a constant: the dynamo exporter unrolls nn.RNN and folds its
    first step's h0 @ W_hh^T + b_hh (h0 = 0) into a constant holding b_hh broadcast over the batch, so b_hh would
    train everywhere but there. A float constant that is exactly a parameter broadcast to a larger shape (a
    parameter with at least two distinct values: random values do not repeat by chance) is read as an Expand of
    that parameter instead, and trains with it."""

    def varied(v: np.ndarray) -> bool:  # two distinct values at least (O(n): no sort of a large tensor)
        return v.size >= 2 and bool(v.min() != v.max())

    # a constant, or a tensor read as a learned one (it meets an activation), that is a parameter broadcast
    learned = [n for n in roles.parameters if roles.entries[n].role.startswith("learned constant")]
    consts = {
        name: c
        for name in [*roles.constants, *learned]
        if (c := graph.initializers.get(name)) is not None
        and c.dtype.kind == "f"
        and c.ndim > 0
        and name not in graph.outputs
        and varied(c)
    }
    params = {
        p: v
        for p in roles.parameters
        if p not in consts and (v := graph.initializers.get(p)) is not None and v.dtype.kind == "f"
    }
    swaps: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, c in consts.items():
        for p, v in params.items():
            if c.size <= v.size or c.dtype != v.dtype:
                continue
            try:
                if np.broadcast_shapes(v.shape, c.shape) != c.shape:
                    continue
            except ValueError:
                continue
            if varied(v) and np.array_equal(c, np.broadcast_to(v, c.shape)):
                swaps[name] = (p, tuple(int(d) for d in c.shape))
                break
    if not swaps:
        return graph, []
    g = graph.copy(nodes=[], initializers={k: v for k, v in graph.initializers.items() if k not in swaps})
    for name, (p, shape) in swaps.items():
        shape_name = f"{name}_shape"
        while shape_name in graph.values or shape_name in graph.initializers:
            shape_name += "_"
        g.initializers[shape_name] = np.asarray(shape, np.int64)
        g.values[shape_name] = TensorInfo(np.dtype(np.int64), (len(shape),))
        g.nodes.append(Node("Expand", (p, shape_name), (name,), {}, name=f"{name}_refold"))
    g.nodes.extend(graph.nodes)
    notes = [
        f"constant '{name}' {list(shape)} is parameter '{p}' broadcast (the exporter folded a computation with it, "
        "e.g. an unrolled RNN's first step): edgetrain reads it from the parameter, so it trains with it"
        for name, (p, shape) in swaps.items()
    ]
    return g, notes


# ---- ties: one tensor under several names ------------------------------------------------------------------------
def tie_copies(
    graph: Graph, roles: Roles, *, untie: bool | Sequence[str] = False, forced: dict[str, str] | None = None
) -> tuple[Graph, list[str]]:
    """Parameters that hold one tensor under several names become that one tensor: the copies an exporter writes
    of a tied weight (GPT-2's lm_head is its token table: TorchScript stores it transposed, dynamo twice). A copy is
    equal to the parameter, or its transpose, or a reshape of it, with varied values (two fills of ones are not a
    tie); and an equal copy must read in another role (a table gathered and a MatMul weight), since equal tensors of
    one role are clones (nn.TransformerEncoder's layers start equal, and train apart). The copy is then computed from
    the parameter (Identity, Transpose or Reshape), so the parameter trains with the sum of both gradients and the
    exported model reads it back in both places. untie=True (or the names of copies) keeps them apart. forced
    ({copy: parameter}, a manifest's) ties exactly those, and nothing else."""
    if forced is not None:
        return _tie(graph, _forced_ties(graph, forced))
    params = [p for p in roles.parameters if (a := graph.initializers.get(p)) is not None and _varied(a)]
    order = {p: k for k, p in enumerate(params)}
    ties: dict[str, tuple[str, str, dict]] = {}  # copy -> (parameter, op, attrs)
    for group in _same_values(graph, params):
        # the one that keeps the name: a module path over a made-up name, a token table over its copy as a head
        first, *rest = sorted(
            group, key=lambda p: (_generated(p), _role_kind(roles, p) != "embedding table", order[p])
        )
        for copy in rest:
            how = _relation(graph.initializers[first], graph.initializers[copy])
            if how is None or how[0] == "Identity" and _role_kind(roles, first) == _role_kind(roles, copy):
                continue
            if untie is True or (not isinstance(untie, bool) and copy in untie):
                continue
            ties[copy] = (first, *how)
    return _tie(graph, ties)


def _forced_ties(graph: Graph, forced: dict[str, str]) -> dict[str, tuple[str, str, dict]]:
    ties = {}
    for copy, first in forced.items():
        a, b = graph.initializers.get(first), graph.initializers.get(copy)
        how = None if a is None or b is None else _relation(a, b)
        if how is None:
            raise ModelError(
                f"the parameter manifest gives '{copy}' and '{first}' one name, but they are not one tensor (neither "
                "equal, nor a transpose or reshape of the other)"
            )
        ties[copy] = (first, *how)
    return ties


def _tie(graph: Graph, ties: dict[str, tuple[str, str, dict]]) -> tuple[Graph, list[str]]:
    """The graph with each copy computed from its parameter (Identity, Transpose, Reshape); notes that say so."""
    if not ties:
        return graph, []
    g = graph.copy(nodes=[], initializers={k: v for k, v in graph.initializers.items() if k not in ties})
    b = GraphBuilder(g)
    for copy, (first, op, attrs) in ties.items():
        inputs = [first]
        if op == "Reshape":
            inputs.append(b.initializer(f"{copy}_shape", np.asarray(attrs.pop("shape"), np.int64)))
        g.nodes.append(Node(op, tuple(inputs), (copy,), attrs, name=f"{copy}_tied"))
    g.nodes.extend(graph.nodes)
    words = {"Identity": "a copy", "Transpose": "the transpose", "Reshape": "a reshape"}
    notes = [
        f"tied: '{copy}' is {words[op]} of '{first}' (the exporter wrote one tensor twice): it trains as one, with "
        "the sum of both gradients, and the exported model reads it in both places (untie= keeps them apart)"
        for copy, (first, op, _) in ties.items()
    ]
    return g, notes


def _varied(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size >= 2 and bool(a.min() != a.max())


def _generated(name: str) -> bool:
    """A name an exporter made up (onnx::MatMul_692, val_39), not a module path: the other copy names the tensor."""
    return name.startswith(("onnx::", "val_", "/", "_")) or name.split("_")[0] in ("initializer", "const")


def _role_kind(roles: Roles, name: str) -> str:
    """'weight of MatMul' -> 'weight', 'embedding table of Gather' -> 'embedding table': what the tensor is."""
    return roles.entries[name].role.split(" of ")[0]


def _same_values(graph: Graph, names: list[str]) -> list[list[str]]:
    """Groups of tensors that may hold the same values in another layout: the same dtype and size, and the same sum
    and sum of squares up to the rounding of adding them up in another order (the caller checks exactly)."""
    buckets: dict[tuple, list[tuple[str, float, float, float]]] = {}
    for n in names:
        a = graph.initializers[n]
        x = a.astype(np.float64).ravel()
        buckets.setdefault((a.dtype.str, a.size), []).append(
            (n, float(x.sum()), float(x @ x), float(np.abs(x).sum()))
        )
    groups = []
    for rest in buckets.values():
        while len(rest) > 1:
            _, s, q, l1 = rest[0]
            same = [m for m in rest if abs(m[1] - s) <= 1e-6 * l1 and abs(m[2] - q) <= 1e-6 * q]
            if len(same) > 1:
                groups.append([m[0] for m in same])
            rest = [m for m in rest if m not in same]
    return groups


def _relation(a: np.ndarray, b: np.ndarray) -> tuple[str, dict] | None:
    """How b is made of a: ("Identity", {}), ("Transpose", {"perm": ...}), ("Reshape", {"shape": ...}), or None
    (as for tensors of different sizes or dtypes)."""
    if a.size != b.size or a.dtype != b.dtype:
        return None
    if a.shape == b.shape and np.array_equal(a, b):
        return "Identity", {}
    if a.ndim <= 4:
        for perm in itertools.permutations(range(a.ndim)):
            if list(perm) != list(range(a.ndim)) and a.transpose(perm).shape == b.shape:
                if np.array_equal(a.transpose(perm), b):
                    return "Transpose", {"perm": list(perm)}
    if a.shape != b.shape and np.array_equal(a.reshape(b.shape), b):
        return "Reshape", {"shape": list(b.shape)}
    return None
