"""edgetrain: keep training an ONNX inference model on the device, with a numpy-only runtime.

The device side (edgetrain.runtime) needs numpy alone; the build side (ONNX import, conversion, export) needs
the onnx package. Every public name but the errors is imported on first use (PEP 562), so `import edgetrain`
costs a few milliseconds, works on a phone without onnx, and loads neither the converter nor the runtime until
a name of theirs is asked for.
"""

import sys
import types
from importlib import import_module

from .errors import (
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
    "IOptimizer",
    "InferenceSession",
    "L1Loss",
    "LimitError",
    "MSELoss",
    "MissingFileError",
    "ModelError",
    "ModelLimitError",
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
    "__version__",
    "convert",
    "import_model",
]

# public name -> the submodule that defines it (imported on first access)
_LAZY = {
    "TrainingArtifact": "convert",
    "Graph": "ir",
    "GraphBuilder": "ir",
    "Node": "ir",
    "TensorInfo": "ir",
    "BCEWithLogitsLoss": "losses",
    "CrossEntropyLoss": "losses",
    "ILoss": "losses",
    "L1Loss": "losses",
    "MSELoss": "losses",
    "SGD": "optimizers",
    "Adam": "optimizers",
    "AdamW": "optimizers",
    "IOptimizer": "optimizers",
    "InferenceSession": "runtime",
    "TrainingSession": "runtime",
    "Trainer": "trainer",
    "TrainResult": "trainer",
    "ConstantLR": "schedules",
    "CosineLR": "schedules",
    "StepLR": "schedules",
    "WarmupLR": "schedules",
}


def __getattr__(name: str):
    if name in ("DataError", "DataLimitError"):  # the loaders' errors, in this hierarchy (loaders/errors.py)
        value = getattr(import_module("loaders.errors"), name)
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # found directly from now on
        return value
    if not name.startswith("_"):
        # submodules as attributes (et.runtime, et.trainer), as when this package imported them eagerly
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
    initializers and folded constants (edgetrain.passes.MAX_PARAMETER_BYTES, 4 GiB: see SECURITY.md)."""
    from .onnx_io import import_model as _import

    return _import(model, batch_size=batch_size, shapes=shapes, max_bytes=max_bytes)


class _Package(types.ModuleType):
    """`convert` names both a submodule and the function this package exports. Whoever imports the submodule first
    (`from edgetrain.convert import ...`) makes importlib set the package's attribute to the module; a property
    keeps the attribute the function, as when this package imported it eagerly."""

    @property
    def convert(self):
        fn = self.__dict__.get("_convert")
        if fn is None:
            fn = self.__dict__["_convert"] = import_module(f"{__name__}.convert").convert
        return fn

    @convert.setter
    def convert(self, value) -> None:
        if not (isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.convert"):
            self.__dict__["_convert"] = value  # e.g. a test's monkeypatch


sys.modules[__name__].__class__ = _Package
