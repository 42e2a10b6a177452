"""The quantization parameters of an imported graph (Graph -> None or a ModelError): every scale and zero point
its op records name (edgetrain.core.ops.QParams) that the model stores as a constant is checked before anything is
allocated: scales positive and finite floats, zero points of their tensor's integer type and within its range,
per-channel scales and zero points one per channel of the axis they run along."""

from __future__ import annotations

import numpy as np

from edgetrain.core.errors import ModelError
from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import QParams, record

_ZERO_POINT_TYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))


def check_quantized(graph: Graph) -> None:
    """ModelError naming the node, its op and the value at fault for a bad constant scale or zero point; values
    computed at run time (DynamicQuantizeLinear's) are the kernels' to check."""
    for node in graph.nodes:
        for p in record(node.op_type).quantized:
            _check_params(graph, node, p)


def _name(node: Node, k: int | None) -> str:
    return node.inputs[k] if k is not None and 0 <= k < len(node.inputs) else ""


def _check_params(graph: Graph, node: Node, p: QParams) -> None:
    consts = graph.initializers
    scale_name, zp_name = _name(node, p.scale), _name(node, p.zero_point)
    scale, zp = consts.get(scale_name), consts.get(zp_name) if zp_name else None
    where = f"{node.label}"
    if scale is not None:
        if scale.dtype.kind != "f":
            raise ModelError(
                f"{where}: scale '{scale_name}' is {scale.dtype.name}; a scale is a float tensor"
            )
        bad = ~np.isfinite(scale) | (scale <= 0)
        if np.any(bad):
            raise ModelError(
                f"{where}: scale '{scale_name}' holds {scale[bad].ravel()[0]!r}; a quantization scale is a "
                "positive finite number (a zero scale divides by zero): re-quantize the model"
            )
    value_name = node.outputs[0] if p.value == -1 else _name(node, p.value)
    info = graph.values.get(value_name) if value_name else None
    value_dtype = np.dtype(info.dtype) if info is not None and p.value != -1 else None
    if zp is not None:
        if zp.dtype not in _ZERO_POINT_TYPES:
            raise ModelError(
                f"{where}: zero point '{zp_name}' is {zp.dtype.name}; a zero point is an int8, uint8, int16, "
                "uint16 (or, for int32 values, int32) tensor"
            )
        if value_dtype is not None and value_dtype.kind in "iu" and zp.dtype != value_dtype:
            raise ModelError(
                f"{where}: zero point '{zp_name}' is {zp.dtype.name}, but '{value_name}', the tensor it belongs "
                f"to, is {value_dtype.name}; a zero point has its tensor's type"
            )
        if zp.dtype == np.int32 and np.any(zp):
            raise ModelError(
                f"{where}: zero point '{zp_name}' of an int32 tensor must be 0 (it is {zp.ravel()[0]})"
            )
        if scale is not None and zp.size != scale.size and zp.size != 1:
            raise ModelError(
                f"{where}: zero point '{zp_name}' has {zp.size} values and scale '{scale_name}' {scale.size}; "
                "a per-channel zero point has one value per scale"
            )
    for what, name, arr in (("scale", scale_name, scale), ("zero point", zp_name, zp)):
        if arr is not None and arr.size > 1 and not node.attrs.get("block_size"):
            _check_channels(graph, node, p, what, name, arr, value_name)


def _check_channels(graph: Graph, node: Node, p: QParams, what: str, name: str, arr, value_name: str) -> None:
    if p.axis is None:
        raise ModelError(
            f"{node.label}: {what} '{name}' has {arr.size} values; {node.op_type} takes one here (per tensor)"
        )
    if arr.ndim != 1:
        raise ModelError(
            f"{node.label}: {what} '{name}' has shape {list(arr.shape)}; a per-channel {what} is 1-D"
        )
    info = graph.values.get(value_name)
    shape = None if info is None or info.shape is None else info.shape
    if shape is None or not shape:
        return
    axis = p.axis(node.attrs, len(shape)) if callable(p.axis) else p.axis
    if not -len(shape) <= axis < len(shape):
        raise ModelError(
            f"{node.label}: axis {axis} is out of range for '{value_name}' of shape {list(shape)}"
        )
    n = shape[axis]
    if isinstance(n, int) and n != arr.size:
        raise ModelError(
            f"{node.label}: {what} '{name}' has {arr.size} values, but axis {axis} of '{value_name}' (shape "
            f"{list(shape)}) has {n} channels; a per-channel {what} has one value per channel"
        )
