"""edgetrain Graph -> a standard ONNX model (needs onnx): to_onnx, whose models pass onnx.checker and run in any ONNX
runtime (edgetrain's fused ops become ONNX functions in standard ops), and export_inference, the personalized
inference model written atomically (nothing of the training graph goes in)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgetrain.core.atomic import atomic_write
from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import PRIVATE_DOMAIN

from .proto import helper, numpy_helper, onnx


def export_inference(
    base: Graph,
    params: Mapping[str, np.ndarray],
    path: str | os.PathLike,
    *,
    props: Mapping[str, str] | None = None,
    inputs_with_defaults: Sequence[str] = (),
) -> None:
    """Writes base (the inference graph, symbolic batch kept) with params replacing its initializers, atomically
    (a temp file renamed into place); inputs_with_defaults are initializers that are graph inputs too (a feed
    overrides them: onnxruntime's LoRA adapters)."""
    model = to_onnx(
        base.copy(initializers={**base.initializers, **params}), inputs_with_defaults=inputs_with_defaults
    )
    if props:
        onnx.helper.set_model_props(model, dict(props))
    atomic_write(path, model.SerializeToString())


# (graph, one of edgetrain's own nodes in it) -> the standard-op Graph computing that node's outputs from its inputs
# (edgetrain.derive.autodiff.expand_body: the bodies are built by the gradient rules)
Body = Callable[[Graph, Node], Graph]


def to_onnx(
    graph: Graph,
    *,
    inputs_with_defaults: Sequence[str] = (),
    producer: str = "edgetrain",
    body: Body | None = None,
) -> onnx.ModelProto:
    """Graph -> a standard ONNX model that passes onnx.checker. inputs_with_defaults names initializers that
    also become graph inputs (a feed overrides them; without one, the initializer is the value). Each of
    edgetrain's fused ops becomes a call of an ONNX function whose body (given by `body`) is in standard ops, so
    any ONNX runtime runs the model."""
    nodes, functions = [], []
    for n in graph.nodes:
        if n.domain == PRIVATE_DOMAIN:
            if body is None:
                raise UnsupportedError(
                    f"{n.label} is edgetrain's own op '{n.op_type}': writing it as ONNX needs its standard-op body "
                    "(to_onnx(..., body=edgetrain.derive.autodiff.expand_body))"
                )
            fname = f"{n.op_type}_{len(functions)}"
            functions.append(_function_proto(graph, body(graph, n), fname))
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


def _function_proto(graph: Graph, sub: Graph, fname: str) -> onnx.FunctionProto:
    """One private node's standard-op body `sub` as an ONNX function (attribute values baked in)."""
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


def write_ort_adapter(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> int:
    """onnxruntime's adapter file (flatbuffers, written by onnxruntime itself), atomically."""
    try:
        import onnxruntime as ort  # build side: only this format needs it
    except ImportError as e:
        raise UnsupportedError(
            "format='onnxruntime' needs onnxruntime (pip install onnxruntime); format='edgetrain' needs nothing"
        ) from e
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in tensors.items()})
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".adapter-", suffix=".onnx_adapter")
    os.close(fd)
    try:
        fmt.export_adapter(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return os.path.getsize(path)
