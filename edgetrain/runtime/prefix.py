"""The frozen prefix of a training step, and a per-sample cache of its results (numpy only).

In head-only or partial fine-tuning, the part of the network in front of the trainable parameters is frozen: with
inference semantics (BatchNorm on its running statistics, Dropout off), it computes the same activations for a
sample every epoch. split_step cuts the step program where the frozen part ends: the prefix (data inputs -> the
boundary values the rest reads) and the suffix (the boundary values, the targets, the parameters -> the step's
outputs). FeatureCache keeps each sample's boundary rows, keyed by a digest of the sample's bytes, so that a sample
seen before skips the prefix; the suffix then runs exactly the nodes the whole program would have run on exactly
the same values, so training is bit for bit what it is without the cache.

Rows can be cached only where sample i's results depend on sample i alone. BATCH_RULES says, op by op, when a
node keeps its rows apart (a convolution of each image, an elementwise op against constants without a batch axis,
a reduction over axes other than 0, ...); anything it does not know, or a node that mixes samples (BatchNorm in
training mode, a reduction over the batch, a constant with a different value per batch position), ends the prefix
before it. A check on the first batch (the prefix on the batch and on the batch reversed must give the same rows,
bit for bit) guards the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir import Graph, Node
from .interpreter import Interpreter

ROW, CONST, MIXED = "row", "const", "mixed"  # per value: sample i's result is row i / no data / samples mix
# ops whose cost makes a prefix worth caching (a prefix of casts and scalings is cheaper to recompute)
HEAVY = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", "MaxPool", "AveragePool", "LSTM", "GRU", "RNN"}
)
RANDOM = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
DEFAULT_MAX_BYTES = 64 << 20


# ---- which nodes keep samples apart ----------------------------------------------------------------------------
class _Facts:
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


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _elementwise(n: Node, f: _Facts) -> str:
    rank = f.rank(n.outputs[0])
    if not f.shape(n.outputs[0]) or f.shape(n.outputs[0])[0] != f.batch:
        return MIXED
    for i in n.inputs:
        if i and not (f.is_row(i, rank) or f.same_for_all(i, rank)):
            return MIXED
    return ROW


def _per_sample(n: Node, f: _Facts) -> str:
    """Ops that work on each sample of input 0 by itself, with constant settings (Conv, pooling, ...)."""
    if not f.is_row(n.inputs[0]) or any(i and f.state.get(i) != CONST for i in n.inputs[1:]):
        return MIXED
    return ROW if all(not o or f.shape(o)[:1] == (f.batch,) for o in n.outputs[:1]) else MIXED


def _on_axis(default: int, attr: str = "axis") -> Callable[[Node, _Facts], str]:
    """Ops along one axis of input 0 (softmax, flatten, concat, ...): rows stay apart unless that axis is 0."""

    def rule(n: Node, f: _Facts) -> str:
        x = n.inputs[0]
        if _axis(int(n.attrs.get(attr, default)), f.rank(x)) == 0:
            return MIXED
        return _elementwise(n, f) if n.op_type == "Concat" else _per_sample(n, f)

    return rule


def _axes_rule(n: Node, f: _Facts) -> str:
    """Reductions and Squeeze/Unsqueeze: axes (attribute or constant input 1) that leave axis 0 alone."""
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        axes = f.ints(n.inputs[1])
        if axes is None:
            return MIXED
    if not axes:
        if n.op_type.startswith("Reduce") and n.attrs.get("noop_with_empty_axes", 0):
            return _per_sample(n, f)
        return MIXED if n.op_type != "Squeeze" or f.batch == 1 else _shape_keeps_rows(n, f)
    rank = f.rank(n.outputs[0] if n.op_type == "Unsqueeze" else n.inputs[0])
    return MIXED if 0 in {_axis(int(a), rank) for a in axes} else _per_sample(n, f)


def _shape_keeps_rows(n: Node, f: _Facts) -> str:
    """Reshape and the like: when input and output both lead with the batch, row-major order keeps row i as row i."""
    x, y = n.inputs[0], n.outputs[0]
    if (
        f.is_row(x)
        and f.shape(y)[:1] == (f.batch,)
        and all(f.state.get(i) == CONST for i in n.inputs[1:] if i)
    ):
        return ROW
    return MIXED


def _transpose(n: Node, f: _Facts) -> str:
    perm = n.attrs.get("perm")
    return _per_sample(n, f) if perm is not None and int(perm[0]) == 0 else MIXED


def _expand(n: Node, f: _Facts) -> str:
    return _shape_keeps_rows(n, f) if f.rank(n.inputs[0]) == f.rank(n.outputs[0]) else MIXED


def _tile(n: Node, f: _Facts) -> str:
    reps = f.ints(n.inputs[1])
    return _per_sample(n, f) if reps is not None and reps[0] == 1 else MIXED


def _pad(n: Node, f: _Facts) -> str:
    pads = f.ints(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else n.attrs.get("pads")
    if pads is None or (len(n.inputs) > 3 and n.inputs[3]):  # explicit axes: not worth the bookkeeping
        return MIXED
    rank = f.rank(n.inputs[0])
    return _per_sample(n, f) if int(pads[0]) == 0 and int(pads[rank]) == 0 else MIXED


def _slice(n: Node, f: _Facts) -> str:
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
    return _per_sample(n, f)


def _split(n: Node, f: _Facts) -> str:
    if _axis(int(n.attrs.get("axis", 0)), f.rank(n.inputs[0])) == 0:
        return MIXED
    return _per_sample(n, f)


def _gather(n: Node, f: _Facts) -> str:
    data, idx = n.inputs[0], n.inputs[1]
    axis = _axis(int(n.attrs.get("axis", 0)), f.rank(data))
    if axis != 0 and f.is_row(data) and f.state.get(idx) == CONST:
        return ROW
    if axis == 0 and f.state.get(data) == CONST and f.is_row(idx):  # an embedding lookup per sample
        return ROW
    return MIXED


def _matmul(n: Node, f: _Facts) -> str:
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


def _gemm(n: Node, f: _Facts) -> str:
    if n.attrs.get("transA", 0) or not f.is_row(n.inputs[0], 2) or f.state.get(n.inputs[1]) != CONST:
        return MIXED
    c = n.inputs[2] if len(n.inputs) > 2 else ""
    return ROW if not c or f.same_for_all(c, 2) else MIXED


def _batchnorm(n: Node, f: _Facts) -> str:
    if n.attrs.get("training_mode", 0):  # batch statistics: every sample's output depends on the others
        return MIXED
    return _per_sample(n, f)


def _dropout(n: Node, f: _Facts) -> str:
    mode = n.inputs[2] if len(n.inputs) > 2 else ""
    if mode and (f.const(mode) is None or bool(np.asarray(f.const(mode)).item())):
        return MIXED  # training-mode dropout is random: never cached
    return _per_sample(n, f)


def _maxpool(n: Node, f: _Facts) -> str:
    # the Indices output numbers elements across the whole batch: position-dependent
    return MIXED if len(n.outputs) > 1 and n.outputs[1] else _per_sample(n, f)


def _mvn(n: Node, f: _Facts) -> str:
    axes = n.attrs.get("axes", [0, 2, 3])
    return MIXED if 0 in {_axis(int(a), f.rank(n.inputs[0])) for a in axes} else _per_sample(n, f)


def _layernorm(n: Node, f: _Facts) -> str:
    if _axis(int(n.attrs.get("axis", -1)), f.rank(n.inputs[0])) == 0:
        return MIXED
    return _per_sample(n, f)


ELEMENTWISE = (
    "Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift Cast CastLike Ceil Celu Clip Cos Cosh Div Elu Equal Erf "
    "Exp Floor Gelu Greater GreaterOrEqual HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log "
    "Max Mean Min Mish Mod Mul Neg Not Or PRelu Pow Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus "
    "Softsign Sqrt Sub Sum Tan Tanh ThresholdedRelu Where Xor"
).split()
PER_SAMPLE = (
    "AveragePool Conv ConvTranspose DepthToSpace GlobalAveragePool GlobalLpPool GlobalMaxPool GroupNormalization "
    "InstanceNormalization LRN LpPool Resize SpaceToDepth Upsample"
).split()
REDUCE = (
    "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum "
    "ReduceSumSquare"
).split()

BATCH_RULES: dict[str, Callable[[Node, _Facts], str]] = {
    **{op: _elementwise for op in ELEMENTWISE},
    **{op: _per_sample for op in PER_SAMPLE},
    **{op: _axes_rule for op in REDUCE + ["Squeeze", "Unsqueeze"]},
    **{op: _on_axis(-1) for op in ("Softmax", "LogSoftmax", "Hardmax", "LpNormalization")},
    **{op: _on_axis(0) for op in ("ArgMax", "ArgMin")},
    "Flatten": _on_axis(1),
    "Concat": _on_axis(0),
    "Reshape": _shape_keeps_rows,
    "Transpose": _transpose,
    "Expand": _expand,
    "Tile": _tile,
    "Pad": _pad,
    "Slice": _slice,
    "Split": _split,
    "Gather": _gather,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "BatchNormalization": _batchnorm,
    "Dropout": _dropout,
    "MaxPool": _maxpool,
    "MeanVarianceNormalization": _mvn,
    "LayerNormalization": _layernorm,
}


# ---- the split ---------------------------------------------------------------------------------------------------
@dataclass
class Split:
    prefix: Graph  # the data inputs it reads -> the boundary values
    suffix: Graph  # the boundary values and the step's other inputs -> the step's outputs, in the same order
    boundary: list[str]
    prefix_nodes: int  # data-dependent nodes moved into the prefix
    total_nodes: int


def split_step(
    graph: Graph, data_inputs: Sequence[str], *, exclude: Collection[str] = ()
) -> tuple[Split | None, str]:
    """(the step cut after its frozen prefix, "") or (None, why there is nothing worth caching). Nodes that
    compute a value named in exclude (found to move rows, see FeatureCache.position_dependent) end the prefix."""
    first = graph.values[data_inputs[0]]
    if not first.is_static or not first.shape:
        return None, "the training program's batch is symbolic"
    batch = int(first.shape[0])
    f = _Facts(graph, batch)
    for name in data_inputs:
        info = graph.values[name]
        f.state[name] = ROW if info.is_static and info.shape and info.shape[0] == batch else MIXED
    consumers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                consumers.setdefault(i, []).append(n)
    in_prefix: list[Node] = []  # data-dependent, rows apart
    const_nodes: list[Node] = []
    stop = ""  # the first node the cut stops at, as users read it
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if any(i not in f.state for i in ins) or n.op_type in RANDOM or n.domain not in ("", "ai.onnx"):
            continue  # reads a parameter, the target, the learning rate or a value after the prefix
        if all(f.state[i] == CONST for i in ins):
            for o in n.outputs:
                if o:
                    f.state[o] = CONST
            const_nodes.append(n)
            continue
        if any(f.state[i] == MIXED for i in ins):
            continue
        rule = BATCH_RULES.get(n.op_type)
        try:
            st = rule(n, f) if rule is not None else MIXED
        except (IndexError, KeyError, TypeError, ValueError):  # a shape or constant the rule cannot read
            st = MIXED
        moves = any(o in exclude for o in n.outputs if o)
        if st == MIXED or moves:
            why = (
                "its results for a sample change with the sample's position in the batch"
                if moves
                else "no rule says it keeps samples apart"
                if rule is None
                else "it mixes the samples of a batch"
            )
            stop = stop or f"{n.label}: {why}"
            for o in n.outputs:
                if o:
                    f.state[o] = MIXED
            continue
        for o in n.outputs:
            if o:
                f.state[o] = ROW
        in_prefix.append(n)
    if not in_prefix:
        if stop:
            return None, f"nothing frozen can be cached from the first node on ({stop})"
        return None, "the first node that reads the input also reads a trained parameter (full fine-tuning)"
    if not any(n.op_type in HEAVY for n in in_prefix):
        ops = sorted({n.op_type for n in in_prefix})
        return None, f"the frozen part ({', '.join(ops)}) is too cheap to be worth caching"
    moved, constant = {id(n) for n in in_prefix}, {id(n) for n in const_nodes}
    rest = [n for n in graph.nodes if id(n) not in moved]
    read_later = {i for n in rest for i in n.inputs if i} | set(graph.outputs)
    boundary = [v for v in dict.fromkeys(o for n in in_prefix for o in n.outputs if o) if v in read_later]
    assert all(f.is_row(v) for v in boundary), boundary
    from ..passes import prune

    reads = {i for n in in_prefix for i in n.inputs if i}
    prefix = prune(
        graph.copy(
            nodes=[n for n in graph.nodes if id(n) in moved or id(n) in constant],
            inputs=[d for d in data_inputs if d in reads],
            outputs=boundary,
        )
    )
    suffix_inputs = [i for i in graph.inputs if i in read_later or i not in data_inputs]
    suffix = prune(graph.copy(nodes=rest, inputs=suffix_inputs + boundary))
    return Split(prefix, suffix, boundary, len(in_prefix), len(graph.nodes)), ""


# ---- the cache ---------------------------------------------------------------------------------------------------
def _digest(prefix: Graph) -> str:
    """What the prefix computes: its nodes, boundary and every constant's bytes (a program id names the structure
    only, and two artifacts of one structure can hold different frozen weights)."""
    h = hashlib.blake2b(digest_size=16)
    for n in prefix.nodes:
        h.update(f"{n.op_type}:{n.domain}:{n.inputs}>{n.outputs}:{sorted(n.attrs.items())!r}\n".encode())
    h.update(repr(prefix.outputs).encode())
    for name in sorted(prefix.initializers):
        a = np.ascontiguousarray(prefix.initializers[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


class FeatureRows:
    """The cached rows: per boundary value one growing slab [samples, ...], an index digest -> slab row, and room
    for `capacity` samples. `tag` names the program whose prefix made them: a session of that same program can
    take them over (a phone's next burst, on a new session of the same artifact)."""

    def __init__(self, tag: str, shapes: list[tuple[int, ...]], dtypes: list[np.dtype], max_bytes: int):
        self.tag = tag
        self.shapes, self.dtypes = shapes, dtypes
        self.row_bytes = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(shapes, dtypes))
        self.capacity = max(0, int(max_bytes) // max(1, self.row_bytes))
        self.checked = False  # the first batch's check that rows do not depend on their position
        self.clear()

    def clear(self) -> None:
        self.index: dict[bytes, int] = {}
        self.slabs = [np.empty((0,) + s, d) for s, d in zip(self.shapes, self.dtypes)]

    @property
    def samples(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slabs)

    def store(self, keys: list[bytes], where: list[int | None], values: list[np.ndarray]) -> None:
        """Keeps the rows of samples not cached yet, while there is room (no eviction: an epoch visits every
        sample once, so evicting would trade one miss for another)."""
        new: list[int] = []
        seen: set[bytes] = set()
        for i, (k, w) in enumerate(zip(keys, where)):
            if w is None and k not in seen and k not in self.index:
                seen.add(k)
                new.append(i)
        new = new[: max(0, self.capacity - len(self.index))]
        if not new:
            return
        start, end = len(self.index), len(self.index) + len(new)
        if end > self.slabs[0].shape[0]:  # grow geometrically, never past the capacity
            size = min(self.capacity, max(end, 2 * self.slabs[0].shape[0], 64))
            grown = []
            for slab in self.slabs:
                g = np.empty((size,) + slab.shape[1:], slab.dtype)
                g[: slab.shape[0]] = slab
                grown.append(g)
            self.slabs = grown
        rows = np.asarray(new, np.intp)
        for slab, v in zip(self.slabs, values):
            slab[start:end] = v[rows]
        for j, i in enumerate(new):
            self.index[keys[i]] = start + j


class FeatureCache:
    """A step through the cache: the boundary rows of a batch from FeatureRows when every sample is there, else
    from the prefix run on the batch (and kept); then the step program's outputs from the suffix."""

    def __init__(
        self,
        split: Split,
        *,
        tag: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        bind: Mapping[str, np.ndarray] | None = None,
        rows: FeatureRows | None = None,
    ):
        self.split = split
        self.prefix = Interpreter(split.prefix)
        self.suffix = Interpreter(
            split.suffix, bind=bind
        )  # bind: the step's outputs written into the caller's
        g = split.prefix
        shapes = [tuple(g.values[v].shape[1:]) for v in split.boundary]
        dtypes = [np.dtype(g.values[v].dtype) for v in split.boundary]
        tag = f"{tag}:{_digest(split.prefix)}"
        fits = rows is not None and rows.tag == tag and rows.shapes == shapes and rows.dtypes == dtypes
        self.rows = rows if fits else FeatureRows(tag, shapes, dtypes, max_bytes)
        self._batch_bufs = [np.empty(g.values[v].shape, d) for v, d in zip(split.boundary, dtypes)]
        self.hits = self.misses = 0

    def keys(self, data: Mapping[str, np.ndarray]) -> list[bytes]:
        """A digest of each sample's bytes (every input the prefix reads): equal samples share their rows, and a
        changed sample is a new one."""
        arrays = [np.ascontiguousarray(data[name]) for name in self.split.prefix.inputs]
        out = []
        for i in range(arrays[0].shape[0]):
            h = hashlib.blake2b(digest_size=16)
            for a in arrays:
                h.update(a[i].data)
            out.append(h.digest())
        return out

    def rows_independent(self, data: Mapping[str, np.ndarray]) -> bool:
        """The prefix on the batch and on the batch reversed give the same rows, bit for bit."""
        feeds = {k: data[k] for k in self.split.prefix.inputs}
        n = next(iter(feeds.values())).shape[0]
        if n < 2:
            return True
        flipped = {k: np.ascontiguousarray(v[::-1]) for k, v in feeds.items()}
        a, b = self.prefix.run(feeds), self.prefix.run(flipped)
        return all(np.array_equal(x[::-1], y, equal_nan=True) for x, y in zip(a, b))

    def position_dependent(self, data: Mapping[str, np.ndarray]) -> list[str]:
        """The prefix's values whose rows differ, bit for bit, between the batch and the batch reversed: where a
        sample's results depend on its position in the batch."""
        feeds = {k: data[k] for k in self.split.prefix.inputs}
        if next(iter(feeds.values())).shape[0] < 2:
            return []
        g = self.split.prefix
        rows = set(g.inputs)  # the values computed from the data (the others are constants)
        for n in g.nodes:
            if any(i in rows for i in n.inputs):
                rows.update(o for o in n.outputs if o)
        every = g.copy(outputs=list(dict.fromkeys(o for n in g.nodes for o in n.outputs if o in rows)))
        run = Interpreter(every, preallocate=False)
        flipped = {k: np.ascontiguousarray(v[::-1]) for k, v in feeds.items()}
        a, b = run.run(feeds), run.run(flipped)
        return [
            name
            for name, x, y in zip(every.outputs, a, b)
            if not np.array_equal(x[::-1], y, equal_nan=True)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The step program's outputs for feeds (the whole program's feeds)."""
        keys = self.keys(feeds)
        rows = self.rows
        where = [rows.index.get(k) for k in keys]
        if all(w is not None for w in where):
            idx = np.asarray(where, np.intp)
            for slab, buf in zip(rows.slabs, self._batch_bufs):
                np.take(slab, idx, axis=0, out=buf)
            values = self._batch_bufs
            self.hits += len(keys)
        else:
            values = self.prefix.run({k: feeds[k] for k in self.split.prefix.inputs})
            self.misses += len(
                keys
            )  # the whole batch went through the prefix (it runs at the program's batch)
            rows.store(keys, where, values)
        sfeeds = dict(zip(self.split.boundary, values))
        for name in self.split.suffix.inputs:
            if name not in sfeeds:
                sfeeds[name] = feeds[name]
        return self.suffix.run(sfeeds)

    def info(self) -> dict[str, Any]:
        return {
            "boundary": list(self.split.boundary),
            "prefix_nodes": self.split.prefix_nodes,
            "total_nodes": self.split.total_nodes,
            "row_bytes": self.rows.row_bytes,
            "capacity": self.rows.capacity,
            "samples": self.rows.samples,
            "bytes": self.rows.nbytes,
            "hits": self.hits,
            "misses": self.misses,
        }
