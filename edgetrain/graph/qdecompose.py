"""An int8 graph in any of the forms onnxruntime's quantizer writes -> the same graph in the canonical QDQ form
(numpy only): to_qdq. This module walks the graph; the rewrite's building blocks are in qdq_blocks.py, each
form's rewrite in qdq_forms.py.

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

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import MICROSOFT_DOMAIN, QUANTIZED_OPS

from .qdq_blocks import ADVICE, _at, _Quant
from .qdq_forms import _COMMUTING, _DYNAMIC, _FLOAT_OP, QdqForms

_PRODUCERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
_QDQ = _PRODUCERS | {"DequantizeLinear"}


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


class _Rewrite(QdqForms):
    """One pass over the nodes in order, building the new graph in a GraphBuilder."""

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


def _count(c: Counter[str]) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(c.items(), key=lambda t: (-t[1], t[0])))
