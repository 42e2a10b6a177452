"""edgetrain's device side (numpy only): artifact -> TrainingSession (train_step, checkpoints, export), and
InferenceSession, on the core's interpreter; the Trainer, schedules, the feature cache and data feeding. It reaches
onnx only inside TrainingSession.export_onnx and an InferenceSession of an .onnx file."""

from edgetrain.core.interpreter import Interpreter, supported_ops

from .session import InferenceSession, NodeArg
from .training import TrainingSession

__all__ = ["InferenceSession", "Interpreter", "NodeArg", "TrainingSession", "supported_ops"]
