"""The building blocks of to_qdq's rewrite (numpy only): QdqBlocks, the state of one rewrite (the new graph in a
GraphBuilder, how each integer activation is quantized, what to count and remove) and the nodes the rewrite is made
of: DequantizeLinear of an input (one node per distinct dequantization, per channel along the axis the op's record
gives), QuantizeLinear back into the original integer value, the float op that replaces a node and new nodes named
after it in its scope. qdq_forms.py builds each form's rewrite from them, qdecompose.py walks the graph."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo
from edgetrain.core.ops import QParams

ADVICE = (
    "quantize the float model in the QDQ form instead: onnxruntime.quantization.quantize_static(..., "
    "quant_format=QuantFormat.QDQ)"
)
_INTEGER = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
_F32 = np.float32


@dataclass(frozen=True)
class _Quant:
    """How an integer activation is quantized: the names of its scale and zero point, its integer type."""

    scale: str
    zero_point: str
    dtype: np.dtype


class QdqBlocks:
    """The state of one rewrite into the QDQ form, and the nodes it is built from."""

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

    def _int_dtype(self, *names: str) -> np.dtype:
        """The integer type of the first of these values whose type is known (uint8 when none is)."""
        for name in names:
            if name in self.quant:
                return self.quant[name].dtype
            info = self.src.values.get(name) if name else None
            if info is not None and np.dtype(info.dtype) in _INTEGER:
                return np.dtype(info.dtype)
        return np.dtype(np.uint8)

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
