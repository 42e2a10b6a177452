"""What onnx's schemas know about a node (needs onnx): node_shapes, the build side's shape rule (onnx's shape
inference one node at a time; edgetrain's fused ops by their records' own shape functions), and check_types, which
holds a graph to its ops' type constraints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import ModelError, ShapeError, UnsupportedError
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.kernels import KERNELS
from edgetrain.core.ops import PRIVATE_DOMAIN, record

from .proto import helper, numpy_helper, onnx, why


def check_types(graph: Graph) -> None:
    """Every value of an element type numpy has (an UnsupportedError for bfloat16, float8, int4, ...), and the
    inputs of every node that its op's schema binds to one type variable (Gemm's A, B and C are all T) have
    one element type: numpy would promote a float64 input times float32 weights silently, and the gradients
    would not fit the parameters. ModelError naming the node, the values and their types. Needs the values'
    dtypes: run it on a graph whose shapes are inferred."""
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    producers = graph.producers()
    for name, info in graph.values.items():
        if np.dtype(info.dtype).kind == "V":  # ml_dtypes' bfloat16, float8, int4: no numpy dtype on a device
            where = producers[name].label + " computes" if name in producers else "the model declares"
            raise UnsupportedError(
                f"{where} '{name}' as {np.dtype(info.dtype).name}, an element type edgetrain's numpy runtime "
                "cannot hold (it trains bool, integer and float16/32/64 tensors): export the model in float32"
            )
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, graph.opset, "")
        except Exception:
            continue
        variables = {tc.type_param_str for tc in schema.type_constraints}
        formals = list(schema.inputs)
        bound: dict[str, tuple[str, np.dtype]] = {}
        for k, name in enumerate(node.inputs):
            if k < len(formals):
                formal = formals[k]
            elif formals and formals[-1].option == variadic:
                formal = formals[-1]
            else:
                break
            info = graph.values.get(name) if name else None
            if info is None or formal.type_str not in variables or not formal.is_homogeneous:
                continue
            dtype = np.dtype(info.dtype)
            first = bound.setdefault(formal.type_str, (name, dtype))
            if first[1] != dtype:
                raise ModelError(
                    f"{node.label}: input '{name}' is {dtype.name} and input '{first[0]}' is {first[1].name}, but "
                    f"{node.op_type} takes them as one type ({formal.type_str}); cast one of them, or export the "
                    "model in one precision"
                )


def node_shapes(node: Node, args: Sequence[Any], opset: int) -> list[TensorInfo | None]:
    """The shape rule of the build side (edgetrain.graph.passes.ShapeRule): each output's TensorInfo by onnx's shape
    inference of the node's schema, from its inputs' types and shapes and the values of its small constant
    inputs (a Reshape's target, a Shape's result); the fused ops by their own rules. None for an output whose
    shape onnx cannot tell statically; ShapeError for a node onnx finds invalid."""
    if node.domain == PRIVATE_DOMAIN:  # edgetrain's own ops, by their records' shape functions
        infos = [
            None if a is None else a if isinstance(a, TensorInfo) else TensorInfo(a.dtype, a.shape)
            for a in args
        ]
        shape = (
            record(node.op_type).shape if node.op_type in KERNELS else None
        )  # KERNELS: every kernel registered
        got = list(shape(node, infos)) if shape is not None else []
        return got + [None] * (len(node.outputs) - len(got))
    unknown: list[TensorInfo | None] = [None] * len(node.outputs)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:
        return unknown
    names = [f"in{k}" if a is not None else "" for k, a in enumerate(args)]
    outs = [f"out{k}" if o else "" for k, o in enumerate(node.outputs)]
    try:
        proto = helper.make_node(node.op_type, names, outs, domain=node.domain)
        for key, value in node.attrs.items():
            proto.attribute.append(_schema_attribute(schema, key, value))
        types, data = {}, {}
        shape_pos = record(node.op_type).shape_inputs
        for k, a in enumerate(args):
            if a is None:
                continue
            info = a if isinstance(a, TensorInfo) else TensorInfo(a.dtype, a.shape)
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
            types[names[k]] = helper.make_tensor_type_proto(elem, [int(d) for d in info.shape])
            if isinstance(a, np.ndarray) and a.size <= 4096 and (k in shape_pos or a.dtype.kind in "iub"):
                data[names[k]] = numpy_helper.from_array(np.ascontiguousarray(a), names[k])
    except Exception:  # an attribute or dtype onnx cannot express: no rule for this node
        return unknown
    try:
        result = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, data, opset_imports=[helper.make_opsetid("", opset)]
        )
    except Exception as e:
        raise ShapeError(f"{node.label}: {why(e)}") from None
    return [_static_info(result.get(o)) if o else None for o in outs]


def _schema_attribute(schema, key: str, value: Any) -> onnx.AttributeProto:
    spec = schema.attributes.get(key)
    kind = int(spec.type.value) if spec is not None else None
    if isinstance(value, np.ndarray):
        value = numpy_helper.from_array(value)
    elif kind == onnx.AttributeProto.FLOAT:
        value = float(value)
    elif kind == onnx.AttributeProto.FLOATS:
        value = [float(v) for v in value]
    return helper.make_attribute(key, value, attr_type=kind)


def _static_info(t: onnx.TypeProto | None) -> TensorInfo | None:
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.elem_type:
        return None
    tt = t.tensor_type
    if not tt.HasField("shape") or not all(
        d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim
    ):
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except Exception:
        return None
    return TensorInfo(dtype, tuple(int(d.dim_value) for d in tt.shape.dim))
