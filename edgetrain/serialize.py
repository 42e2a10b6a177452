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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import ArtifactError, UnsupportedError
from .ir import Graph, Node, TensorInfo

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


def _decode_attr(v: Any, tensors: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(v, list):
        return [_decode_attr(x, tensors, where) for x in v]
    if isinstance(v, dict):
        if "tensor" in v:
            return _tensor(tensors, v["tensor"], where)
        if v.get("float") in ("nan", "inf", "-inf"):
            return float(v["float"])
        raise ArtifactError(f"{where} has an attribute value edgetrain does not know: {v!r}")
    return v


def _tensor(tensors: dict[str, np.ndarray], name: str, where: str) -> np.ndarray:
    try:
        return tensors[name]
    except KeyError:
        raise ArtifactError(f"{where} needs tensor '{name}', which the file does not hold") from None


def graph_from_dict(d: dict[str, Any], tensors: dict[str, np.ndarray]) -> Graph:
    """The inverse of graph_to_dict. Arrays are used as given (e.g. read-only views of a mapped file)."""
    missing = [k for k in _KEYS if k not in d] if isinstance(d, dict) else list(_KEYS)
    if missing:
        raise ArtifactError(f"the stored graph lacks {', '.join(repr(k) for k in missing)}")
    prefix = d["prefix"]
    try:
        nodes = []
        for op_type, domain, name, inputs, outputs, attrs in d["nodes"]:
            where = f"node '{name or (outputs[0] if outputs else '?')}' ({op_type}) of the stored graph"
            attrs = {k: _decode_attr(v, tensors, where) for k, v in attrs.items()}
            nodes.append(Node(op_type, tuple(inputs), tuple(outputs), attrs, name, domain))
        values = {
            name: TensorInfo(np.dtype(dtype), None if shape is None else tuple(shape))
            for name, (dtype, shape) in d["values"].items()
        }
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"the stored graph '{d.get('name')}' is malformed: {e}") from e
    inits = {name: _tensor(tensors, prefix + name, "the stored graph") for name in d["initializers"]}
    return Graph(
        nodes=nodes,
        inputs=list(d["inputs"]),
        outputs=list(d["outputs"]),
        initializers=inits,
        values=values,
        opset=d["opset"],
        name=d["name"],
        opsets=dict(d["opsets"]),
    )
