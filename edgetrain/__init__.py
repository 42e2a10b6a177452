"""edgetrain: keep training an ONNX inference model on the device, with a numpy-only runtime.

The device side (edgetrain.runtime) needs numpy alone; the build side (ONNX import, conversion, export) needs
the onnx package and is imported lazily, so `import edgetrain` works on a phone without onnx.
"""

from .convert import TrainingArtifact, convert
from .errors import (
    ArtifactError,
    ConfigError,
    EdgeTrainError,
    ExecutionError,
    FeedError,
    ModelError,
    NonFiniteError,
    RebatchError,
    ShapeError,
    UnsupportedError,
)
from .ir import Graph, GraphBuilder, Node, TensorInfo
from .losses import BCEWithLogitsLoss, CrossEntropyLoss, ILoss, L1Loss, MSELoss
from .optimizers import SGD, Adam, AdamW, IOptimizer
from .runtime import InferenceSession, TrainingSession
from .trainer import ConstantLR, CosineLR, StepLR, Trainer, TrainResult, WarmupLR

__version__ = "0.1.0"

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "ArtifactError",
    "BCEWithLogitsLoss",
    "ConfigError",
    "CrossEntropyLoss",
    "EdgeTrainError",
    "ExecutionError",
    "FeedError",
    "Graph",
    "GraphBuilder",
    "ILoss",
    "IOptimizer",
    "InferenceSession",
    "L1Loss",
    "MSELoss",
    "ModelError",
    "Node",
    "NonFiniteError",
    "RebatchError",
    "ShapeError",
    "TensorInfo",
    "TrainingArtifact",
    "TrainingSession",
    "Trainer",
    "TrainResult",
    "ConstantLR",
    "CosineLR",
    "StepLR",
    "WarmupLR",
    "UnsupportedError",
    "__version__",
    "convert",
    "import_model",
]


def import_model(model, *, batch_size=None, shapes=None):
    """ONNX model (path, bytes or ModelProto) -> static edgetrain Graph. Needs onnx."""
    from .onnx_io import import_model as _import

    return _import(model, batch_size=batch_size, shapes=shapes)
