"""ONNX ModelProto -> edgetrain Graph (needs onnx): checked before anything is allocated from it, external data
read within bounds, local functions inlined, every node rewritten into the newest form of its op.

The rewrite (the "canonical" opset, at least 18) lets the interpreter, the autodiff and the emitted training graphs
see one semantics per op type; each op's record (edgetrain.core.ops) says below which version its node is
rewritten, and how (edgetrain.core.canonical).

The checks of the protobuf are in checks.py, the conversion of its parts and the rewrite in translate.py; this
module reads the file (external data included) and puts the graph together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgetrain.core.errors import ModelError, UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo, about, toposort
from edgetrain.graph import passes
from edgetrain.graph.passes import contiguous, make_static

from .checks import _check_graph, _check_total, _declared_bytes, _shape_text, _text
from .proto import external_data_helper as ext
from .proto import onnx, why
from .quantized import check_quantized
from .shapes import check_types, node_shapes
from .translate import (
    CANONICAL_OPSET,
    MIN_OPSET,
    _attr_value,
    _canonicalize,
    _check_contrib,
    _lift_old_opset,
    _opset_of,
    _scope,
    _tensor_array,
    _value_info,
)

MAX_METADATA_CHARS = (
    16 << 20
)  # a model's metadata_props value kept (a parameter manifest); longer ones are dropped


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
