"""edgetrain's device side: a numpy-only interpreter, its kernels and the sessions. Never imports onnx."""

from edgetrain.core.interpreter import Interpreter, supported_ops

from .session import InferenceSession, NodeArg
from .training import TrainingSession

__all__ = ["InferenceSession", "Interpreter", "NodeArg", "TrainingSession", "supported_ops"]
