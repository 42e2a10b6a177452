"""Weights that train on a subset of their input channels (numpy only): `convert(..., channels={"fc.weight": 16})`
and the memory budget's sparse options (edgetrain.derive.budget). See edgetrain.graph.channels for the split and
its record; this module finds the layers that can be split and splits them in the imported graph.

A layer can be split when one node alone reads its float weight: a Conv with group 1 (W [out, in, k...], input
channels on axis 1 of W and of x), a Gemm with transA 0 (W [out, in] with transB, else [in, out]) or a MatMul whose
right operand is the 2-D weight (W [in, out], x's last axis). Its first `count` input channels train: "On-Device
Training Under 256KB Memory" updates such a fixed subset, so that the backward keeps only that part of the layer's
input, and the gradient and the optimizer state are that part of the weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo
from edgetrain.graph.channels import ChannelSplit
from loaders.values import shown

from .params import CONSTANT, PARAMETER, Role, Roles

F32 = np.float32
FROZEN_PART = "frozen part of"  # how the role of a split weight's frozen part begins


def splittable(graph: Graph, roles: Roles) -> dict[str, tuple[int, int, int]]:
    """{weight: (its reader's index, W's input-channel axis, input channels)} for every layer that can be split."""
    readers: dict[str, int] = {}
    for name in [i for n in graph.nodes for i in set(n.inputs) if i] + list(graph.outputs):
        readers[name] = readers.get(name, 0) + 1
    out = {}
    for k, n in enumerate(graph.nodes):
        if len(n.inputs) < 2 or n.domain not in ("", "ai.onnx"):
            continue
        w = n.inputs[1]
        arr, r = graph.initializers.get(w), roles.entries.get(w)
        if arr is None or arr.dtype != F32 or r is None or r.kind != PARAMETER or readers.get(w) != 1:
            continue
        if n.inputs[0] in graph.initializers:
            continue
        axis = _axis(n, arr)
        if axis is not None and arr.shape[axis] >= 2:
            out[w] = (k, axis, int(arr.shape[axis]))
    return out


def _axis(n: Node, arr: np.ndarray) -> int | None:
    if n.op_type == "Conv" and arr.ndim >= 3 and int(n.attrs.get("group", 1)) == 1:
        return 1
    if n.op_type == "Gemm" and arr.ndim == 2 and not n.attrs.get("transA", 0):
        return 1 if n.attrs.get("transB", 0) else 0
    if n.op_type == "MatMul" and arr.ndim == 2:
        return 0
    return None


def split(graph: Graph, roles: Roles, channels: Mapping[str, int]) -> tuple[Graph, Roles, list[ChannelSplit]]:
    """(the graph with each named weight's layer split, the roles with each trained part a parameter and each
    frozen part a constant, the records); a weight that cannot be split, or a count out of range, is an error."""
    sites = splittable(graph, roles)
    channels = {w: _count(w, c, sites, graph) for w, c in channels.items()}
    fresh = GraphBuilder(graph)  # works on its own copy of the graph
    g = fresh.graph
    records = []
    order = sorted(channels, key=lambda name: -sites[name][0])  # from the last node back: indices stay valid
    for w in order:
        k, axis, total = sites[w]
        records.append(_split_one(g, k, (w, axis, channels[w], total), fresh))
    records.reverse()
    return g, Roles(_roles(roles, records, g)), records


def _count(w: str, count: Any, sites: dict[str, tuple[int, int, int]], graph: Graph) -> int:
    """The count of input channels that train for weight w: a whole number (an int or a numpy integer, not a bool or
    a float) from 1 to its input channels - 1, of a weight that can be split; UnsupportedError saying which."""
    if w not in sites:
        can = ", ".join(repr(s) for s in list(sites)[:6]) + (" ..." if len(sites) > 6 else "")
        held = "" if w in graph.initializers else " (the model holds no tensor of that name)"
        raise UnsupportedError(
            f"channels: {shown(w)} cannot train on a subset of its input channels{held}: it must be the weight of "
            f"one Conv (group 1), Gemm or MatMul that alone reads it; these can: {can or 'none'}"
        )
    total = sites[w][2]
    whole = isinstance(count, (int, np.integer)) and not isinstance(count, bool)
    if not whole or not 0 < count < total:
        what = "is out of range" if whole else f"is a {type(count).__name__}, not a whole number"
        raise UnsupportedError(
            f"channels: the count {shown(count)} for '{w}' {what}: '{w}' has {total} input channels; give a count "
            f"from 1 to {total - 1} (all of them: name it in trainable instead)"
        )
    return int(count)


def _roles(roles: Roles, records: list[ChannelSplit], g: Graph) -> dict[str, Role]:
    """The roles with each split weight's entry replaced, in its place, by its trained part (a parameter) and its
    frozen part (a constant)."""
    split = {s.weight: s for s in records}
    entries: dict[str, Role] = {}
    for name, r in roles.entries.items():
        s = split.get(name)
        if s is None:
            entries[name] = r
            continue
        n, total = s.count, s.total
        for part, kind, text in (
            (s.trained, PARAMETER, f"{r.role} (input channels 0-{n - 1} of {total})"),
            (s.frozen, CONSTANT, f"{FROZEN_PART} '{name}' (input channels {n}-{total - 1} of {total})"),
        ):
            author = r.author if kind == PARAMETER else ""
            entries[part] = Role(
                part, kind, text, r.nodes, _shape(g, part), r.dtype, scopes=r.scopes, author=author
            )
    return entries


def _shape(g: Graph, name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in g.initializers[name].shape)


def _split_one(g: Graph, k: int, site: tuple[str, int, int, int], b: GraphBuilder) -> ChannelSplit:
    """y = op(x, W, ...) -> op(x[:count], W_t, ...) + op(x[count:], W_f), in place on g."""
    w, axis, count, total = site
    node = g.nodes[k]
    arr = g.initializers.pop(w)
    del g.values[w]
    cut = [slice(None)] * arr.ndim
    cut[axis] = slice(0, count)
    trained = b.initializer(f"{w}.channels", np.ascontiguousarray(arr[tuple(cut)]))
    cut[axis] = slice(count, total)
    frozen = b.initializer(f"{w}.frozen", np.ascontiguousarray(arr[tuple(cut)]))
    x, y = node.inputs[0], node.outputs[0]
    x_axis = -1 if node.op_type == "MatMul" else 1
    halves = []
    for part, lo, hi in (("a", 0, count), ("b", count, total)):
        ints = [
            b.initializer(f"{x}_{part}_{what}", np.asarray([v], np.int64))
            for what, v in (("start", lo), ("end", hi), ("axis", x_axis))
        ]
        halves.append((b.fresh(f"{x}_channels_{part}"), b.fresh(f"{y}_part_{part}"), ints))
    info = g.values.get(x)
    shape = info.shape if info is not None else None
    for (xs, ys, _), n in zip(halves, (count, total - count)):
        cut_shape = (
            None
            if shape is None
            else tuple(n if d == (x_axis % len(shape)) else s for d, s in enumerate(shape))
        )
        g.values[xs] = TensorInfo(np.dtype(F32), cut_shape)
        g.values[ys] = g.values.get(y, TensorInfo(np.dtype(F32), None))
    (xa, ya, ia), (xb, yb, ib) = halves
    name = node.name or y
    attrs_b = {a: v for a, v in node.attrs.items() if a != "beta"}
    new = [
        Node("Slice", (x, *ia), (xa,), {}, b.fresh_node_name(f"{name}/channels_a")),
        Node("Slice", (x, *ib), (xb,), {}, b.fresh_node_name(f"{name}/channels_b")),
        Node(
            node.op_type,
            (xa, trained, *node.inputs[2:]),
            (ya,),
            dict(node.attrs),
            b.fresh_node_name(f"{name}/trained"),
        ),
        Node(node.op_type, (xb, frozen), (yb,), attrs_b, b.fresh_node_name(f"{name}/frozen")),
        Node("Add", (ya, yb), (y,), {}, b.fresh_node_name(f"{name}/sum")),
    ]
    g.nodes[k : k + 1] = new
    return ChannelSplit(
        w,
        node.name,
        trained,
        frozen,
        axis,
        count,
        total,
        y,
        [n.name for n in new],
        node.op_type,
        tuple(node.inputs),
        dict(node.attrs),
    )
