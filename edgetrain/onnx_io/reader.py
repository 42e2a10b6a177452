"""ONNX ModelProto -> edgetrain Graph (needs onnx): checked before anything is allocated from it, external data
read within bounds, local functions inlined, every node rewritten into the newest form of its op.

The rewrite (the "canonical" opset, at least 18) lets the interpreter, the autodiff and the emitted training graphs
see one semantics per op type; each op's record (edgetrain.core.ops) says below which version its node is
rewritten, and how (edgetrain.core.canonical).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgetrain.core.alternatives import explain, no_kernel_message
from edgetrain.core.errors import ModelError, ModelLimitError, UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo, about, toposort
from edgetrain.core.kernels import KERNELS
from edgetrain.core.ops import MICROSOFT_DOMAIN, record
from edgetrain.graph import passes
from edgetrain.graph.passes import check_size, contiguous, make_static, size_text

from .proto import external_data_helper as ext
from .proto import helper, numpy_helper, onnx, why
from .quantized import check_quantized
from .shapes import check_types, node_shapes

MIN_OPSET = 7
MAX_METADATA_CHARS = (
    16 << 20
)  # a model's metadata_props value kept (a parameter manifest); longer ones are dropped
CANONICAL_OPSET = 18  # every node is rewritten into its form at max(model opset, this)


def source_of(model: Any) -> str | None:
    """The file a model comes from, as the user named it (None for bytes or a ModelProto): errors name it."""
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else None


def load_model(
    model: str | os.PathLike | bytes | onnx.ModelProto, *, max_bytes: int | None = None
) -> onnx.ModelProto:
    """Reads a model from a path, bytes or a ModelProto; anything that is not ONNX is a ModelError. External data
    is read only from files inside the model's folder, and only after its declared size is checked against
    max_bytes (edgetrain.graph.passes.MAX_PARAMETER_BYTES by default)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_model_from_string(bytes(model))
        except Exception as e:
            raise ModelError(f"the bytes given are not an ONNX model ({why(e)})") from e
    elif not isinstance(model, (str, os.PathLike)):
        raise ModelError(f"a model is a file path, bytes or onnx.ModelProto, not {type(model).__name__}")
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelError(
                f"model file '{path}' does not exist"
                if not path.exists()
                else f"'{path}' is a directory, not an ONNX model file"
            )
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise ModelError(
                f"'{path}' is not an ONNX model: it does not parse as an ONNX ModelProto ({why(e)})"
            ) from e
        _load_external(proto, path, passes.MAX_PARAMETER_BYTES if max_bytes is None else max_bytes)
    if not proto.graph.node and not proto.graph.output:
        where = f"'{model}'" if isinstance(model, (str, os.PathLike)) else "the model given"
        raise ModelError(
            f"{where} is not an ONNX model: it parses, but holds no graph (an empty or foreign protobuf file?)"
        )
    return proto


def _load_external(proto: onnx.ModelProto, path: Path, max_bytes: int) -> None:
    """Reads the tensors the model keeps in external files, after checking each one: a file inside the model's
    folder, its offset and length inside that file, its length what the tensor's shape needs, all together
    within max_bytes."""
    tensors = [t for t in ext._get_all_tensors(proto) if ext.uses_external_data(t)]
    if not tensors:
        return
    folder = path.resolve().parent
    total = 0
    for t in tensors:
        what = f"tensor '{_text(t.name, 'a tensor name')}'"
        info = {_text(e.key, f"{what}: a key"): _text(e.value, f"{what}: a value") for e in t.external_data}
        location = info.get("location", "")
        try:
            target = (folder / location).resolve()
            inside = bool(location) and not os.path.isabs(location) and folder in target.parents
            exists = inside and target.is_file()
        except (OSError, ValueError):  # a NUL byte, a name too long for the file system
            inside = exists = False
        if not inside:
            raise ModelError(
                f"{what} keeps its data in {location[:200]!r}, which is not a file inside the model's folder "
                f"'{folder}'; edgetrain reads external data only from files next to the model"
            )
        if not exists:
            raise ModelError(f"{what} keeps its data in '{location}', which does not exist next to the model")
        try:
            offset, length = int(info.get("offset", 0)), info.get("length")
            length = None if length is None else int(length)
        except ValueError:
            raise ModelError(f"{what}: its external data offset or length is not a number ({info})") from None
        size = target.stat().st_size
        declared = _declared_bytes(t, what)
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelError(
                f"{what} reads bytes {offset} to {offset + length} of '{location}', which has {size} bytes"
            )
        if declared is not None and length != declared:
            raise ModelError(
                f"{what} declares {_shape_text(t)} ({declared} bytes) but its external data is {length} bytes"
            )
        total += length
        _check_total(total, max_bytes, what)
    try:
        ext.load_external_data_for_model(proto, str(folder))
    except Exception as e:
        raise ModelError(f"the model's external data cannot be read ({why(e)})") from e


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


# ---- validation of the protobuf, before anything is allocated from it -------------------------------------

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


def _np_dtype(elem_type: int, what: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise UnsupportedError(
            f"{what} has ONNX element type {elem_type} "
            f"({onnx.TensorProto.DataType.Name(elem_type) if elem_type else 'undefined'}), "
            "which numpy has no dtype for"
        ) from None


def _value_info(vi: onnx.ValueInfoProto, what: str = "value") -> TensorInfo:
    t = vi.type
    kind = t.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedError(
            f"value '{vi.name}' is a {kind}, not a tensor; edgetrain runs tensor graphs only"
            if kind
            else f"value '{vi.name}' has no type; declare it as a tensor (onnx.helper.make_tensor_value_info)"
        )
    tt = t.tensor_type
    dtype = _np_dtype(tt.elem_type, f"value '{vi.name}'")
    if not tt.HasField("shape"):
        return TensorInfo(dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    info = TensorInfo(dtype, dims)
    if all(isinstance(d, int) for d in dims):  # a static shape: bounded now, not when it is allocated
        check_size(info, f"{what} '{vi.name}'")
    return info


def _attr_value(a: onnx.AttributeProto, node_label: str, op_type: str = "", domain: str = "") -> Any:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        head = f"{node_label}: attribute '{a.name}' is a subgraph; control flow (If, Loop, Scan) is not supported"
        raise UnsupportedError(explain(head, op_type, domain))
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedError(f"{node_label}: sparse tensor attribute '{a.name}' is not supported")
    what = f"{node_label}: attribute '{a.name}'"
    try:
        v = helper.get_attribute_value(a)
    except Exception as e:  # an attribute type the protobuf allows and ONNX does not (UNDEFINED, ...)
        raise ModelError(f"{what} cannot be read ({why(e)}); the file is corrupt") from e
    if isinstance(v, list):
        return [_attr_item(x, what) for x in v]
    return _attr_item(v, what)


def _attr_item(v: Any, what: str) -> Any:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(
                f"{what} holds bytes that are not UTF-8 text ({v[:40]!r}); ONNX string attributes are UTF-8: "
                "the file is corrupt, or was written by a broken exporter"
            ) from None
    if isinstance(v, onnx.TensorProto):
        return _tensor_array(v, what)
    return v


def _tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """A tensor's values, after its data is checked against its declared shape (no allocation beyond it)."""
    _check_tensor(t, what)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise UnsupportedError(f"{what} cannot be read as a numpy array ({why(e)})") from e
    if tuple(arr.shape) != tuple(int(d) for d in t.dims):
        raise ModelError(f"{what} declares {_shape_text(t)} but reads as shape {list(arr.shape)}")
    return arr


def _opset_of(proto: onnx.ModelProto) -> int:
    if not proto.opset_import:
        raise ModelError(
            "the model imports no opset (its opset_import is empty), so the meaning of its ops is unknown; every "
            "ONNX model names its opset: re-export it, or add onnx.helper.make_opsetid('', N) to opset_import"
        )
    versions = {o.domain: o.version for o in proto.opset_import}
    opset = versions.get("", versions.get("ai.onnx"))
    if opset is None:
        raise UnsupportedError(
            "the model imports no version of the standard ONNX domain; edgetrain runs ai.onnx ops only"
        )
    if opset < 1:
        raise ModelError(f"the model imports opset {opset} of the standard ONNX domain; opsets start at 1")
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise UnsupportedError(
            f"the model uses opset {opset}, newer than the installed onnx knows ({newest}); "
            "upgrade the onnx package"
        )
    return opset


def _lift_old_opset(g: onnx.GraphProto, opset: int) -> int:
    """A model below opset 7 whose ops all mean the same at opset 7 (Not, Relu, ... unchanged since 1) is read
    as opset 7; one that uses an op whose semantics changed since is refused, naming it."""
    for n in g.node:
        if _since(n.op_type, opset) != _since(n.op_type, MIN_OPSET):
            raise UnsupportedError(
                f"the model uses opset {opset}, and node '{n.name or n.output[0]}' ({n.op_type}) has changed "
                f"since; edgetrain supports opsets {MIN_OPSET} to {onnx.defs.onnx_opset_version()}: upgrade it "
                f"with onnx.version_converter.convert_version(model, {CANONICAL_OPSET})"
            )
    return MIN_OPSET


def from_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, *, max_bytes: int | None = None) -> Graph:
    """Converts a model to a Graph in canonical form, shapes as declared (not yet static). The protobuf is
    checked first (names, definitions, tensor sizes, attribute types; see _check_graph): a malformed model is a
    ModelError naming the file and the node or tensor at fault, one whose initializers and constants declare
    more than max_bytes (edgetrain.graph.passes.MAX_PARAMETER_BYTES by default) a ModelLimitError."""
    limit = passes.MAX_PARAMETER_BYTES if max_bytes is None else int(max_bytes)
    with about(source_of(model)):
        return _from_proto(load_model(model, max_bytes=limit), limit)


def _from_proto(proto: onnx.ModelProto, max_bytes: int) -> Graph:
    if proto.functions:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            raise ModelError(f"the model's local functions cannot be inlined ({why(e)})") from e
    opset = _opset_of(proto)
    versions = {o.domain: int(o.version) for o in proto.opset_import}
    _check_graph(proto, opset, max_bytes)
    g = proto.graph
    if opset < MIN_OPSET:
        opset = _lift_old_opset(g, opset)
    initializers: dict[str, np.ndarray] = {}
    values: dict[str, TensorInfo] = {}
    for t in g.initializer:
        arr = _tensor_array(t, f"initializer '{t.name}'")
        initializers[t.name] = contiguous(arr)
        values[t.name] = TensorInfo(arr.dtype, tuple(int(d) for d in arr.shape))
    if g.sparse_initializer:
        raise UnsupportedError(f"sparse initializer '{g.sparse_initializer[0].values.name}' is not supported")
    inputs = []
    for vi in g.input:
        if vi.name in initializers:  # old exporters list weights as inputs too: they stay constants
            continue
        inputs.append(vi.name)
        values[vi.name] = _value_info(vi, "graph input")
    for vi in g.output:  # declared output types (symbolic dims kept): export writes them back
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type and vi.name not in values:
            values[vi.name] = _value_info(vi, "graph output")
    graph = Graph(
        nodes=[],
        inputs=inputs,
        outputs=[o.name for o in g.output],
        initializers=initializers,
        values=values,
        opset=max(opset, CANONICAL_OPSET),
        name=g.name or "graph",
    )
    b = GraphBuilder(graph)
    b.reserve((name for n in g.node for name in n.output), nodes=(n.name for n in g.node))
    seen_names: set[str] = set()
    for idx, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{idx}"
        if name in seen_names:
            name = f"{name}_{idx}"
        seen_names.add(name)
        label = f"node '{name}' ({n.op_type})"
        attrs = {a.name: _attr_value(a, label, n.op_type, n.domain) for a in n.attribute}
        node = Node(n.op_type, tuple(n.input), tuple(n.output), attrs, name, n.domain)
        scope = _scope(n)
        if scope:
            b.graph.scopes[name] = scope
        if n.domain not in ("", "ai.onnx"):
            _check_contrib(label, n.op_type, n.domain)
            b.graph.opsets.setdefault(n.domain, versions.get(n.domain, 1))
        _canonicalize(b, node, opset)
    graph = b.finish()
    check_quantized(graph)
    # ONNX lists nodes in topological order; a graph that does not is sorted, and a cycle is a ModelError
    graph.nodes = toposort(graph.nodes, available=set(graph.inputs) | set(graph.initializers))
    graph.metadata = {p.key: p.value for p in proto.metadata_props if len(p.value) <= MAX_METADATA_CHARS}
    return graph


def _check_contrib(label: str, op_type: str, domain: str) -> None:
    """A node outside the standard domain runs when edgetrain has its op's kernel in that domain (onnxruntime's
    quantized com.microsoft ops); any other is an UnsupportedError naming the node and what edgetrain runs there."""
    kern = KERNELS.get(op_type)
    if kern is not None and kern.domain == domain == MICROSOFT_DOMAIN:
        return
    theirs = sorted(op for op, k in KERNELS.items() if k.domain == domain == MICROSOFT_DOMAIN)
    quantized = op_type.startswith("Q") or "Quantize" in op_type or "Integer" in op_type
    # a quantized op edgetrain lacks: say which of them run (other ops keep the short message)
    if theirs and quantized:
        head = (
            f"{label} is in domain '{domain}', of which edgetrain runs only the quantized ops onnxruntime's "
            f"quantizer writes ({theirs[0]}, ..., {theirs[-1]}; or quantize in the QDQ format)"
        )
        raise UnsupportedError(explain(head, op_type, domain))
    raise UnsupportedError(no_kernel_message(label, op_type, domain))


def _scope(n: onnx.NodeProto) -> str:
    """The module path torch's dynamo exporter records in a node's metadata (its node names do not carry it):
    "['', 'layer4', 'layer4.0', 'layer4.0.conv1', 'conv2d_16']" -> '/layer4/layer4.0/layer4.0.conv1/conv2d_16'."""
    text = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
    if not text or not isinstance(text, str) or len(text) > 100_000:
        return ""
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return ""
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        return ""
    return "/" + "/".join(x for x in names if x)


def import_model(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    max_bytes: int | None = None,
) -> Graph:
    """ONNX model -> static, folded Graph ready for the interpreter (every value has a static shape).
    max_bytes bounds the model's initializers and folded constants (edgetrain.graph.passes.MAX_PARAMETER_BYTES)."""
    with about(source_of(model)):
        graph = from_onnx(model, max_bytes=max_bytes)
        static = make_static(
            graph, batch_size=batch_size, shapes=shapes, rule=node_shapes, max_bytes=max_bytes
        )
        check_types(static)
        return static


# ---- canonicalization: older op versions -> the newest form ------------------------------------------------


def _since(op_type: str, opset: int) -> int:
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except Exception:
        return opset  # unknown to onnx: the interpreter will report it as unsupported


def _canonicalize(b: GraphBuilder, node: Node, opset: int) -> None:
    op = node.op_type
    upgrade = record(op).upgrade
    if op == "Constant":
        value = _constant_value(node)
        b.graph.initializers[node.outputs[0]] = value
        b.graph.values[node.outputs[0]] = TensorInfo(value.dtype, tuple(value.shape))
        return
    if upgrade is not None:
        new_since, fn = upgrade
        if _since(op, opset) < new_since:
            result = fn(b, node)
            if result is None:
                return
            node = result
    b.graph.nodes.append(node)


def _constant_value(node: Node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return np.asarray(a["value"])
    for key, dtype in (
        ("value_float", "float32"),
        ("value_floats", "float32"),
        ("value_int", "int64"),
        ("value_ints", "int64"),
    ):
        if key in a:
            return np.asarray(a[key], dtype=dtype)
    for key in ("value_string", "value_strings"):
        if key in a:
            return np.asarray(a[key], dtype=object)
    raise UnsupportedError(
        f"{node.label} has no supported value attribute ({', '.join(a) or 'none'}); "
        "use 'value' or value_float(s)/value_int(s)"
    )
