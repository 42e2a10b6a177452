"""Graph <-> (JSON-able dict, {name: tensor}), the form in which programs are stored in edgetrain files (numpy only).

The dict::

    {"name": str, "opset": int, "opsets": {domain: int}, "inputs": [..], "outputs": [..],
     "prefix": str,                       # initializer i is the tensor prefix + i
     "initializers": [names, in order],
     "values": {name: [dtype name, shape list or null]},   # dims: int, str (symbolic) or null (unknown)
     "nodes": [[op_type, domain, name, inputs, outputs, attrs], ...]}

Attribute values are JSON's own int, float, bool, str and lists of them (a tuple is stored as a list); the few
things JSON cannot say are one-key objects: {"tensor": name} for a numpy array attribute (the array is stored as
that tensor, named after its node and attribute) and {"float": "nan" | "inf" | "-inf"} for non-finite floats.
numpy scalars are stored as the Python int / float / bool of the same value. Python's json writes floats by
repr, so they read back bit-exactly.

Reading trusts nothing: graph_from_dict checks every field's JSON type, and check_graph what a program must be to
run (every name a node reads defined before it, outputs unique, ops the runtime knows with their attributes and
input counts, declared sizes within bounds); a fault is an ArtifactError naming the graph, the node and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .declared import DTYPES, MAX_DIMS, declared_nbytes, short
from .errors import ArtifactError, ArtifactLimitError, UnsupportedError
from .interpreter import compile_step
from .ir import Graph, Node, TensorInfo
from .kernels import KERNELS

_KEYS = ("name", "opset", "opsets", "inputs", "outputs", "prefix", "initializers", "values", "nodes")


def _encode_attr(v: Any, label: str, attr: str, store: Callable[[np.ndarray], str]) -> Any:
    """One attribute value -> its JSON form; store(array) keeps an array as a tensor and returns its name."""
    if isinstance(v, np.ndarray):
        return {"tensor": store(v)}
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        v = v.item()
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return {"float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if isinstance(v, (list, tuple)):
        return [_encode_attr(x, label, attr, store) for x in v]
    raise UnsupportedError(
        f"{label}: attribute '{attr}' holds a {type(v).__name__}, which edgetrain files cannot store; "
        "attributes may be int, float, bool, str, numpy arrays and lists of them"
    )


def graph_to_dict(graph: Graph, *, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Graph -> (JSON-able dict, {tensor name: array}). Initializers are stored as tensors named prefix + their
    own name, array attributes as tensors named prefix + node + attribute. Deterministic: the same graph gives the
    same dict, and so the same JSON bytes."""
    tensors: dict[str, np.ndarray] = {prefix + name: np.asarray(a) for name, a in graph.initializers.items()}
    nodes = []
    for idx, n in enumerate(graph.nodes):
        attrs = {}
        for attr, v in n.attrs.items():
            part = iter(range(len(v))) if isinstance(v, (list, tuple)) else None

            def store(arr: np.ndarray, n=n, idx=idx, attr=attr, part=part) -> str:
                # Node names are unique in graphs the builder made; an imported one may lack one or repeat one.
                suffix = f"{attr}[{next(part)}]" if part is not None else attr
                name = f"{prefix}{n.name}.{suffix}"
                if not n.name or name in tensors:
                    name = f"{prefix}node{idx}.{suffix}"
                assert name not in tensors, f"tensor name '{name}' of {n.label} is taken"
                tensors[name] = arr
                return name

            attrs[attr] = _encode_attr(v, n.label, attr, store)
        nodes.append([n.op_type, n.domain, n.name, list(n.inputs), list(n.outputs), attrs])
    values = {
        name: [
            np.dtype(info.dtype).name,
            None if info.shape is None else [int(x) if isinstance(x, np.integer) else x for x in info.shape],
        ]
        for name, info in graph.values.items()
    }
    d = {
        "name": graph.name,
        "opset": int(graph.opset),
        "opsets": {k: int(v) for k, v in graph.opsets.items()},
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "prefix": prefix,
        "initializers": list(graph.initializers),
        "values": values,
        "nodes": nodes,
    }
    return d, tensors


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
VALUE_DTYPES = frozenset(DTYPES | {"object"})  # the container's, and object for ONNX string tensors


def _decode_attr(v: Any, tensors: dict[str, np.ndarray], where: str) -> Any:
    if type(v) in (int, float, bool, str):
        return v
    if isinstance(v, list):
        return [_decode_attr(x, tensors, where) for x in v]
    if isinstance(v, dict) and len(v) == 1:
        if isinstance(v.get("tensor"), str):
            return _tensor(tensors, v["tensor"], where)
        if isinstance(v.get("float"), str) and v["float"] in _FLOATS:
            return _FLOATS[v["float"]]
    raise ArtifactError(f"{where} has an attribute value edgetrain does not know: {short(v)}")


def _tensor(tensors: dict[str, np.ndarray], name: str, where: str) -> np.ndarray:
    try:
        return tensors[name]
    except KeyError:
        raise ArtifactError(f"{where} needs tensor {short(name)}, which the file does not hold") from None


def _strings(v: Any, where: str, field: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ArtifactError(f"{where}: '{field}' must be a list of names (strings), not {short(v)}")
    return v


def _int(v: Any, where: str, field: str) -> int:
    if type(v) is not int or not 0 <= v < 2**31:
        raise ArtifactError(f"{where}: '{field}' must be an int >= 0, not {short(v)}")
    return v


def _node_at(where: str, k: int, name: str, outputs: Any, op_type: str) -> str:
    """How errors name node k: its index, name (or first output) and op."""
    first = outputs[0] if isinstance(outputs, (list, tuple)) and outputs else "?"
    op = op_type if isinstance(op_type, str) and len(op_type) <= 60 else short(op_type)
    return f"{where}, node {k} {short(name or first)} ({op})"


def _value_info(name: str, v: Any, where: str) -> TensorInfo:
    if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)):
        raise ArtifactError(f"{where}: value {short(name)} is {short(v)}, not [dtype name, shape]")
    dtype, shape = v
    if dtype not in VALUE_DTYPES:
        raise ArtifactError(
            f"{where}: value {short(name)} has the dtype {short(dtype)}; graphs hold "
            f"{', '.join(sorted(VALUE_DTYPES))}"
        )
    if shape is not None and not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(d is None or isinstance(d, str) or (type(d) is int and d >= 0) for d in shape)
    ):
        raise ArtifactError(
            f"{where}: value {short(name)} has the shape {short(shape)}; a shape is null or a list of at most "
            f"{MAX_DIMS} dimensions, each an int >= 0, a name or null"
        )
    return TensorInfo(np.dtype(dtype), None if shape is None else tuple(shape))


def graph_from_dict(
    d: dict[str, Any], tensors: dict[str, np.ndarray], *, where: str = "the stored graph"
) -> Graph:
    """The inverse of graph_to_dict. Arrays are used as given (e.g. read-only views of a mapped file). Every
    field must have the type the format says; an ArtifactError names `where` and the first fault. What the graph
    means (names defined, ops known) is check_graph's."""
    missing = [k for k in _KEYS if k not in d] if isinstance(d, dict) else list(_KEYS)
    if missing:
        raise ArtifactError(f"{where} lacks {', '.join(repr(k) for k in missing)}")
    for field in ("name", "prefix"):
        if not isinstance(d[field], str):
            raise ArtifactError(f"{where}: '{field}' must be a string, not {short(d[field])}")
    opset = _int(d["opset"], where, "opset")
    opsets = d["opsets"]
    if not isinstance(opsets, dict):
        raise ArtifactError(f"{where}: 'opsets' must be an object of domain -> version, not {short(opsets)}")
    opsets = {k: _int(v, where, f"opsets.{k}") for k, v in opsets.items()}
    inputs = _strings(d["inputs"], where, "inputs")
    outputs = _strings(d["outputs"], where, "outputs")
    inits = _strings(d["initializers"], where, "initializers")
    if not isinstance(d["values"], dict):
        raise ArtifactError(
            f"{where}: 'values' must be an object of name -> [dtype, shape], not {short(d['values'])}"
        )
    values = {name: _value_info(name, v, where) for name, v in d["values"].items()}
    if not isinstance(d["nodes"], list):
        raise ArtifactError(f"{where}: 'nodes' must be a list, not {short(d['nodes'])}")
    nodes = []
    for k, entry in enumerate(d["nodes"]):
        at = f"{where}, node {k}"
        if not (isinstance(entry, list) and len(entry) == 6):
            raise ArtifactError(
                f"{at} is {short(entry)}, not [op_type, domain, name, inputs, outputs, attributes]"
            )
        op_type, domain, name, ins, outs, attrs = entry
        for field, v in (("op_type", op_type), ("domain", domain), ("name", name)):
            if not isinstance(v, str):
                raise ArtifactError(f"{at}: its {field} must be a string, not {short(v)}")
        at = _node_at(where, k, name, outs, op_type)
        ins, outs = _strings(ins, at, "inputs"), _strings(outs, at, "outputs")
        if not isinstance(attrs, dict):
            raise ArtifactError(f"{at}: its attributes must be an object, not {short(attrs)}")
        attrs = {a: _decode_attr(v, tensors, f"{at}, attribute {short(a)}") for a, v in attrs.items()}
        nodes.append(Node(op_type, tuple(ins), tuple(outs), attrs, name, domain))
    initializers = {name: _tensor(tensors, d["prefix"] + name, where) for name in inits}
    return Graph(
        nodes=nodes,
        inputs=list(inputs),
        outputs=list(outputs),
        initializers=initializers,
        values=values,
        opset=opset,
        name=d["name"],
        opsets=opsets,
    )


def check_graph(graph: Graph, where: str, *, max_value_bytes: int | None = None) -> None:
    """What a stored program must be to run, checked before it runs: graph inputs distinct and declared (dtype,
    shape); every name a node reads is a graph input, an initializer or the output of a node before it; no output
    is written twice or over an input or initializer; every graph output is defined; every op is one the runtime
    has (in its domain), with attributes its kernel takes and a count of inputs it accepts; every static value
    declares at most max_value_bytes (ArtifactLimitError past it). ArtifactError naming `where` and the first
    fault (node index, name and op, field)."""

    defined: set[str] = set(graph.initializers)
    for name in graph.inputs:
        if name in defined and name not in graph.initializers:
            raise ArtifactError(f"{where}: graph input {short(name)} is listed twice")
        if name not in graph.values:
            raise ArtifactError(
                f"{where}: graph input {short(name)} has no declared dtype and shape ('values')"
            )
        defined.add(name)
    for k, node in enumerate(graph.nodes):
        at = _node_at(where, k, node.name, node.outputs, node.op_type)
        kern = KERNELS.get(node.op_type)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if kern is None or kern.domain != domain:
            raise ArtifactError(
                f"{at}: op {short(node.op_type)} in domain {short(node.domain)} is not one this edgetrain runs; "
                "the artifact was made by a newer edgetrain or damaged: rebuild it with `edgetrain convert`"
            )
        for i in node.inputs:
            if i and i not in defined:
                raise ArtifactError(
                    f"{at} reads {short(i)}, which no graph input, initializer or node before it defines"
                )
        for o in node.outputs:
            if o in defined:
                raise ArtifactError(f"{at} writes {short(o)}, which is already defined")
            if o:
                defined.add(o)
        try:
            compile_step(node)
        except UnsupportedError as e:
            raise ArtifactError(f"{at}: {e}") from None
    for name, arr in graph.initializers.items():  # a constant holds what the graph says (a [1] for a [], say)
        info = graph.values.get(name)
        if (
            info is not None
            and info.is_static
            and (arr.dtype != info.dtype or arr.size != int(np.prod(info.shape, dtype=object)))
        ):
            raise ArtifactError(
                f"{where}: initializer {short(name)} holds {arr.dtype}{list(arr.shape)}, but the graph declares "
                f"{info} for it"
            )
    for o in graph.outputs:
        if o not in defined:
            raise ArtifactError(
                f"{where}: graph output {short(o)} is produced by no node, input or initializer"
            )
    if max_value_bytes is not None:
        for name, info in graph.values.items():
            if info.is_static:
                try:
                    size = declared_nbytes(list(info.shape), np.dtype(info.dtype).itemsize)
                except ValueError as e:
                    size, why = None, str(e)
                if size is None or size > max_value_bytes:
                    raise ArtifactLimitError(
                        f"{where}: value {short(name)} declares {info} ("
                        + (why if size is None else f"{size} bytes")
                        + f"), more than the {max_value_bytes} bytes edgetrain allows one value (max_arena_bytes=)",
                        limit=max_value_bytes,
                        needed=size,
                    )
