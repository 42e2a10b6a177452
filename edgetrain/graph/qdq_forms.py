"""Each form onnxruntime's quantizer writes, rewritten into QDQ (numpy only; qdecompose.py's docstring says how):
QdqForms, the QOperator form's integer ops (QLinearConv, QGemm, QLinearConcat, ...), integer tensors through ops
that commute with per-tensor quantization (MaxPool, Reshape, Pad, ...) and the dynamic form (MatMulInteger and
ConvInteger with their Cast and Muls, com.microsoft's DynamicQuantizeMatMul and MatMulIntegerToFloat)."""

from __future__ import annotations

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import QParams, record

from .qdq_blocks import _F32, ADVICE, QdqBlocks, _at, _Quant, _trim

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
# ops that commute with per-tensor quantization (see qdecompose.py's docstring) -> the inputs holding the data
_COMMUTING: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        "MaxPool ReduceMax ReduceMin Flatten Reshape Transpose Squeeze Unsqueeze Identity Slice "
        "Split Gather GatherElements GatherND Expand Tile DepthToSpace SpaceToDepth Resize Pad".split(),
        (0,),
    ),
    "Concat": None,  # every input
}
_DYNAMIC = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}


class QdqForms(QdqBlocks):
    """The rewrite of one node of each form, on the building blocks of QdqBlocks."""

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
