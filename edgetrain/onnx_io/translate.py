"""The parts of a checked ModelProto -> the IR's (needs onnx): value infos -> TensorInfo, attributes and tensors ->
numpy values, the model's opset (one below MIN_OPSET read as MIN_OPSET when its ops mean the same there), nodes
outside the standard domain checked against the kernels edgetrain has, torch's module scopes, and the canonical
rewrite: a Constant node becomes an initializer, a node whose op changed since the model's opset is rewritten
into the op's newest form by its record's upgrade."""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from edgetrain.core.alternatives import explain, no_kernel_message
from edgetrain.core.errors import ModelError, UnsupportedError
from edgetrain.core.ir import GraphBuilder, Node, TensorInfo
from edgetrain.core.kernels import KERNELS
from edgetrain.core.ops import MICROSOFT_DOMAIN, record
from edgetrain.graph.passes import check_size

from .checks import _check_tensor, _shape_text
from .proto import helper, numpy_helper, onnx, why

MIN_OPSET = 7
CANONICAL_OPSET = 18  # every node is rewritten into its form at max(model opset, this)


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
