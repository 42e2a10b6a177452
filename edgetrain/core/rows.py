"""How each op treats the rows of a batch (numpy only): a rule per kind of op says whether sample i's results are
row i of the node's outputs, computed from sample i alone. The op records (edgetrain.core.ops, field `rows`) name
each op's rule; edgetrain.graph.prefix reads them to cut a training step after its frozen prefix.

A rule reads RowFacts (static shapes, constant values, the state of every value seen so far) and says ROW (the
node keeps its rows apart: a convolution of each image, an elementwise op against constants without a batch axis,
a reduction over axes other than 0, ...) or MIXED (it mixes samples: BatchNorm in training mode, a reduction over
the batch, a constant with a different value per batch position).

A value may hold its samples along another axis than 0: a recurrence's input and outputs in layout 0 ([T, N, I]
-> Y [T, D, N, H]). Its state is then row_at(k) (sample i's values are v[:, ..., i] on axis k), which only the
rules that move the batch axis read (Transpose, Reshape, Squeeze/Unsqueeze, Gather, the recurrences); every other
rule sees it as not a row. A rule may return one state per output (a recurrence's Y and states differ)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir import Graph, Node

ROW, CONST, MIXED = "row", "const", "mixed"  # per value: sample i's result is row i / no data / samples mix


def row_at(axis: int) -> str:
    """The state of a value whose samples lie along `axis` (ROW for axis 0)."""
    return ROW if axis == 0 else f"row@{axis}"


class RowFacts:
    """What the rules read: static shapes, constant values, the state of every value seen so far."""

    def __init__(self, graph: Graph, batch: int):
        self.graph, self.batch = graph, batch
        self.state: dict[str, str] = {k: CONST for k in graph.initializers}

    def shape(self, v: str) -> tuple[int, ...]:
        info = self.graph.values.get(v)
        return tuple(info.shape) if info is not None and info.is_static else ()

    def rank(self, v: str) -> int:
        return len(self.shape(v))

    def const(self, v: str) -> np.ndarray | None:
        return self.graph.initializers.get(v)

    def ints(self, v: str) -> list[int] | None:
        a = self.const(v) if v else None
        return None if a is None else [int(i) for i in np.asarray(a).ravel()]

    def is_row(self, v: str, rank: int | None = None) -> bool:
        """v holds one row per sample: sample i's values are v[i]."""
        if self.state.get(v) != ROW:
            return False
        s = self.shape(v)
        return bool(s) and s[0] == self.batch and (rank is None or len(s) == rank)

    def batch_axis(self, v: str) -> int | None:
        """The axis v holds its samples along (0 for a row), or None when it is not per sample."""
        st = self.state.get(v, "")
        if st != ROW and not st.startswith("row@"):
            return None
        axis = 0 if st == ROW else int(st[4:])
        s = self.shape(v)
        return axis if len(s) > axis and s[axis] == self.batch else None

    def same_along(self, v: str, axis: int) -> bool:
        """A constant that gives every sample the same values along `axis` (size 1 there, equal slices, or an
        Expand of such a constant)."""
        if self.state.get(v) != CONST:
            return False
        s = self.shape(v)
        if len(s) <= axis or s[axis] == 1:
            return True
        a = self.const(v)
        if a is not None:
            first = np.take(a, [0], axis=axis)
            return bool(np.array_equal(a, np.broadcast_to(first, a.shape)))
        producer = self._producer(v)
        if producer is None or producer.op_type != "Expand":
            return False
        src = producer.inputs[0]
        lead = len(s) - len(self.shape(src))  # Expand aligns shapes to the right
        return axis < lead or self.same_along(src, axis - lead)

    def _producer(self, v: str) -> Node | None:
        if not hasattr(self, "_producers"):
            self._producers = {o: n for n in self.graph.nodes for o in n.outputs if o}
        return self._producers.get(v)

    def same_for_all(self, v: str, rank: int) -> bool:
        """A constant operand that broadcasts over the rows without telling them apart: no batch axis of its own,
        or one whose rows are all equal."""
        if self.state.get(v) != CONST:
            return False
        s = self.shape(v)
        if len(s) < rank or s[0] == 1:
            return True
        a = self.const(v)
        return a is not None and bool(np.array_equal(a, np.broadcast_to(a[:1], a.shape)))


# (node, facts) -> ROW when the node keeps sample i's results in row i of its outputs, else MIXED
Rule = Callable[[Node, RowFacts], str]


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def elementwise(n: Node, f: RowFacts) -> str:
    rank = f.rank(n.outputs[0])
    if not f.shape(n.outputs[0]) or f.shape(n.outputs[0])[0] != f.batch:
        return MIXED
    for i in n.inputs:
        if i and not (f.is_row(i, rank) or f.same_for_all(i, rank)):
            return MIXED
    return ROW


def per_sample(n: Node, f: RowFacts) -> str:
    """Ops that work on each sample of input 0 by itself, with constant settings (Conv, pooling, ...)."""
    if not f.is_row(n.inputs[0]) or any(i and f.state.get(i) != CONST for i in n.inputs[1:]):
        return MIXED
    return ROW if all(not o or f.shape(o)[:1] == (f.batch,) for o in n.outputs[:1]) else MIXED


def on_axis(default: int, attr: str = "axis", then: Rule | None = None) -> Rule:
    """Ops along one axis of input 0 (softmax, flatten, concat, ...): rows stay apart unless that axis is 0; then
    the rule `then` decides (per_sample by default; elementwise for Concat, whose every input is a row)."""

    def rule(n: Node, f: RowFacts) -> str:
        x = n.inputs[0]
        if _axis(int(n.attrs.get(attr, default)), f.rank(x)) == 0:
            return MIXED
        return (then or per_sample)(n, f)

    return rule


def axes(n: Node, f: RowFacts) -> str:
    """Reductions and Squeeze/Unsqueeze: axes (attribute or constant input 1) that leave axis 0 alone."""
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        axes = f.ints(n.inputs[1])
        if axes is None:
            return MIXED
    if not axes:
        if n.op_type.startswith("Reduce") and n.attrs.get("noop_with_empty_axes", 0):
            return per_sample(n, f)
        return MIXED if n.op_type != "Squeeze" or f.batch == 1 else reshape(n, f)
    rank = f.rank(n.outputs[0] if n.op_type == "Unsqueeze" else n.inputs[0])
    axes = {_axis(int(a), rank) for a in axes}
    b = f.batch_axis(n.inputs[0])
    if b and n.op_type in ("Squeeze", "Unsqueeze"):  # samples along another axis than 0: follow it
        return _moved_axis(n.op_type, b, axes, rank)
    return MIXED if 0 in axes else per_sample(n, f)


def _moved_axis(op: str, b: int, axes: set[int], rank: int) -> str:
    """Where Squeeze / Unsqueeze (of these axes, normalized for rank) puts the batch axis b."""
    if op == "Squeeze":
        return MIXED if b in axes else row_at(b - sum(1 for a in axes if a < b))
    kept = [k for k in range(rank) if k not in axes]  # the output axes the input's fill, in order
    return row_at(kept[b])


def reshape(n: Node, f: RowFacts) -> str:
    """Reshape and the like: when input and output both lead with the batch, row-major order keeps row i as row i;
    likewise at the axis of the output whose leading dimensions hold as many elements as those before the input's
    batch axis, when it is the batch's size (sample i stays at index i there)."""
    x, y = n.inputs[0], n.outputs[0]
    b = f.batch_axis(x)
    if b is None or any(f.state.get(i) != CONST for i in n.inputs[1:] if i):
        return MIXED
    before = int(np.prod(f.shape(x)[:b], dtype=np.int64))
    ys = f.shape(y)
    for k in range(len(ys)):
        lead = int(np.prod(ys[:k], dtype=np.int64))
        if lead == before and ys[k] == f.batch:
            return row_at(k)
        if lead > before:
            break
    return MIXED


def transpose(n: Node, f: RowFacts) -> str:
    perm = n.attrs.get("perm")
    b = f.batch_axis(n.inputs[0])
    if perm is None or b is None:
        return MIXED
    return row_at([int(p) for p in perm].index(b))  # the batch axis moves where perm puts it


def expand(n: Node, f: RowFacts) -> str:
    same_rank = f.rank(n.inputs[0]) == f.rank(n.outputs[0])
    return reshape(n, f) if same_rank and f.batch_axis(n.inputs[0]) == 0 else MIXED


def tile(n: Node, f: RowFacts) -> str:
    reps = f.ints(n.inputs[1])
    return per_sample(n, f) if reps is not None and reps[0] == 1 else MIXED


def pad(n: Node, f: RowFacts) -> str:
    pads = f.ints(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else n.attrs.get("pads")
    if pads is None or (len(n.inputs) > 3 and n.inputs[3]):  # explicit axes: not worth the bookkeeping
        return MIXED
    rank = f.rank(n.inputs[0])
    return per_sample(n, f) if int(pads[0]) == 0 and int(pads[rank]) == 0 else MIXED


def slices(n: Node, f: RowFacts) -> str:
    starts, ends = f.ints(n.inputs[1]), f.ints(n.inputs[2])
    axes = f.ints(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else None
    steps = f.ints(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else None
    if starts is None or ends is None:
        return MIXED
    rank = f.rank(n.inputs[0])
    axes = list(range(len(starts))) if axes is None else [_axis(a, rank) for a in axes]
    if 0 in axes:  # axis 0 sliced: fine only when it takes every row, in order
        k = axes.index(0)
        if not (starts[k] == 0 and (steps is None or steps[k] == 1) and ends[k] >= f.batch):
            return MIXED
    return per_sample(n, f)


def split(n: Node, f: RowFacts) -> str:
    if _axis(int(n.attrs.get("axis", 0)), f.rank(n.inputs[0])) == 0:
        return MIXED
    return per_sample(n, f)


def gather(n: Node, f: RowFacts) -> str:
    data, idx = n.inputs[0], n.inputs[1]
    axis = _axis(int(n.attrs.get("axis", 0)), f.rank(data))
    b = f.batch_axis(data)
    if b is not None and axis != b and f.state.get(idx) == CONST:  # the output's axes: data's, idx's at axis
        return row_at(b if axis > b else b - 1 + f.rank(idx))
    if axis == 0 and f.state.get(data) == CONST and f.is_row(idx):  # an embedding lookup per sample
        return ROW
    return MIXED


def matmul(n: Node, f: RowFacts) -> str:
    a, b = n.inputs[0], n.inputs[1]
    ra, rb = f.rank(a), f.rank(b)
    if f.shape(n.outputs[0])[:1] != (f.batch,):
        return MIXED
    if f.is_row(a) and ra >= 2 and (rb < ra or f.same_for_all(b, ra)):
        return ROW
    if f.is_row(b) and rb >= 3 and (ra < rb or f.same_for_all(a, rb)):
        return ROW
    if f.is_row(a) and f.is_row(b) and ra == rb >= 3:  # per-sample products (attention)
        return ROW
    return MIXED


def gemm(n: Node, f: RowFacts) -> str:
    if n.attrs.get("transA", 0) or not f.is_row(n.inputs[0], 2) or f.state.get(n.inputs[1]) != CONST:
        return MIXED
    c = n.inputs[2] if len(n.inputs) > 2 else ""
    return ROW if not c or f.same_for_all(c, 2) else MIXED


def batchnorm(n: Node, f: RowFacts) -> str:
    if n.attrs.get("training_mode", 0):  # batch statistics: every sample's output depends on the others
        return MIXED
    return per_sample(n, f)


def dropout(n: Node, f: RowFacts) -> str:
    mode = n.inputs[2] if len(n.inputs) > 2 else ""
    if mode and (f.const(mode) is None or bool(np.asarray(f.const(mode)).item())):
        return MIXED  # training-mode dropout is random: never cached
    return per_sample(n, f)


def maxpool(n: Node, f: RowFacts) -> str:
    # the Indices output numbers elements across the whole batch: position-dependent
    return MIXED if len(n.outputs) > 1 and n.outputs[1] else per_sample(n, f)


def mvn(n: Node, f: RowFacts) -> str:
    axes = n.attrs.get("axes", [0, 2, 3])
    return MIXED if 0 in {_axis(int(a), f.rank(n.inputs[0])) for a in axes} else per_sample(n, f)


def layernorm(n: Node, f: RowFacts) -> str:
    if _axis(int(n.attrs.get("axis", -1)), f.rank(n.inputs[0])) == 0:
        return MIXED
    return per_sample(n, f)


def recurrent(n: Node, f: RowFacts) -> str | list[str]:
    """LSTM, GRU, RNN: each sample's sequence runs by itself along the batch axis (1 in layout 0, 0 in layout 1)
    with the constant weights; sequence lengths and initial states per sample or the same for all. Y holds the
    samples on axis 2 (layout 0) or 0, the final states on axis 1 or 0."""
    layout = int(n.attrs.get("layout", 0))
    b = 0 if layout else 1
    if f.batch_axis(n.inputs[0]) != b:
        return MIXED
    ins = list(n.inputs) + [""] * 8
    if any(ins[k] and f.state.get(ins[k]) != CONST for k in (1, 2, 3, 7)):  # W, R, B, P
        return MIXED
    lens = ins[4]
    if lens and not (f.batch_axis(lens) == 0 or f.same_along(lens, 0)):
        return MIXED
    for state in (ins[5], ins[6] if n.op_type == "LSTM" else ""):
        if state and not (f.batch_axis(state) == 1 - layout or f.same_along(state, 1 - layout)):
            return MIXED
    return [row_at(0 if layout else 2)] + [row_at(1 - layout)] * (len(n.outputs) - 1)
