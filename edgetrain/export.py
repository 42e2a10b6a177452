"""The personalized inference model: (inference graph, trained parameters) -> an ONNX file onnxruntime runs
(build side: needs onnx; nothing of the training graph goes in)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx

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
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        onnx.save(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
