"""ONNX ModelProto -> edgetrain Graph (and back): the only module besides the export edges that imports onnx.

Import rewrites every node into the newest form of its op (the "canonical" opset, at least 18), so the
interpreter, the autodiff and the emitted training graphs see one semantics per op type; each op's record
(edgetrain.ops) says below which version its node is rewritten, and how (edgetrain.canonical).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .alternatives import explain, no_kernel_message
from .errors import ModelError, UnsupportedError
from .ir import Graph, GraphBuilder, Node, TensorInfo
from .ops import record
from .passes import contiguous, make_static
from .runtime.kernels.registry import PRIVATE_DOMAIN

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError as _e:  # pragma: no cover - exercised by the numpy-only test
    raise ImportError(
        "edgetrain's ONNX import/export needs the onnx package: pip install 'edgetrain[convert]'"
    ) from _e

MIN_OPSET = 7
CANONICAL_OPSET = 18  # every node is rewritten into its form at max(model opset, this)


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Reads a model from a path, bytes or a ModelProto; anything that is not ONNX is a ModelError."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        try:
            return onnx.load_model_from_string(model)
        except Exception as e:
            raise ModelError(f"the bytes given are not an ONNX model ({type(e).__name__}: {e})") from e
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(f"a model is a file path, bytes or onnx.ModelProto, not {type(model).__name__}")
    path = Path(model)
    if not path.is_file():
        raise ModelError(
            f"model file '{path}' does not exist"
            if not path.exists()
            else f"'{path}' is a directory, not an ONNX model file"
        )
    try:
        proto = onnx.load(str(path))
    except Exception as e:
        raise ModelError(
            f"'{path}' is not an ONNX model: it does not parse as an ONNX ModelProto "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})"
        ) from e
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(
            f"'{path}' is not an ONNX model: it parses, but holds no graph "
            "(an empty or foreign protobuf file?)"
        )
    return proto


def _np_dtype(elem_type: int, what: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise UnsupportedError(
            f"{what} has ONNX element type {elem_type} "
            f"({onnx.TensorProto.DataType.Name(elem_type) if elem_type else 'undefined'}), "
            "which numpy has no dtype for"
        ) from None


def _value_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise UnsupportedError(
            f"value '{vi.name}' is a {t.WhichOneof('value')}, not a tensor; edgetrain runs tensor graphs only"
        )
    tt = t.tensor_type
    dtype = _np_dtype(tt.elem_type, f"value '{vi.name}'")
    if not tt.HasField("shape"):
        return TensorInfo(dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return TensorInfo(dtype, dims)


def _attr_value(a: onnx.AttributeProto, node_label: str, op_type: str = "", domain: str = "") -> Any:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        head = f"{node_label}: attribute '{a.name}' is a subgraph; control flow (If, Loop, Scan) is not supported"
        raise UnsupportedError(explain(head, op_type, domain))
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedError(f"{node_label}: sparse tensor attribute '{a.name}' is not supported")
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [
            x.decode("utf-8")
            if isinstance(x, bytes)
            else numpy_helper.to_array(x)
            if isinstance(x, onnx.TensorProto)
            else x
            for x in v
        ]
    return v


def _opset_of(proto: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    opset = versions.get("", versions.get("ai.onnx"))
    if opset is None:
        opset = 1 if not proto.opset_import else None
    if opset is None:
        raise UnsupportedError(
            "the model imports no version of the standard ONNX domain; edgetrain runs ai.onnx ops only"
        )
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


def from_onnx(model: str | os.PathLike | bytes | onnx.ModelProto) -> Graph:
    """Converts a model to a Graph in canonical form, shapes as declared (not yet static)."""
    proto = load_model(model)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    opset = _opset_of(proto)
    g = proto.graph
    if opset < MIN_OPSET:
        opset = _lift_old_opset(g, opset)
    initializers: dict[str, np.ndarray] = {}
    values: dict[str, TensorInfo] = {}
    for t in g.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(
                f"initializer '{t.name}' lives in an external data file that was not loaded; "
                "load the model from its path, next to its data files"
            )
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:
            raise UnsupportedError(f"initializer '{t.name}' cannot be read as a numpy array: {e}") from e
        initializers[t.name] = contiguous(arr)
        values[t.name] = TensorInfo(arr.dtype, tuple(int(d) for d in arr.shape))
    if g.sparse_initializer:
        raise UnsupportedError(f"sparse initializer '{g.sparse_initializer[0].values.name}' is not supported")
    inputs = []
    for vi in g.input:
        if vi.name in initializers:  # old exporters list weights as inputs too: they stay constants
            continue
        inputs.append(vi.name)
        values[vi.name] = _value_info(vi)
    for vi in g.output:  # declared output types (symbolic dims kept): export writes them back
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type and vi.name not in values:
            values[vi.name] = _value_info(vi)
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
            raise UnsupportedError(no_kernel_message(label, n.op_type, n.domain))
        _canonicalize(b, node, opset)
    return b.finish()


def _scope(n: onnx.NodeProto) -> str:
    """The module path torch's dynamo exporter records in a node's metadata (its node names do not carry it):
    "['', 'layer4', 'layer4.0', 'layer4.0.conv1', 'conv2d_16']" -> '/layer4/layer4.0/layer4.0.conv1/conv2d_16'."""
    text = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
    if not text:
        return ""
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return ""
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        return ""
    return "/" + "/".join(x for x in names if x)


def import_model(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> Graph:
    """ONNX model -> static, folded Graph ready for the interpreter (every value has a static shape)."""
    return make_static(from_onnx(model), batch_size=batch_size, shapes=shapes)


def to_onnx(
    graph: Graph, *, inputs_with_defaults: Sequence[str] = (), producer: str = "edgetrain"
) -> onnx.ModelProto:
    """Graph -> a standard ONNX model that passes onnx.checker. inputs_with_defaults names initializers that
    also become graph inputs (a feed overrides them; without one, the initializer is the value). Each of
    edgetrain's fused ops becomes a call of an ONNX function whose body is in standard ops, so any ONNX runtime
    runs the model."""
    nodes, functions = [], []
    for n in graph.nodes:
        if n.domain == PRIVATE_DOMAIN:
            fname = f"{n.op_type}_{len(functions)}"
            functions.append(_function_proto(graph, n, fname))
            # the function lists only the named inputs and outputs, in order
            n = n.replace(
                op_type=fname,
                attrs={},
                inputs=tuple(i for i in n.inputs if i),
                outputs=tuple(o for o in n.outputs if o),
            )
        attrs = {
            k: (numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v)
            for k, v in n.attrs.items()
        }
        nodes.append(
            helper.make_node(
                n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain, **attrs
            )
        )
    overridable = [n for n in inputs_with_defaults if n in graph.initializers]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in graph.initializers.items()]
    internal = [
        _vi(graph, o)
        for n in graph.nodes
        for o in n.outputs
        if o and o not in graph.outputs and o in graph.values
    ]
    g = helper.make_graph(
        nodes,
        graph.name,
        [_vi(graph, i) for i in list(graph.inputs) + overridable],
        [_vi(graph, o) for o in graph.outputs],
        inits,
        value_info=internal,
    )
    opsets = [helper.make_opsetid("", graph.opset)] + [
        helper.make_opsetid(d, v) for d, v in graph.opsets.items()
    ]
    if functions and PRIVATE_DOMAIN not in graph.opsets:
        opsets.append(helper.make_opsetid(PRIVATE_DOMAIN, 1))
    model = helper.make_model(g, opset_imports=opsets, producer_name=producer, functions=functions)
    # The IR version the ONNX opset needs, not the newest the installed onnx writes: older runtimes load it.
    model.ir_version = max(8, _ir_version_for(graph.opset))
    return model


def _vi(graph: Graph, name: str) -> onnx.ValueInfoProto:
    info = graph.values.get(name)
    if info is None:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(
        name,
        helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)),
        None if info.shape is None else list(info.shape),
    )


def _function_proto(graph: Graph, node: Node, fname: str) -> onnx.FunctionProto:
    """One private node's standard-op body as an ONNX function (attribute values baked in)."""
    from .autodiff.functions import expand_body

    sub = expand_body(graph, node)
    body = [
        helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.asarray(v)))
        for k, v in sub.initializers.items()
    ]
    for n in sub.nodes:
        attrs = {
            k: (numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v)
            for k, v in n.attrs.items()
        }
        body.append(helper.make_node(n.op_type, list(n.inputs), list(n.outputs), **attrs))
    return helper.make_function(
        PRIVATE_DOMAIN,
        fname,
        list(sub.inputs),
        list(sub.outputs),
        body,
        [helper.make_opsetid("", graph.opset)],
    )


def _ir_version_for(opset: int) -> int:
    table = getattr(helper, "OP_SET_ID_VERSION_MAP", {})
    return int(table.get(("ai.onnx", opset), 8))


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
