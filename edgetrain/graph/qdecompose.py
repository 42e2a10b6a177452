"""An int8 graph in any of the forms onnxruntime's quantizer writes -> the same graph in the canonical QDQ form
(numpy only): to_qdq.

The canonical QDQ form, which quantization-aware training lowers: every integer activation (an int8, uint8, int16
or uint16 value that is not an initializer) is produced by a QuantizeLinear or DynamicQuantizeLinear node and read
only by DequantizeLinear nodes (or is a graph output); every other op computes on floats; integer weights stay
integer initializers, read through DequantizeLinear with their own scale and zero point (axis set when per
channel). check_qdq checks it; to_qdq brings two other forms into it:

- The QOperator form (quantize_static(..., quant_format=QuantFormat.QOperator)): each integer op becomes
  DequantizeLinear on each quantized input (its scale and zero point reused) -> the float op, same attributes ->
  QuantizeLinear with the op's output scale and zero point, producing the original output name. The int32 bias of
  QLinearConv and QGemm is dequantized with a new float32 scale initializer x_scale * w_scale ('<B>_scale', per
  channel when w_scale is) and an int32 zero point 0 ('<B>_zero_point'), as onnxruntime's QDQ form stores biases.
  The float op keeps the node's name; the nodes around it are named after it with a suffix.
- Integer tensors through ops that rearrange or select (the QOperator form writes MaxPool, Flatten, Reshape,
  Transpose, Slice... on uint8 tensors): the op runs on the dequantized value and a QuantizeLinear with its
  input's scale and zero point follows. Per-tensor quantization q = round(x / s) + z with s > 0 is a monotone
  increasing map applied to each element alone, so an op that only moves, copies or selects elements (Reshape,
  Transpose, Slice, Gather, nearest Resize, ...) or picks a maximum or minimum (MaxPool, ReduceMax) gives the same
  elements whether it runs before or after the map: dequantizing, running it in float and quantizing again with the
  same scale and zero point reproduces the integer result exactly (q -> (q - z) * s -> q is exact in float32).
- The dynamic form (quantize_dynamic): DynamicQuantizeLinear(x) -> MatMulInteger/ConvInteger(x_q, W, x_zp, w_zp)
  -> Cast(to float) -> Mul(., Mul(x_scale, w_scale)) becomes DynamicQuantizeLinear(x) -> DequantizeLinear(x_q,
  x_scale, x_zp) -> MatMul/Conv(., DequantizeLinear(W, w_scale, w_zp)), whose output takes the Mul's name; the
  Cast and the Muls go (the scale Mul only when nothing else reads it). com.microsoft's DynamicQuantizeMatMul and
  MatMulIntegerToFloat (onnxruntime's optimizer fuses the pattern into them) become the same, plus an Add of their
  bias.

Anything integer it cannot bring into the form is an UnsupportedError naming the node and its op, with the way
that works (quantizing the float model in the QDQ form). A graph already in the form comes back unchanged.

Supported:
- QOperator: QLinearConv, QLinearMatMul, com.microsoft QGemm (float output too), QLinearAdd, QLinearMul,
  QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool (channels_last when the input's rank is known),
  QLinearSoftmax (opset >= 13), QLinearConcat; per tensor and per channel, reduce_range or not.
- Through integers: MaxPool, ReduceMax, ReduceMin, Flatten, Reshape, Transpose, Squeeze,
  Unsqueeze, Identity, Slice, Split, Gather, GatherElements, GatherND, Expand, Tile, DepthToSpace, SpaceToDepth,
  Resize (mode nearest), Pad (any mode; a constant pad value is dequantized) and Concat (inputs of one
  quantization), all on per-tensor quantized inputs.
- Dynamic: MatMulInteger and ConvInteger in the pattern above (per tensor, or per channel along the weight's
  output axis), com.microsoft DynamicQuantizeMatMul and MatMulIntegerToFloat (per-tensor A).
- Not supported (UnsupportedError): com.microsoft ops edgetrain has no kernel for (QLinearAveragePool, ...),
  integer activations computed by any other op, integer products whose output is used otherwise than above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo
from edgetrain.core.ops import MICROSOFT_DOMAIN, QUANTIZED_OPS, QParams, record

ADVICE = (
    "quantize the float model in the QDQ form instead: onnxruntime.quantization.quantize_static(..., "
    "quant_format=QuantFormat.QDQ)"
)
_INTEGER = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
_F32 = np.float32
_PRODUCERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
_QDQ = _PRODUCERS | {"DequantizeLinear"}

# QOperator op -> the float op it computes
_FLOAT_OP = {
    "QLinearConv": "Conv",
    "QLinearMatMul": "MatMul",
    "QGemm": "Gemm",
    "QLinearAdd": "Add",
    "QLinearMul": "Mul",
    "QLinearSigmoid": "Sigmoid",
    "QLinearLeakyRelu": "LeakyRelu",
    "QLinearGlobalAveragePool": "GlobalAveragePool",
    "QLinearSoftmax": "Softmax",
    "QLinearConcat": "Concat",
}
# ops that commute with per-tensor quantization (see the module docstring) -> the inputs holding the data
_COMMUTING: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        "MaxPool ReduceMax ReduceMin Flatten Reshape Transpose Squeeze Unsqueeze Identity Slice "
        "Split Gather GatherElements GatherND Expand Tile DepthToSpace SpaceToDepth Resize Pad".split(),
        (0,),
    ),
    "Concat": None,  # every input
}
_DYNAMIC = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}


@dataclass(frozen=True)
class _Quant:
    """How an integer activation is quantized: the names of its scale and zero point, its integer type."""

    scale: str
    zero_point: str
    dtype: np.dtype


def to_qdq(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph in the canonical QDQ form (a new Graph; the input is not changed) and notes on what was
    rewritten, in plain words ([] when the graph was in the form already: then it comes back as it was).
    UnsupportedError names the node and op it cannot bring into the form."""
    rw = _Rewrite(graph)
    rw.run()
    if not rw.changed:
        check_qdq(graph)
        return graph.copy(), []
    out = rw.finish()
    out.verify()
    check_qdq(out)
    return out, rw.notes()


def check_qdq(graph: Graph) -> None:
    """UnsupportedError unless the graph is in the canonical QDQ form: no integer op but QuantizeLinear,
    DynamicQuantizeLinear and DequantizeLinear; their integer outputs read by DequantizeLinear only; every
    DequantizeLinear reads an initializer, a graph input or such an output."""
    uses = graph.consumers()
    producers = graph.producers()
    for node in graph.nodes:
        if node.op_type in QUANTIZED_OPS and node.op_type not in _QDQ:
            raise UnsupportedError(f"{node.label} computes on integers: it is not in the QDQ form; {ADVICE}")
        if node.op_type in _PRODUCERS:
            for k, o in enumerate(node.outputs):
                bad = [u for u in uses.get(o, []) if u.op_type != "DequantizeLinear"]
                if o and k != 1 and bad:  # DynamicQuantizeLinear's output 1 is its float scale
                    raise UnsupportedError(
                        f"{bad[0].label} reads the quantized tensor '{o}' of {node.label}; in the QDQ form only "
                        f"DequantizeLinear reads it; {ADVICE}"
                    )
        if node.op_type == "DequantizeLinear":
            x = node.inputs[0]
            p = producers.get(x)
            if p is not None and p.op_type not in _PRODUCERS:
                raise UnsupportedError(
                    f"{node.label} dequantizes '{x}', which {p.label} computes on integers; in the QDQ form a "
                    f"quantized tensor comes from QuantizeLinear or DynamicQuantizeLinear; {ADVICE}"
                )


class _Rewrite:
    """One pass over the nodes in order, building the new graph in a GraphBuilder."""

    def __init__(self, graph: Graph):
        self.src = graph
        self.b = GraphBuilder(graph)
        self.b.graph.nodes = []
        self.uses = graph.consumers()
        self.producer = graph.producers()
        self.quant: dict[str, _Quant] = {}  # integer activations (so far) -> how they are quantized
        self.dq_cache: dict[tuple[Any, ...], str] = {}
        self.skip: set[int] = set()  # ids of nodes a pattern took in
        self.maybe_dead: list[Node] = []  # scale Muls of the dynamic form: removed when nothing reads them
        self.gone: list[str] = []  # values that no longer exist
        self.counts: dict[str, Counter[str]] = {k: Counter() for k in ("qop", "commute", "dynamic", "fused")}
        self.biases = 0
        self.dropped_muls = 0

    @property
    def changed(self) -> bool:
        return any(self.counts.values())

    # ---- the walk -------------------------------------------------------------------------------------------
    def run(self) -> None:
        for node in self.src.nodes:
            if id(node) in self.skip:
                continue
            op = node.op_type
            if op in _FLOAT_OP:
                self._qoperator(node)
                self.counts["qop"][op] += 1
            elif op in _DYNAMIC:
                self._integer_product(node)
                self.counts["dynamic"][op] += 1
            elif op in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat") and node.domain == MICROSOFT_DOMAIN:
                self._fused_dynamic(node)
                self.counts["fused"][op] += 1
            elif op in _QDQ:
                self._keep_qdq(node)
            elif op in QUANTIZED_OPS or (node.domain == MICROSOFT_DOMAIN and op.startswith("QLinear")):
                raise UnsupportedError(
                    f"{node.label} computes on integers and edgetrain cannot rewrite it into the QDQ form; {ADVICE}"
                )
            elif op in _COMMUTING and any(i in self.quant for i in node.inputs):
                self._commute(node)
                self.counts["commute"][op] += 1
            else:
                self._keep(node)

    def _keep(self, node: Node) -> None:
        bad = next((i for i in node.inputs if i in self.quant), None)
        if bad is not None:
            raise UnsupportedError(
                f"{node.label} reads the quantized ({np.dtype(self.quant[bad].dtype).name}) tensor '{bad}': "
                f"{node.op_type} does not commute with quantization, so edgetrain cannot move it onto float "
                f"values (it moves only {', '.join(sorted(_COMMUTING))}); {ADVICE}"
            )
        self.b.graph.nodes.append(node)

    def _keep_qdq(self, node: Node) -> None:
        self.b.graph.nodes.append(node)
        if node.op_type == "QuantizeLinear":
            zp = _at(node, 2)
            self.quant[node.outputs[0]] = _Quant(node.inputs[1], zp, self._int_dtype(zp, node.outputs[0]))
        elif node.op_type == "DynamicQuantizeLinear":
            self.quant[node.outputs[0]] = _Quant(node.outputs[1], node.outputs[2], np.dtype(np.uint8))

    def _int_dtype(self, *names: str) -> np.dtype:
        """The integer type of the first of these values whose type is known (uint8 when none is)."""
        for name in names:
            if name in self.quant:
                return self.quant[name].dtype
            info = self.src.values.get(name) if name else None
            if info is not None and np.dtype(info.dtype) in _INTEGER:
                return np.dtype(info.dtype)
        return np.dtype(np.uint8)

    # ---- building blocks ------------------------------------------------------------------------------------
    def _rank(self, name: str) -> int | None:
        if name in self.src.initializers:
            return self.src.initializers[name].ndim
        info = self.b.graph.values.get(name)
        return None if info is None or info.shape is None else len(info.shape)

    def _shape(self, name: str) -> tuple[Any, ...] | None:
        info = self.b.graph.values.get(name)
        return None if info is None else info.shape

    def _float_dtype(self, name: str) -> np.dtype:
        info = self.b.graph.values.get(name)
        return (
            np.dtype(info.dtype) if info is not None and np.dtype(info.dtype).kind == "f" else np.dtype(_F32)
        )

    def _node(self, node: Node, op: str, inputs: Sequence[str], outputs: Sequence[str], attrs: dict) -> None:
        """The float op that replaces `node`: its name (so its scope), the default domain."""
        self.b.graph.nodes.append(Node(op, _trim(inputs), tuple(outputs), attrs, node.name))

    def _new(
        self,
        src: Node,
        suffix: str,
        op: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        *,
        attrs: dict | None = None,
        infos: Sequence[TensorInfo] | None = None,
    ) -> None:
        """A new node next to the float op replacing `src`: named after it with a suffix, in its scope."""
        self.b.add(
            op, _trim(inputs), attrs=attrs, outputs=list(outputs), name=f"{src.name}_{suffix}", infos=infos
        )
        scope = self.src.scopes.get(src.name)
        if scope:
            self.b.graph.scopes[self.b.graph.nodes[-1].name] = scope

    def _dq(self, src: Node, k: int, scale: str, zp: str, *, axis: int | None = None) -> str:
        """DequantizeLinear of src's input k (one node per distinct dequantization): its output's name."""
        value = src.inputs[k]
        key = (value, scale, zp, axis)
        if key in self.dq_cache:
            return self.dq_cache[key]
        consts = self.b.graph.initializers
        if axis is not None and zp in consts and consts[zp].size == 1:
            # a per-channel scale with one zero point: DequantizeLinear takes one per channel
            zp = self.b.initializer(f"{zp}_per_channel", np.full(consts[scale].shape, consts[zp].ravel()[0]))
        out = self.b.fresh(_stem(value) + "_dequantized")
        info = TensorInfo(self._float_dtype(scale), self._shape(value))
        attrs = {} if axis is None else {"axis": axis}
        self._new(src, f"dq{k}", "DequantizeLinear", [value, scale, zp], [out], attrs=attrs, infos=[info])
        self.dq_cache[key] = out
        return out

    def _q(self, src: Node, suffix: str, x: str, quant: _Quant, out: str) -> None:
        """QuantizeLinear(x) with quant's scale and zero point -> out (the original integer value's name)."""
        zp = quant.zero_point or self.b.initializer(f"{out}_zero_point", np.zeros((), quant.dtype))
        self._new(src, suffix, "QuantizeLinear", [x, quant.scale, zp], [out])
        self.quant[out] = _Quant(quant.scale, zp, quant.dtype)

    def _float_value(self, out: str, like: str) -> str:
        """A fresh name for the float value an op computes before it is quantized into `out`."""
        name = self.b.fresh(_stem(out) if _stem(out) != out else f"{out}_float")
        self.b.graph.values[name] = TensorInfo(self._float_dtype(like), self._shape(out))
        return name

    def _axis(self, node: Node, scale: str, value: str, rule: Any) -> int | None:
        """The axis a per-channel scale runs along (None per tensor), from the op record's rule."""
        arr = self.src.initializers.get(scale)
        if arr is None or arr.size <= 1:
            return None
        rank = self._rank(value)
        if rule is None or rank is None or arr.ndim != 1:
            raise UnsupportedError(
                f"{node.label}: the scale '{scale}' of '{value}' has {arr.size} values, and edgetrain cannot tell "
                f"the axis they run along (a per-channel scale is 1-D, of a tensor of known rank); {ADVICE}"
            )
        axis = rule if isinstance(rule, int) else rule(dict(node.attrs), rank)
        return int(axis) % rank

    def _dq_param(self, node: Node, p: QParams) -> str:
        """DequantizeLinear of the quantized input p of node, per channel when its scale is."""
        scale = node.inputs[p.scale]
        axis = self._axis(node, scale, node.inputs[p.value], p.axis)
        return self._dq(node, p.value, scale, _at(node, p.zero_point), axis=axis)

    # ---- the QOperator form ---------------------------------------------------------------------------------
    def _qoperator(self, node: Node) -> None:
        if node.op_type == "QLinearConcat":
            return self._qconcat(node)
        params = {p.value: p for p in record(node.op_type).quantized}
        out_p = params.pop(-1)
        taken = {k for p in (*params.values(), out_p) for k in (p.scale, p.zero_point) if k is not None}
        inputs = []
        for k, name in enumerate(node.inputs):
            if k in params and name:
                inputs.append(self._dq_param(node, params[k]))
            elif k not in taken:  # QLinearConv's B, QGemm's C
                inputs.append(self._bias(node, k, params) if name else name)
        out = node.outputs[0]
        if not _at(node, out_p.scale):  # QGemm with a float output
            return self._float_op(node, inputs, out)
        y = self._float_value(out, inputs[0])
        self._float_op(node, inputs, y)
        zp = _at(node, out_p.zero_point)
        # an omitted output zero point: QGemm's output is uint8, the others' have their input's type
        first = "" if node.op_type == "QGemm" else node.inputs[0]
        self._q(node, "q", y, _Quant(node.inputs[out_p.scale], zp, self._int_dtype(zp, out, first)), out)

    def _float_op(self, node: Node, inputs: list[str], y: str) -> None:
        op, a = _FLOAT_OP[node.op_type], dict(node.attrs)
        if op == "Gemm":
            a = {k: a[k] for k in ("alpha", "transA", "transB") if k in a}
            if len(_trim(inputs)) > 2 and float(a.get("alpha", 1.0)) != 1.0:
                a["beta"] = a["alpha"]  # QGemm scales its C by alpha too: y = alpha * (A B + C)
        elif op == "Softmax":
            if int(a.get("opset", 13)) < 13:
                raise UnsupportedError(
                    f"{node.label}: opset={a['opset']} (softmax over the flattened trailing axes) has no float "
                    f"op edgetrain writes; {ADVICE}"
                )
            a = {"axis": int(a.get("axis", -1))}
        elif op == "GlobalAveragePool" and a.pop("channels_last", 0):
            return self._channels_last_pool(node, inputs[0], y)
        self._node(node, op, inputs, [y], a)

    def _channels_last_pool(self, node: Node, x: str, y: str) -> None:
        """GlobalAveragePool over an [N, spatial..., C] input: Transpose to [N, C, spatial...] and back."""
        rank = self._rank(node.inputs[0])
        if rank is None:
            raise UnsupportedError(
                f"{node.label}: channels_last=1 needs the rank of its input '{node.inputs[0]}', which the graph "
                f"does not declare; declare its shape (value_info) or {ADVICE}"
            )
        first, pooled = self.b.fresh(f"{x}_nchw"), self.b.fresh(f"{y}_nchw")
        self._new(node, "nchw", "Transpose", [x], [first], attrs={"perm": [0, rank - 1, *range(1, rank - 1)]})
        self._node(node, "GlobalAveragePool", [first], [pooled], {})
        self._new(node, "nhwc", "Transpose", [pooled], [y], attrs={"perm": [0, *range(2, rank), 1]})

    def _bias(self, node: Node, k: int, params: dict[int, QParams]) -> str:
        """DequantizeLinear of the int32 bias at input k, with a new scale x_scale * w_scale and zero point 0."""
        bias = node.inputs[k]
        x, w = (params[i] for i in sorted(params)[:2])
        xs, ws = (self.src.initializers.get(node.inputs[p.scale]) for p in (x, w))
        if xs is None or ws is None:
            which = node.inputs[x.scale] if xs is None else node.inputs[w.scale]
            raise UnsupportedError(
                f"{node.label}: its int32 bias '{bias}' is dequantized with x_scale * w_scale, but the scale "
                f"'{which}' is computed at run time, not a constant; {ADVICE}"
            )
        scale = (np.asarray(xs, _F32).reshape(()) * np.asarray(ws, _F32)).astype(_F32)
        scale = scale.reshape(()) if scale.size == 1 else scale.ravel()
        rank = self._rank(bias)
        if scale.ndim and not rank:
            raise UnsupportedError(
                f"{node.label}: its bias '{bias}' has a per-channel scale but no known rank; {ADVICE}"
            )
        s = self.b.initializer(f"{bias}_scale", scale)
        z = self.b.initializer(f"{bias}_zero_point", np.zeros(scale.shape, np.int32))
        self.biases += 1
        return self._dq(node, k, s, z, axis=None if not scale.ndim else rank - 1)

    def _qconcat(self, node: Node) -> None:
        """QLinearConcat(Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...) -> Concat of the dequantized Xs."""
        parts = [
            self._dq(node, k, node.inputs[k + 1], _at(node, k + 2)) for k in range(2, len(node.inputs) - 2, 3)
        ]
        out = node.outputs[0]
        y = self._float_value(out, parts[0])
        self._node(node, "Concat", parts, [y], {"axis": int(node.attrs.get("axis", 0))})
        zp = _at(node, 1)
        self._q(node, "q", y, _Quant(node.inputs[0], zp, self._int_dtype(zp, out, _at(node, 2))), out)

    # ---- integer tensors through ops that commute with quantization -----------------------------------------
    def _commute(self, node: Node) -> None:
        data = _COMMUTING[node.op_type] or tuple(range(len(node.inputs)))
        where = [k for k, i in enumerate(node.inputs) if i in self.quant]
        quants = {self.quant[node.inputs[k]] for k in where}
        stray = [k for k in data if k < len(node.inputs) and node.inputs[k] and k not in where]
        if set(where) - set(data) or stray or len(quants) != 1:
            raise UnsupportedError(
                f"{node.label}: edgetrain moves {node.op_type} onto float values only when its data inputs are all "
                f"quantized alike, per tensor, and no other input is quantized; {ADVICE}"
            )
        quant = quants.pop()
        self._commute_check(node, quant)
        inputs = list(node.inputs)
        for k in where:
            inputs[k] = self._dq(node, k, quant.scale, quant.zero_point)
        if node.op_type == "Pad":
            inputs = self._pad_value(node, inputs, quant)
        outputs = list(node.outputs)
        quantized = range(len(outputs)) if node.op_type == "Split" else range(1)
        for k in quantized:
            if outputs[k]:
                outputs[k] = self._float_value(node.outputs[k], quant.scale)
        self._node(node, node.op_type, inputs, outputs, dict(node.attrs))
        for k in quantized:
            if node.outputs[k]:
                self._q(node, "q" if len(quantized) == 1 else f"q{k}", outputs[k], quant, node.outputs[k])

    def _commute_check(self, node: Node, quant: _Quant) -> None:
        scale = self.src.initializers.get(quant.scale)
        if scale is not None and scale.size != 1:
            raise UnsupportedError(
                f"{node.label}: its input is quantized per channel (scale '{quant.scale}'); edgetrain moves "
                f"{node.op_type} onto float values only for per-tensor quantization; {ADVICE}"
            )
        if node.op_type == "Resize" and node.attrs.get("mode", "nearest") != "nearest":
            raise UnsupportedError(
                f"{node.label}: Resize mode '{node.attrs['mode']}' interpolates, which does not commute with "
                f"quantization (only mode 'nearest' does); {ADVICE}"
            )

    def _pad_value(self, node: Node, inputs: list[str], quant: _Quant) -> list[str]:
        """A constant Pad of an integer tensor pads with an integer; in float it pads with its dequantized value."""
        if node.attrs.get("mode", "constant") != "constant":
            return inputs
        consts, value = self.src.initializers, _at(node, 2)
        scale = consts.get(quant.scale)
        zp = consts.get(quant.zero_point) if quant.zero_point else np.zeros((), np.int32)
        v = consts.get(value) if value else np.zeros((), np.int32)
        if scale is None or zp is None or v is None:
            raise UnsupportedError(
                f"{node.label}: its pad value, scale or zero point is computed at run time; edgetrain dequantizes "
                f"the pad value only when all three are constants; {ADVICE}"
            )
        level = np.asarray(v, np.int32).reshape(()) - np.asarray(zp, np.int32).reshape(())
        f = level.astype(_F32) * np.asarray(scale, _F32).reshape(())
        name = self.b.initializer(f"{node.name}_pad_value", np.asarray(f, self._float_dtype(quant.scale)))
        return [*inputs[:2], name, *inputs[3:]]

    # ---- the dynamic form -----------------------------------------------------------------------------------
    def _integer_product(self, node: Node) -> None:
        cast, mul, scales = self._dynamic_tail(node)
        x, w = node.inputs[0], node.inputs[1]
        xq = self.quant.get(x)
        if xq is None or xq.scale not in scales.inputs:
            raise self._no_pattern(
                node, f"its input '{x}' is not quantized by a DynamicQuantizeLinear whose scale the Mul reads"
            )
        w_scale = next((i for i in scales.inputs if i != xq.scale), "")
        if w_scale not in self.src.initializers:
            raise self._no_pattern(node, f"the weight scale '{w_scale}' the Mul reads is not a constant")
        # per channel: along the weight's output axis (Conv's M, MatMul's columns)
        axis = self._axis(node, w_scale, w, 0 if node.op_type == "ConvInteger" else -1)
        dx = self._dq(node, 0, xq.scale, _at(node, 2))
        dw = self._dq(node, 1, w_scale, _at(node, 3), axis=axis)
        self._node(node, _DYNAMIC[node.op_type], [dx, dw], [mul.outputs[0]], dict(node.attrs))
        self.skip.update((id(cast), id(mul)))
        self.maybe_dead.append(scales)
        self.gone += [node.outputs[0], cast.outputs[0]]

    def _dynamic_tail(self, node: Node) -> tuple[Node, Node, Node]:
        """The Cast, the Mul by the scales and the Mul computing them after an integer product, as onnxruntime's
        quantize_dynamic writes them."""
        cast = self._only_user(node, node.outputs[0], "Cast")
        if int(cast.attrs.get("to", 0)) != 1:
            raise self._no_pattern(node, f"{cast.label} casts to type {cast.attrs.get('to')}, not float")
        mul = self._only_user(node, cast.outputs[0], "Mul")
        other = next((i for i in mul.inputs if i != cast.outputs[0]), "")
        scales = self.producer.get(other)
        if scales is None or scales.op_type != "Mul":
            raise self._no_pattern(
                node, f"{mul.label} multiplies by '{other}', which no Mul(x_scale, w_scale) computes"
            )
        return cast, mul, scales

    def _only_user(self, node: Node, value: str, op: str) -> Node:
        users = self.uses.get(value, [])
        if value in self.src.outputs or len(users) != 1 or users[0].op_type != op:
            what = ", ".join(u.label for u in users) or "no node"
            raise self._no_pattern(
                node, f"'{value}' is read by {what}, where quantize_dynamic writes one {op}"
            )
        return users[0]

    @staticmethod
    def _no_pattern(node: Node, why: str) -> UnsupportedError:
        return UnsupportedError(
            f"{node.label} is not in the pattern onnxruntime's quantize_dynamic writes (DynamicQuantizeLinear -> "
            f"{node.op_type} -> Cast -> Mul by Mul(x_scale, w_scale)): {why}; edgetrain rewrites only that "
            f"pattern into the QDQ form; {ADVICE}"
        )

    def _fused_dynamic(self, node: Node) -> None:
        """DynamicQuantizeMatMul(A, B, b_scale, b_zp, bias) and MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp,
        b_zp, bias) -> [DynamicQuantizeLinear ->] DequantizeLinear -> MatMul (+ Add bias)."""
        params = {p.value: p for p in record(node.op_type).quantized}
        a, out = node.inputs[0], node.outputs[0]
        if node.op_type == "DynamicQuantizeMatMul":
            q, s, z = (self.b.fresh(f"{a}{sfx}") for sfx in ("_quantized", "_scale", "_zero_point"))
            u8 = np.dtype(np.uint8)
            infos = [TensorInfo(u8, self._shape(a)), TensorInfo(np.dtype(_F32), ()), TensorInfo(u8, ())]
            self._new(node, "quantize", "DynamicQuantizeLinear", [a], [q, s, z], infos=infos)
            self.quant[q] = _Quant(s, z, u8)
            da = self._dq(node.replace(inputs=(q, *node.inputs[1:])), 0, s, z)
        else:
            a_scale = self.src.initializers.get(node.inputs[2])
            if a_scale is not None and a_scale.size > 1:
                raise UnsupportedError(f"{node.label}: a per-row scale of A is not supported; {ADVICE}")
            da = self._dq(node, 0, node.inputs[2], _at(node, 4))
        bias = _at(node, 4 if node.op_type == "DynamicQuantizeMatMul" else 6)
        db = self._dq_param(node, params[1])
        y = self.b.fresh(f"{out}_matmul") if bias else out
        if bias:
            self.b.graph.values[y] = TensorInfo(np.dtype(_F32), self._shape(out))
        self._node(node, "MatMul", [da, db], [y], {})
        if bias:
            self._new(node, "bias", "Add", [y, bias], [out])

    # ---- the end --------------------------------------------------------------------------------------------
    def finish(self) -> Graph:
        g = self.b.finish()
        read = {i for n in g.nodes for i in n.inputs if i} | set(g.outputs)
        dead = {id(n) for n in self.maybe_dead if not any(o in read for o in n.outputs)}
        g.nodes = [n for n in g.nodes if id(n) not in dead]
        self.dropped_muls = len(dead)
        self.gone += [o for n in self.maybe_dead if id(n) in dead for o in n.outputs]
        for name in self.gone:
            g.values.pop(name, None)
        if all(n.domain != MICROSOFT_DOMAIN for n in g.nodes):
            g.opsets.pop(MICROSOFT_DOMAIN, None)
        return g

    def notes(self) -> list[str]:
        qop, commute, dyn, fused = (self.counts[k] for k in ("qop", "commute", "dynamic", "fused"))
        out = []
        if qop:
            out.append(
                f"rewrote {_count(qop)} nodes into DequantizeLinear -> float op -> QuantizeLinear (QOperator form)"
            )
        if self.biases:
            out.append(
                f"dequantized {self.biases} int32 bias{'es' if self.biases > 1 else ''} with new float32 scale "
                "initializers x_scale * w_scale ('<bias>_scale', int32 zero point 0), as onnxruntime's QDQ form "
                "stores biases"
            )
        if commute:
            out.append(
                f"moved {_count(commute)} nodes from integer onto float values: DequantizeLinear -> op -> "
                "QuantizeLinear with its input's scale and zero point (they commute with per-tensor quantization)"
            )
        if dyn:
            n = sum(dyn.values())
            out.append(
                f"rewrote {_count(dyn)} nodes (dynamic form) into DequantizeLinear -> MatMul/Conv of the "
                f"DynamicQuantizeLinear output and the dequantized weight; removed {n} Cast and "
                f"{n + self.dropped_muls} Mul nodes"
            )
        if fused:
            out.append(
                f"split {_count(fused)} nodes into [DynamicQuantizeLinear ->] DequantizeLinear -> MatMul "
                "(+ Add of the bias)"
            )
        return out


def _at(node: Node, k: int | None) -> str:
    """The name of input k ('' when omitted)."""
    return node.inputs[k] if k is not None and 0 <= k < len(node.inputs) else ""


def _trim(inputs: Sequence[str]) -> tuple[str, ...]:
    """Inputs without their trailing omitted ('') ones."""
    out = list(inputs)
    while out and not out[-1]:
        out.pop()
    return tuple(out)


def _stem(name: str) -> str:
    """A quantized value's name without onnxruntime's '_quantized' suffix."""
    return (
        name[: -len("_quantized")] if name.endswith("_quantized") and len(name) > len("_quantized") else name
    )


def _count(c: Counter[str]) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(c.items(), key=lambda t: (-t[1], t[0])))
