"""An input pipeline (loaders.InputPipeline) -> graph nodes before the model: the exported model then takes the raw
data (uint8 camera pixels, channels last) and onnxruntime gives the answer the session gives on the same data.

The nodes compute what loaders computes, in the same order and float type: Transpose (channels-last raw images),
Cast, Resize (linear, half_pixel: loaders.imageops.resize), a center Slice, Div by k for a scale of 1/k (else Mul),
Sub of the per-channel mean, Div by the per-channel std.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, TensorInfo
from loaders.imageops import crop_box
from loaders.preprocess import divisor


def with_preprocessing(graph: Graph, pipeline: Any) -> Graph:
    """graph with `pipeline` applied to its one input: the raw input keeps the input's name, the model reads the
    pipeline's output."""
    if len(graph.inputs) != 1:
        raise UnsupportedError(
            f"the model has {len(graph.inputs)} inputs; an input pipeline goes before a one-input model only: "
            f"export with preprocessing=False (--no-preprocessing-in-export) and apply it in the app"
        )
    name = graph.inputs[0]
    info = graph.info(name)
    model_in = _fresh_name(graph, f"{name}_preprocessed")
    renamed = [n.replace(inputs=tuple(model_in if i == name else i for i in n.inputs)) for n in graph.nodes]
    g = graph.copy(nodes=[], outputs=[model_in if o == name else o for o in graph.outputs])
    g.values[model_in] = info
    b = GraphBuilder(g)
    x = _raw_steps(b, name, info, pipeline)
    x = _arithmetic(b, x, info, pipeline)
    b.add("Identity", [x], outputs=[model_in], name="preprocessing_out")
    out = b.finish()
    out.nodes.extend(renamed)
    out.values[name] = _raw_info(info, pipeline)
    return out


def _fresh_name(graph: Graph, hint: str) -> str:
    used = set(graph.values) | set(graph.initializers) | {o for n in graph.nodes for o in n.outputs}
    name, k = hint, 0
    while name in used:
        k += 1
        name = f"{hint}_{k}"
    return name


def _raw_info(info: TensorInfo, pipeline: Any) -> TensorInfo:
    """The raw input: its dtype, channels last when the pipeline says so, any height and width when it resizes."""
    shape = list(info.shape or ())
    if pipeline.size is not None and len(shape) == 4:
        shape[2:4] = ["height", "width"]
    if pipeline.layout == "nhwc" and len(shape) >= 3:
        shape = [shape[0], *shape[2:], shape[1]]
    return TensorInfo(np.dtype(pipeline.raw_dtype or info.dtype), tuple(shape) if info.shape else None)


def _raw_steps(b: GraphBuilder, x: str, info: TensorInfo, pipeline: Any) -> str:
    """Layout, cast, resize and crop."""
    rank = len(info.shape or ())
    if pipeline.layout == "nhwc" and rank >= 3:
        x = b.add1(
            "Transpose", x, attrs={"perm": [0, rank - 1, *range(1, rank - 1)]}, name="preprocessing_layout"
        )
    if np.dtype(pipeline.raw_dtype or info.dtype) != np.dtype(info.dtype):
        x = b.add1("Cast", x, attrs={"to": _onnx_type(info.dtype)}, name="preprocessing_cast")
    if pipeline.size is None and pipeline.crop is None:
        return x
    if rank != 4:
        raise UnsupportedError(
            f"resize and crop apply to images [N, C, H, W]; the model's input has rank {rank}"
        )
    if pipeline.size is not None:
        if b.graph.opset < 13:
            raise UnsupportedError(
                f"the exported resize needs ONNX opset 13 or later; the model has opset {b.graph.opset}"
            )
        shape = b.add1("Shape", x, name="preprocessing_shape")
        nc = b.add1(
            "Slice", shape, b.initializer("nc_start", np.array([0])), b.initializer("nc_end", np.array([2]))
        )
        hw = b.initializer("resize_hw", np.array(pipeline.size, dtype=np.int64))
        sizes = b.add1("Concat", nc, hw, attrs={"axis": 0}, name="preprocessing_sizes")
        x = b.add1(
            "Resize",
            x,
            "",
            "",
            sizes,
            attrs={"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
            name="preprocessing_resize",
        )
    if pipeline.crop is not None:
        h, w = pipeline.size or info.shape[2:4]
        if not all(isinstance(d, (int, np.integer)) for d in (h, w)):
            raise UnsupportedError(
                f"a center crop needs the image's height and width: the pipeline resizes to none, and the model's "
                f"input has shape {list(info.shape)}; declare --resize H,W with the crop"
            )
        top, left = crop_box((int(h), int(w)), pipeline.crop)  # where the image readers' crop puts the window
        starts = b.initializer("crop_start", np.array([top, left]))
        ends = b.initializer("crop_end", np.array([top + pipeline.crop[0], left + pipeline.crop[1]]))
        x = b.add1(
            "Slice", x, starts, ends, b.initializer("crop_axes", np.array([2, 3])), name="preprocessing_crop"
        )
    return x


def _arithmetic(b: GraphBuilder, x: str, info: TensorInfo, pipeline: Any) -> str:
    """x / k (or x * scale), then (x - mean) / std per channel, in the model's float type."""
    dtype = np.dtype(info.dtype)
    if pipeline.scale is not None:
        k = divisor(pipeline.scale)
        if k:
            x = b.add1(
                "Div", x, b.initializer("scale_divisor", np.array(k, dtype)), name="preprocessing_scale"
            )
        else:
            x = b.add1(
                "Mul", x, b.initializer("scale", np.array(pipeline.scale, dtype)), name="preprocessing_scale"
            )
    rank = len(info.shape or ())
    for key, op in (("mean", "Sub"), ("std", "Div")):
        v = getattr(pipeline, key)
        if v is None:
            continue
        arr = np.asarray(v, dtype=dtype)
        arr = arr.reshape(()) if arr.size == 1 else arr.reshape((1, arr.size) + (1,) * max(rank - 2, 0))
        x = b.add1(op, x, b.initializer(key, arr), name=f"preprocessing_{key}")
    return x


def _onnx_type(dtype) -> int:
    """ONNX's TensorProto enum of a float dtype (no onnx import: the device side writes none)."""
    codes = {"float32": 1, "float16": 10, "float64": 11, "bfloat16": 16}
    name = np.dtype(dtype).name
    if name not in codes:
        raise UnsupportedError(f"an input pipeline casts to float types only, not {name}")
    return codes[name]
