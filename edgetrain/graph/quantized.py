"""Quantization-aware training of an int8 model (numpy only): the lowering that makes it trainable, and the way back.

`lower(graph)` takes the model as onnxruntime's quantizer wrote it (QDQ, QOperator or dynamic; the latter two are
first rewritten into QDQ by edgetrain.graph.qdecompose) and returns the graph that trains:
  - every integer weight read through a DequantizeLinear becomes a float **master weight**, named after the float
    tensor it was quantized from (`conv1.weight_quantized` -> `conv1.weight`), holding its dequantized value, read
    through FakeQuantize (QuantizeLinear -> DequantizeLinear as one op, with the model's scale, zero point and axis):
    the forward sees exactly the int8 grid the model has, the backward is the straight-through estimator;
  - an int32 bias becomes a float parameter (PyTorch's QAT keeps biases float too);
  - every QuantizeLinear -> DequantizeLinear pair on an activation (and DynamicQuantizeLinear -> DequantizeLinear)
    becomes one FakeQuantize with the model's scale and zero point, so gradients flow through it.
`refreeze(lowered, chosen)` puts back the int8 weight (and its DequantizeLinear) of every master that does not
train: frozen parts stay int8 in the graph, the artifact and memory, dequantized on the fly.
`requantize(...)` gives the trained masters back on the model's grid for the export, which is the model as it came
(same form, same nodes), with its integer weights replaced; `rederive=True` fits new scales to the trained weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN, QUANTIZED_OPS

F32 = np.float32
_QOPERATOR_HINT = "QLinear"
_DYNAMIC = {
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
}
_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}


@dataclass
class QuantWeight:
    """One trainable integer tensor of the model: its float master and where its integer form lives."""

    name: str  # the float master (a parameter of the training graph)
    source: str  # the integer initializer in the model as imported (and exported)
    scale: str  # its scale's initializer (in the lowered graph)
    zero_point: str  # its zero point's initializer ("" for an int32 bias)
    axis: int  # the axis a per-channel scale runs along
    kind: str  # "weight" (fake-quantized while training) or "bias" (int32, float while training)
    dtype: str  # the integer type's numpy name
    # a bias whose scale is input scale x weight scale (as the quantizer writes it): those two scales' names
    scale_from: list[str] = field(default_factory=list)
    # the integer tensor is the master transposed (a Gemm weight the dynamic quantizer stored as MatMul's); axis is
    # the master's
    transposed: bool = False
    # the integer range when narrower than the type's: onnxruntime's reduce_range (int8 -64..64, uint8 0..127)
    qmin: int | None = None
    qmax: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> QuantWeight:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Lowered:
    """An int8 model made trainable: the lowered graph, the model as imported (for the export), its form, the
    masters and the integer arrays they came from."""

    graph: Graph
    original: Graph
    form: str  # "qdq", "qoperator" or "dynamic"
    weights: list[QuantWeight]
    sources: dict[str, np.ndarray]  # source name -> its integer array
    notes: list[str]

    def header(self, trained: list[str]) -> tuple[dict, dict[str, np.ndarray]]:
        """What an artifact keeps to export the trained model in its own form: its form and the trained masters,
        and the scales and zero points they are requantized with."""
        kept = [w for w in self.weights if w.name in trained]
        names = {c for w in kept for c in (w.scale, w.zero_point, *w.scale_from) if c}
        consts = {c: self.graph.initializers[c] for c in sorted(names)}
        return {"form": self.form, "weights": [w.to_dict() for w in kept], "constants": sorted(names)}, consts


def quantized_form(graph: Graph) -> str | None:
    """ "qoperator", "dynamic", "qdq" (by the ops it holds), or None for a float model."""
    ops = {n.op_type for n in graph.nodes if n.op_type in QUANTIZED_OPS}
    if not ops:
        return None
    if any(op.startswith(_QOPERATOR_HINT) or op == "QGemm" for op in ops):
        return "qoperator"
    if ops & _DYNAMIC:
        return "dynamic"
    return "qdq"


def lower(graph: Graph) -> Lowered | None:
    """The int8 model made trainable (see the module docstring), or None for a float model."""
    form = quantized_form(graph)
    if form is None:
        return None
    notes: list[str] = []
    g = graph
    if form != "qdq":
        from edgetrain.graph.qdecompose import to_qdq  # only int8 models in the other two forms need it

        g, notes = to_qdq(graph)
    g = g.copy()
    weights, sources = _masters(g)
    narrow = _narrow_range(g, weights, sources)
    pairs = _fuse_pairs(g)
    g.nodes = [n for n in g.nodes if n is not None]
    _link_bias_scales(g, weights)
    notes.append(
        f"an int8 model ({_FORMS[form]}): {sum(w.kind == 'weight' for w in weights)} integer weight(s) and "
        f"{sum(w.kind == 'bias' for w in weights)} bias(es) train as float masters on the model's grid (fake "
        f"quantization, straight-through gradients); {pairs} activation quantization(s) kept; frozen weights stay "
        "int8; the export is int8 in the same form"
        + (f"; its weights use {narrow} (reduce_range), and keep to it while training" if narrow else "")
    )
    return Lowered(g, graph, form, weights, sources, notes)


_FORMS = {
    "qdq": "QDQ form",
    "qoperator": "QOperator form, trained as QDQ",
    "dynamic": "dynamic quantization, trained as QDQ",
}


def _master_name(g: Graph, source: str, fallback: str) -> str:
    base = source[: -len("_quantized")] if source.endswith("_quantized") else fallback
    if base in g.values or base in g.initializers:
        base = source + "_float"
    return base


def _masters(g: Graph) -> tuple[list[QuantWeight], dict[str, np.ndarray]]:
    """Every DequantizeLinear of an integer initializer becomes a master (g.nodes rewritten in place)."""
    weights: list[QuantWeight] = []
    sources: dict[str, np.ndarray] = {}
    by_source: dict[str, QuantWeight] = {}
    renames: dict[str, str] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        q = g.initializers.get(n.inputs[0]) if n.op_type == "DequantizeLinear" and n.inputs else None
        if q is None or (q.dtype != np.int32 and q.dtype not in _INTS):
            nodes.append(n)
            continue
        if n.attrs.get("block_size"):
            raise UnsupportedError(
                f"{n.label}: blocked quantization (block_size) does not train; quantize per tensor or per channel"
            )
        w = by_source.get(n.inputs[0]) or _new_master(g, n, q)
        if w is None:  # a scale computed at run time: not a weight
            nodes.append(n)
            continue
        if w.source not in by_source:
            weights.append(w)
            sources[w.source], by_source[w.source] = q, w
        if w.kind == "bias":
            renames[n.outputs[0]] = w.name
        elif w.transposed:  # the master holds the float tensor's own layout: read through a Transpose
            fq = w.name + "_fake_quantized"
            g.values[fq] = g.values[w.name]
            nodes.append(
                Node(
                    "FakeQuantize",
                    (w.name, w.scale, w.zero_point),
                    (fq,),
                    {"axis": w.axis},
                    n.name,
                    PRIVATE_DOMAIN,
                )
            )
            nodes.append(Node("Transpose", (fq,), n.outputs, {"perm": [1, 0]}, n.name + "_transpose"))
        else:
            nodes.append(
                Node(
                    "FakeQuantize",
                    (w.name, w.scale, w.zero_point),
                    n.outputs,
                    {"axis": w.axis},
                    n.name,
                    PRIVATE_DOMAIN,
                )
            )
    g.nodes = nodes
    for src in sources:
        g.initializers.pop(src, None)
        g.values.pop(src, None)
    _rename_inputs(g, renames)
    return weights, sources


_TRANSPOSED = "_Transposed_quantized"  # onnxruntime's dynamic quantizer stores a Gemm's weight transposed so


def _new_master(g: Graph, n: Node, q: np.ndarray) -> QuantWeight | None:
    """The float master of the integer initializer a DequantizeLinear reads (added to g), or None when its scale is
    computed at run time. A weight the quantizer stored transposed (`fc1.weight_Transposed_quantized`) gets its
    float tensor's name and layout (`fc1.weight`), read through a Transpose."""
    from edgetrain.core.kernels.quantized import dequantize_linear  # kernels: loaded when an int8 model is

    src, scale = n.inputs[0], n.inputs[1]
    zp = n.inputs[2] if len(n.inputs) > 2 else ""
    axis = int(n.attrs.get("axis", 1))
    s = g.initializers.get(scale)
    if s is None:
        return None
    if not zp and q.dtype != np.int32:
        zp = _zero_point_for(g, src, q.dtype)
    value = dequantize_linear(q, s, g.initializers.get(zp) if zp else None, axis=axis)
    kind = "bias" if q.dtype == np.int32 else "weight"
    transposed = kind == "weight" and q.ndim == 2 and src.endswith(_TRANSPOSED)
    if transposed:
        name = src[: -len(_TRANSPOSED)]
        master = name if name not in g.values and name not in g.initializers else src + "_float"
        value, axis = value.T, 1 - axis % 2
    else:
        master = _master_name(g, src, n.outputs[0] if kind == "bias" else src + "_float")
    g.initializers[master] = np.ascontiguousarray(value, dtype=F32)
    g.values[master] = TensorInfo(np.dtype(F32), tuple(value.shape))
    return QuantWeight(
        master, src, scale, zp if kind == "weight" else "", axis, kind, q.dtype.name, transposed=transposed
    )


_REDUCED = {np.dtype(np.int8): (-64, 64), np.dtype(np.uint8): (0, 127)}  # onnxruntime's reduce_range


def _narrow_range(g: Graph, weights: list[QuantWeight], sources: dict[str, np.ndarray]) -> str:
    """When every integer weight lies in onnxruntime's reduce_range (7 bits: a symmetric quantizer puts each
    tensor's largest weight at its range's end, so a model quantized with the full range has weights beyond it),
    the weights' fake quantizations keep to it (qmin/qmax), and so does the export. Returns what it said, or ""."""
    ws = [w for w in weights if w.kind == "weight"]
    if not ws or any(np.dtype(w.dtype) not in _REDUCED for w in ws):
        return ""
    for w in ws:
        lo, hi = _REDUCED[np.dtype(w.dtype)]
        q = sources[w.source]
        if q.size == 0 or q.min() < lo or q.max() > hi:
            return ""
    for w in ws:
        w.qmin, w.qmax = _REDUCED[np.dtype(w.dtype)]
    by_master = {w.name: w for w in ws}
    for k, n in enumerate(g.nodes):
        w = by_master.get(n.inputs[0]) if n.op_type == "FakeQuantize" else None
        if w is not None:
            g.nodes[k] = n.replace(attrs={**n.attrs, "qmin": w.qmin, "qmax": w.qmax})
    kinds = sorted({f"{w.dtype} {w.qmin}..{w.qmax}" for w in ws})
    return ", ".join(kinds)


def _zero_point_for(g: Graph, src: str, dtype: np.dtype) -> str:
    name = src + "_zero_point"
    while name in g.values or name in g.initializers:
        name += "_"
    g.initializers[name] = np.zeros((), dtype)
    g.values[name] = TensorInfo(np.dtype(dtype), ())
    return name


def _rename_inputs(g: Graph, renames: dict[str, str]) -> None:
    renames = {k: v for k, v in renames.items() if k != v}
    if not renames:
        return
    for k, n in enumerate(g.nodes):
        if n is not None and any(i in renames for i in n.inputs):
            g.nodes[k] = n.replace(inputs=tuple(renames.get(i, i) for i in n.inputs))
    g.outputs = [renames.get(o, o) for o in g.outputs]
    for old in renames:
        g.values.pop(old, None)


def _same_param(g: Graph, a: str, b: str) -> bool:
    if a == b:
        return True
    va, vb = g.initializers.get(a), g.initializers.get(b)
    return va is not None and vb is not None and va.dtype == vb.dtype and np.array_equal(va, vb)


def _fuse_pairs(g: Graph) -> int:
    """Each QuantizeLinear (or DynamicQuantizeLinear) -> DequantizeLinear on one value becomes FakeQuantize (in
    place on g.nodes; a quantizer whose integer output nothing else reads goes). Returns how many."""
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(g.nodes):
        for i in n.inputs if n is not None else ():
            readers.setdefault(i, []).append(k)
    fused = 0
    for k, q in enumerate(list(g.nodes)):
        if q is None or q.op_type not in ("QuantizeLinear", "DynamicQuantizeLinear"):
            continue
        dynamic = q.op_type == "DynamicQuantizeLinear"
        x, y = q.inputs[0], q.outputs[0]
        scale, zp = (
            (q.outputs[1], q.outputs[2])
            if dynamic
            else (q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else "")
        )
        if not zp:
            continue  # a default (uint8) zero point: left as it is
        axis = int(q.attrs.get("axis", 1))
        left = 0
        for r in readers.get(y, []):
            d = g.nodes[r]
            ok = (
                d is not None
                and d.op_type == "DequantizeLinear"
                and d.inputs[0] == y
                and len(d.inputs) > 2
                and _same_param(g, d.inputs[1], scale)
                and _same_param(g, d.inputs[2], zp)
                and int(d.attrs.get("axis", 1)) == axis
            )
            if not ok:
                left += 1
                continue
            g.nodes[r] = Node(
                "FakeQuantize", (x, scale, zp), d.outputs, {"axis": axis}, d.name, PRIVATE_DOMAIN
            )
            fused += 1
        if not left and y not in g.outputs and not dynamic:
            g.nodes[k] = None  # type: ignore[call-overload]
            g.values.pop(y, None)
    return fused


def _link_bias_scales(g: Graph, weights: list[QuantWeight]) -> None:
    """A bias whose scale is its op's input scale x weight scale (the quantizer's rule) records those two, so that
    new weight scales (requantize with rederive) give it a new scale too."""
    producers = g.producers()
    readers = g.consumers()
    for w in weights:
        if w.kind != "bias":
            continue
        for op in readers.get(w.name, []):
            if (
                op.op_type not in ("Conv", "Gemm", "ConvTranspose")
                or len(op.inputs) < 3
                or op.inputs[2] != w.name
            ):
                continue
            fx, fw = producers.get(op.inputs[0]), producers.get(op.inputs[1])
            if fx is None or fw is None or fx.op_type != "FakeQuantize" or fw.op_type != "FakeQuantize":
                continue
            xs, ws, bs = (g.initializers.get(v) for v in (fx.inputs[1], fw.inputs[1], w.scale))
            if xs is None or ws is None or bs is None:
                continue
            if np.allclose(np.ravel(bs), np.ravel(xs.astype(F32) * ws.astype(F32)), rtol=1e-6, atol=0):
                w.scale_from = [fx.inputs[1], fw.inputs[1]]


def refreeze(low: Lowered, graph: Graph, trained: set[str]) -> Graph:
    """graph (lowered) with every master that does not train put back as its integer initializer read through a
    DequantizeLinear: frozen weights stay int8."""
    frozen = [w for w in low.weights if w.name not in trained]
    if not frozen:
        return _just_in_time(graph)
    g = graph.copy()
    by_name = {w.name: w for w in frozen}
    transposes = {n.inputs[0]: k for k, n in enumerate(g.nodes) if n.op_type == "Transpose"}
    for k, n in enumerate(g.nodes):
        w = by_name.get(n.inputs[0]) if n.op_type == "FakeQuantize" else None
        if w is None or w.kind != "weight":
            continue
        axis = 1 - w.axis if w.transposed else w.axis
        g.nodes[k] = Node(
            "DequantizeLinear", (w.source, w.scale, w.zero_point), n.outputs, {"axis": axis}, n.name
        )
        if w.transposed:  # the integer tensor has the layout the Transpose made: it goes
            t = g.nodes[transposes[n.outputs[0]]]
            g.nodes[transposes[n.outputs[0]]] = Node("Identity", t.inputs, t.outputs, {}, t.name)
    for w in frozen:
        q = low.sources[w.source]
        g.initializers.pop(w.name, None)
        g.initializers[w.source] = q
        g.values[w.source] = TensorInfo(q.dtype, tuple(q.shape))
        if w.kind == "bias":  # read under the master's name, now computed
            g.nodes.insert(
                0, Node("DequantizeLinear", (w.source, w.scale), (w.name,), {"axis": w.axis}, w.name + "_dq")
            )
    return _just_in_time(g)


def _just_in_time(graph: Graph) -> Graph:
    """graph with each node that reads constants alone (a weight's DequantizeLinear or FakeQuantize, and what
    rearranges it) moved to just before its first reader: the quantizer writes every weight's DequantizeLinear
    first, and run in that order the float weights would all be alive at once (MobileNetV2's arena 3.9 -> 12.8 MB)."""
    consts = set(graph.initializers)
    early, rest = [], []
    for n in graph.nodes:
        if n.inputs and all(not i or i in consts for i in n.inputs):
            early.append(n)
            consts.update(o for o in n.outputs if o)
        else:
            rest.append(n)
    if not early:
        return graph
    waiting = {o: n for n in early for o in n.outputs if o}  # a moved node by the values it makes
    placed: set[int] = set()
    nodes: list[Node] = []

    def place(value: str) -> None:
        n = waiting.get(value)
        if n is None or id(n) in placed:
            return
        placed.add(id(n))
        for i in n.inputs:  # what it reads from other moved nodes, first
            place(i)
        nodes.append(n)

    for n in rest:
        for i in n.inputs:
            if i in waiting:
                place(i)
        nodes.append(n)
    nodes += [n for n in early if id(n) not in placed]  # read by nothing (kept in place for the outputs)
    return graph.copy(nodes=nodes)


def _fit_scale(w: np.ndarray, axis: int, per_channel: bool, dtype: np.dtype, symmetric: bool, qw=None):
    """onnxruntime's quantizer's weight scale and zero point for w (its compute_scale_zp): symmetric over
    [-max |w|, max |w|] onto -127..127 (int8; -64..64 with reduce_range), else over [min(w, 0), max(w, 0)] onto the
    type's range (0..127 for uint8 with reduce_range)."""
    info = np.iinfo(dtype)
    if qw is not None and qw.qmin is not None:
        qmin, qmax = qw.qmin, qw.qmax
    elif symmetric:
        qmin, qmax = -info.max, info.max
    else:
        qmin, qmax = info.min, info.max
    red = tuple(a for a in range(w.ndim) if a != axis % w.ndim) if per_channel else None
    lo = np.minimum(np.min(w, axis=red), 0).astype(F32)
    hi = np.maximum(np.max(w, axis=red), 0).astype(F32)
    if symmetric:
        amax = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -amax, amax
    span = F32(qmax - qmin)
    scale = np.where(hi > lo, (hi - lo) / span, F32(1)).astype(F32)
    if symmetric:
        return scale, np.zeros(np.shape(scale), dtype)
    zp = np.clip(np.rint(F32(qmin) - lo / scale), qmin, qmax).astype(dtype)
    return scale, zp


def requantize(
    weights: list[QuantWeight],
    values: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    *,
    rederive: bool = False,
) -> dict[str, np.ndarray]:
    """The initializers to put into the model as imported: each trained master on its integer grid (the model's
    scales, or with rederive new ones fitted to it, written under the scales' names too). consts holds the lowered
    graph's scales and zero points."""
    from edgetrain.core.kernels.quantized import quantize_linear  # kernels: loaded when an int8 model exports

    out: dict[str, np.ndarray] = {}
    scales = dict(consts)
    for w in weights:
        if w.kind != "weight":
            continue
        s, z = consts[w.scale], consts[w.zero_point]
        if rederive:
            symmetric = np.dtype(w.dtype).kind == "i" and not np.any(z)
            s, z = _fit_scale(values[w.name], w.axis, np.size(s) > 1, np.dtype(w.dtype), symmetric, w)
            s, z = s.reshape(np.shape(consts[w.scale])), z.reshape(np.shape(consts[w.zero_point]))
            out[w.scale], out[w.zero_point] = s, z
            scales[w.scale] = s
        q = quantize_linear(values[w.name], s, z, axis=w.axis)
        if w.qmin is not None:
            q = np.clip(q, w.qmin, w.qmax).astype(q.dtype)
        out[w.source] = np.ascontiguousarray(q.T) if w.transposed else q
    for w in weights:
        if w.kind != "bias":
            continue
        s = consts[w.scale]
        if rederive and w.scale_from:
            s = (scales[w.scale_from[0]].astype(F32) * scales[w.scale_from[1]].astype(F32)).reshape(
                np.shape(s)
            )
            out[w.scale] = s
        b = values[w.name].astype(np.float64) / np.asarray(s, np.float64).reshape(
            -1 if np.size(s) > 1 else ()
        )
        info = np.iinfo(np.int32)
        out[w.source] = np.clip(np.rint(b), info.min, info.max).astype(np.int32)
    return out


def dequantized(graph: Graph) -> Graph:
    """The lowered graph as a float model, for `export --float`: every fake quantization of a weight gone (the
    float weight read instead), every DequantizeLinear of a constant folded to float, and every fake quantization
    of an activation gone but those whose range starts at 0, which become the Relu onnxruntime's quantizer folded
    into them."""
    from edgetrain.core.kernels.quantized import (
        dequantize_linear,
    )  # kernels: loaded when an int8 model exports

    g = graph.copy()
    renames: dict[str, str] = {}
    nodes = []
    for n in g.nodes:
        if n.op_type == "FakeQuantize" and n.domain == PRIVATE_DOMAIN:
            if _clips_negatives(g, n):
                nodes.append(Node("Relu", n.inputs[:1], n.outputs, {}, n.name))
            elif n.outputs[0] in g.outputs:  # an output keeps its name
                nodes.append(Node("Identity", n.inputs[:1], n.outputs, {}, n.name))
            else:
                renames[n.outputs[0]] = renames.get(n.inputs[0], n.inputs[0])
            continue
        if n.op_type == "DequantizeLinear" and all(not i or i in g.initializers for i in n.inputs):
            args = [g.initializers[i] if i else None for i in n.inputs]
            g.initializers[n.outputs[0]] = dequantize_linear(*args, axis=int(n.attrs.get("axis", 1)))
            continue
        nodes.append(n)
    g.nodes = nodes
    _rename_inputs(g, renames)
    used = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
    g.initializers = {k: v for k, v in g.initializers.items() if k in used}
    return g


def _clips_negatives(g: Graph, n: Node) -> bool:
    """A per-tensor fake quantization of an activation whose range starts at 0 (zero point at the integer type's
    least value): it clips negatives as the Relu the quantizer folded into it did."""
    x, scale, zp = n.inputs[:3]
    s, z = g.initializers.get(scale), g.initializers.get(zp)
    if x in g.initializers or s is None or z is None or s.size != 1:
        return False
    return int(np.ravel(z)[0]) == int(np.iinfo(z.dtype).min)
