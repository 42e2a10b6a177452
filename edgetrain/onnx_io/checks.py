"""A ModelProto checked before anything is allocated from it (needs onnx): every name UTF-8 and defined once,
tensors whose data fits their declared type and shape (each within MAX_TENSOR_BYTES, all the constants within
max_bytes), graph inputs and outputs well declared, attributes of the types their op's schema says. A malformed
model is a ModelError naming the node or tensor at fault, one too large a ModelLimitError."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgetrain.core.errors import ModelError, ModelLimitError
from edgetrain.core.kernels import KERNELS
from edgetrain.graph import passes
from edgetrain.graph.passes import size_text

from .proto import helper, onnx


def _check_total(total: int, limit: int, what: str) -> None:
    if total > limit:
        raise ModelLimitError(
            f"the model's initializers and constants hold {size_text(total)} (as far as {what}), more than "
            f"the {size_text(limit)} edgetrain reads (edgetrain.graph.passes.MAX_PARAMETER_BYTES, or max_bytes=)",
            limit=limit,
            needed=total,
        )


def _text(value: Any, what: str) -> str:
    """A string field of the protobuf: protobuf hands invalid UTF-8 over as bytes, which no name may be."""
    if isinstance(value, bytes):
        raise ModelError(
            f"{what} is not UTF-8 text ({value[:40]!r}); ONNX names and strings are UTF-8: the file is corrupt, "
            "or was written by a broken exporter"
        )
    return value


_DATA_TYPES = {v for v in onnx.TensorProto.DataType.values() if v != onnx.TensorProto.UNDEFINED}
_PACKED_BITS = {
    getattr(onnx.TensorProto, n): bits
    for n, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(onnx.TensorProto, n)
}


def _type_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def _shape_text(t: onnx.TensorProto) -> str:
    dims = [str(d) for d in t.dims[:12]] + (["..."] if len(t.dims) > 12 else [])
    return f"{_type_name(t.data_type)}[{', '.join(dims)}]"


def _declared_bytes(t: onnx.TensorProto, what: str) -> int | None:
    """The bytes a tensor's dims and type declare (None for strings); ModelError for an unknown type or a
    negative dimension, ModelLimitError beyond MAX_TENSOR_BYTES."""
    if t.data_type not in _DATA_TYPES:
        raise ModelError(
            f"{what} has element type {t.data_type}, which is no ONNX type (TensorProto.DataType); "
            "the file is corrupt"
        )
    if t.data_type == onnx.TensorProto.STRING:
        return None
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise ModelError(f"{what} declares shape {dims}, with a negative dimension; the file is corrupt")
    n = span = 1
    for d in dims:
        n *= d
        span *= max(d, 1)  # numpy bounds the dimensions apart from a zero one too
    bits = _PACKED_BITS.get(t.data_type)
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    nbytes = (n * bits + 7) // 8 if bits else n * itemsize
    if max(nbytes, span * itemsize) > passes.MAX_TENSOR_BYTES:
        raise ModelLimitError(
            f"{what} declares {_shape_text(t)}: {size_text(max(nbytes, span * itemsize))}, more than the "
            f"{size_text(passes.MAX_TENSOR_BYTES)} edgetrain allows for one tensor "
            "(edgetrain.graph.passes.MAX_TENSOR_BYTES)",
            limit=passes.MAX_TENSOR_BYTES,
            needed=max(nbytes, span * itemsize),
        )
    return nbytes


def _check_tensor(t: onnx.TensorProto, what: str) -> int:
    """Checks a tensor's declared type and shape against the data it holds, before numpy reads it; returns its
    bytes."""
    declared = _declared_bytes(t, what)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelError(
            f"{what} lives in an external data file that was not loaded; "
            "load the model from its path, next to its data files"
        )
    n = 1
    for d in t.dims:
        n *= int(d)
    if t.HasField("raw_data"):
        if declared is None:
            raise ModelError(f"{what} is a string tensor with raw data; ONNX keeps strings in string_data")
        if len(t.raw_data) != declared:
            raise ModelError(
                f"{what} declares {_shape_text(t)} ({declared} bytes) but holds {len(t.raw_data)} bytes of "
                "raw data; the file is truncated or corrupt"
            )
        return declared
    field = helper.tensor_dtype_to_field(t.data_type)
    count = len(getattr(t, field))
    bits = _PACKED_BITS.get(t.data_type)
    complex_parts = 2 if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
    expected = (n * bits + 7) // 8 if bits else n * complex_parts
    if count != expected:
        raise ModelError(
            f"{what} declares {_shape_text(t)} ({n} values) but holds {count} in {field}; "
            "the file is truncated or corrupt"
        )
    if declared is None:
        return sum(len(x) for x in t.string_data)
    return declared


def _check_value_info(vi: onnx.ValueInfoProto, what: str) -> None:
    name = _text(vi.name, f"the name of a graph {what}")
    if not name:
        raise ModelError(f"a graph {what} has an empty name; every ONNX value has a name")
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        return  # _value_info says what it is
    tt = t.tensor_type
    if tt.elem_type not in _DATA_TYPES and (what == "input" or tt.elem_type):
        raise ModelError(
            f"graph {what} '{name}' has element type {tt.elem_type}, which is no ONNX type; the file is corrupt"
        )
    if tt.HasField("shape"):
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                raise ModelError(
                    f"graph {what} '{name}' declares dimension {k} as {d.dim_value}; a dimension is 0 or more, "
                    "or a symbol such as 'batch'"
                )
            _text(d.dim_param, f"a dimension name of graph {what} '{name}'")


def _check_graph(proto: onnx.ModelProto, opset: int, max_bytes: int) -> None:
    """The structure of the graph, before any of it is converted: every name UTF-8 and defined once, every
    name read defined by a node, an input or an initializer, every output defined, tensors whose data fits
    their declared shape, attributes of the types their op's schema says, the constants within max_bytes."""
    g = proto.graph
    for o in proto.opset_import:
        _text(o.domain, "an opset domain")
    _text(g.name, "the graph's name")
    if not g.output:
        raise ModelError(
            "the graph declares no outputs; edgetrain trains a model through its outputs: re-export it with them"
        )
    inputs: dict[str, int] = {}
    for k, vi in enumerate(g.input):
        _check_value_info(vi, "input")
        if vi.name in inputs:
            raise ModelError(f"graph input '{vi.name}' is declared twice (inputs {inputs[vi.name]} and {k})")
        inputs[vi.name] = k
    for vi in g.output:
        _check_value_info(vi, "output")
    defined: dict[str, str] = {}  # value name -> what defines it, for messages
    total = 0
    for k, t in enumerate(g.initializer):
        name = _text(t.name, f"the name of initializer {k}")
        if not name:
            raise ModelError(f"initializer {k} has an empty name; every ONNX value has a name")
        if name in defined:
            raise ModelError(
                f"initializer '{name}' is defined twice ({defined[name]} and initializer {k}); ONNX names are "
                "unique, and edgetrain will not guess which one the model means: re-export it"
            )
        defined[name] = f"initializer {k}"
        total += _check_tensor(t, f"initializer '{name}'")
        _check_total(total, max_bytes, f"initializer '{name}'")
    for name in inputs:
        defined.setdefault(name, "a graph input")
    for idx, n in enumerate(g.node):
        op = _text(n.op_type, f"the op type of node {idx}")
        domain = _text(n.domain, f"the domain of node {idx}")
        name = _text(n.name, f"the name of node {idx} ({op})")
        label = f"node '{name or (n.output[0] if n.output else idx)}' ({op})"
        for i in n.input:
            _text(i, f"an input name of {label}")
        for o in n.output:
            _text(o, f"an output name of {label}")
            if o and o in defined:
                raise ModelError(
                    f"{label} writes '{o}', which is already defined ({defined[o]}); ONNX values are defined once: "
                    "rename one of them"
                )
            if o:
                defined[o] = f"written by {label}"
        total += _check_attributes(n, label, op, domain, opset)
        _check_total(total, max_bytes, label)
    for n_idx, n in enumerate(g.node):
        for i in n.input:
            if i and i not in defined:
                label = f"node '{n.name or (n.output[0] if n.output else n_idx)}' ({n.op_type})"
                raise ModelError(
                    f"{label} reads '{i}', which no node, graph input or initializer defines; add it (as an "
                    "initializer or a graph input), or leave the input name empty if it is an optional input"
                )
    seen: set[str] = set()
    for vi in g.output:
        if vi.name in seen:
            raise ModelError(f"graph output '{vi.name}' is declared twice")
        seen.add(vi.name)
        if vi.name not in defined:
            raise ModelError(
                f"graph output '{vi.name}' is defined by no node, graph input or initializer; the outputs "
                f"the graph's nodes write are: {', '.join(list(_node_outputs(g))[:8]) or 'none'}"
            )


def _node_outputs(g: onnx.GraphProto) -> dict[str, None]:
    return dict.fromkeys(o for n in g.node for o in n.output if o)


_SCHEMA_TYPES = {int(v): v for v in onnx.AttributeProto.AttributeType.values()}


def _check_attributes(n: onnx.NodeProto, label: str, op: str, domain: str, opset: int) -> int:
    """Attribute names, strings and tensors of one node; types as the op's schema says. Returns the bytes of
    its tensor attributes (a Constant's value)."""
    schema = None
    if domain in ("", "ai.onnx") and op in KERNELS:  # an op edgetrain lacks is reported as such, later
        try:
            schema = onnx.defs.get_schema(op, max(opset, 1), "")
        except Exception:
            schema = None
    if schema is not None:
        single = onnx.defs.OpSchema.FormalParameterOption.Single
        for k, formal in enumerate(schema.inputs):
            given = n.input[k] if k < len(n.input) else ""
            if formal.option == single and not given:
                raise ModelError(
                    f"{label} gives no value for its input {k} ('{formal.name}'), which {op} requires (ONNX opset "
                    f"{schema.since_version}); connect it to a value"
                )
        if len(n.input) > schema.max_input:
            raise ModelError(
                f"{label} has {len(n.input)} inputs; {op} takes at most {schema.max_input} (ONNX opset "
                f"{schema.since_version})"
            )
    size = 0
    for a in n.attribute:
        aname = _text(a.name, f"an attribute name of {label}")
        what = f"{label}: attribute '{aname}'"
        if a.HasField("t"):
            size += _check_tensor(a.t, what)
        for t in a.tensors:
            size += _check_tensor(t, what)
        expected = schema.attributes.get(aname) if schema is not None else None
        if expected is not None and a.type != int(expected.type.value):
            want = _attr_type_name(int(expected.type.value))
            raise ModelError(
                f"{what} is of type {_attr_type_name(a.type)}, but {op}'s '{aname}' is {want} "
                f"(ONNX opset {schema.since_version}); the file is corrupt, or was written by a broken exporter"
            )
    return size


def _attr_type_name(t: int) -> str:
    try:
        return onnx.AttributeProto.AttributeType.Name(t)
    except ValueError:
        return str(t)
