"""The personalized inference model: (inference graph, trained parameters) -> an ONNX file onnxruntime runs
(build side: needs onnx; nothing of the training graph goes in)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx

from .container import atomic_write
from .ir import Graph
from .onnx_io import to_onnx


def export_inference(
    base: Graph,
    params: Mapping[str, np.ndarray],
    path: str | os.PathLike,
    *,
    props: Mapping[str, str] | None = None,
) -> None:
    """Writes base (the inference graph, symbolic batch kept) with params replacing its initializers, atomically
    (a temp file renamed into place)."""
    model = to_onnx(base.copy(initializers={**base.initializers, **params}))
    if props:
        onnx.helper.set_model_props(model, dict(props))
    atomic_write(path, model.SerializeToString())
