"""The onnx package for this layer, imported with a message that says how to get it when it is missing, and the
one-line reason of an exception onnx raised."""

from __future__ import annotations

try:
    import onnx
    import onnx.inliner
    import onnx.shape_inference
    from onnx import external_data_helper, helper, numpy_helper
except ImportError as _e:  # pragma: no cover - exercised by the numpy-only test
    raise ImportError(
        "edgetrain's ONNX import/export needs the onnx package: pip install 'edgetrain[convert]'"
    ) from _e

__all__ = ["external_data_helper", "helper", "numpy_helper", "onnx", "why"]


def why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else 'no detail'}"
