"""edgetrain: keep training an ONNX inference model on the device, with a numpy-only runtime.

The device side (edgetrain.runtime) needs numpy alone; the build side (ONNX import, conversion, export) needs
the onnx package. Every public name but the errors is imported on first use (PEP 562), so `import edgetrain`
costs a few milliseconds, works on a phone without onnx, and loads neither the converter nor the runtime until
a name of theirs is asked for.
"""

from importlib import import_module

from .core.errors import (
    ArtifactError,
    ArtifactLimitError,
    ConfigError,
    EdgeTrainError,
    ExecutionError,
    FeedError,
    LimitError,
    MissingFileError,
    ModelError,
    ModelLimitError,
    NonFiniteError,
    RebatchError,
    ShapeError,
    StorageError,
    UnsupportedError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "ArtifactError",
    "ArtifactLimitError",
    "BCEWithLogitsLoss",
    "ConfigError",
    "CrossEntropyLoss",
    "DataError",
    "DataLimitError",
    "EdgeTrainError",
    "ExecutionError",
    "FeedError",
    "Graph",
    "GraphBuilder",
    "ILoss",
    "ILRSchedule",
    "IOptimizer",
    "InferenceSession",
    "IAdapter",
    "L1Loss",
    "LimitError",
    "LoRA",
    "Conversion",
    "ConvertRequest",
    "Rewrite",
    "Section",
    "register_section",
    "MSELoss",
    "MissingFileError",
    "ModelError",
    "ModelLimitError",
    "NextTokenLoss",
    "Node",
    "NonFiniteError",
    "RebatchError",
    "ShapeError",
    "StorageError",
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
    "UsageError",
    "__version__",
    "convert",
    "import_model",
]

# public name -> the module that defines it (imported on first access)
_LAZY = {
    "convert": "edgetrain.derive.pipeline",
    "TrainingArtifact": "edgetrain.derive.artifact",
    "Graph": "edgetrain.core.ir",
    "GraphBuilder": "edgetrain.core.ir",
    "Node": "edgetrain.core.ir",
    "TensorInfo": "edgetrain.core.ir",
    "BCEWithLogitsLoss": "edgetrain.derive.losses",
    "CrossEntropyLoss": "edgetrain.derive.losses",
    "ILoss": "edgetrain.derive.losses",
    "L1Loss": "edgetrain.derive.losses",
    "MSELoss": "edgetrain.derive.losses",
    "NextTokenLoss": "edgetrain.derive.losses",
    "LoRA": "edgetrain.derive.adapters",
    "IAdapter": "edgetrain.derive.adapters",
    "Rewrite": "edgetrain.derive.rewrite",
    "Conversion": "edgetrain.derive.rewrite",
    "ConvertRequest": "edgetrain.derive.request",
    "Section": "edgetrain.graph.sections",
    "register_section": "edgetrain.graph.sections",
    "SGD": "edgetrain.derive.optimizers",
    "Adam": "edgetrain.derive.optimizers",
    "AdamW": "edgetrain.derive.optimizers",
    "IOptimizer": "edgetrain.derive.optimizers",
    "InferenceSession": "edgetrain.runtime",
    "TrainingSession": "edgetrain.runtime",
    "Trainer": "edgetrain.runtime.trainer",
    "TrainResult": "edgetrain.runtime.trainer",
    "ConstantLR": "edgetrain.runtime.schedules",
    "CosineLR": "edgetrain.runtime.schedules",
    "StepLR": "edgetrain.runtime.schedules",
    "WarmupLR": "edgetrain.runtime.schedules",
    "ILRSchedule": "edgetrain.runtime.schedules",
    "DataError": "loaders.errors",  # the loaders' errors, in this hierarchy (loaders/errors.py)
    "DataLimitError": "loaders.errors",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(import_module(module), name)
        globals()[name] = value  # found directly from now on
        return value
    if not name.startswith("_"):
        # the layers as attributes (et.runtime, et.derive), as for any imported subpackage
        try:
            return import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def import_model(model, *, batch_size=None, shapes=None, max_bytes=None):
    """ONNX model (path, bytes or ModelProto) -> static edgetrain Graph. Needs onnx. max_bytes bounds the model's
    initializers and folded constants (edgetrain.graph.passes.MAX_PARAMETER_BYTES, 4 GiB: see SECURITY.md)."""
    from .onnx_io.reader import import_model as _import  # needs onnx: an optional dependency

    return _import(model, batch_size=batch_size, shapes=shapes, max_bytes=max_bytes)
