"""The one exception hierarchy every user-facing failure of edgetrain comes from."""


class EdgeTrainError(Exception):
    """Base of every error edgetrain raises on purpose; catch this to catch them all."""


class ModelError(EdgeTrainError):
    """A model file or graph that cannot be read or is malformed (not ONNX, dangling names, cycles)."""


class UnsupportedError(EdgeTrainError):
    """A valid model that uses something edgetrain does not support: an op, an opset, an attribute value."""


class ShapeError(EdgeTrainError):
    """A shape that cannot be made static, or shapes that do not fit together."""


class FeedError(EdgeTrainError):
    """Run-time inputs with a wrong name, shape or dtype."""


class ExecutionError(EdgeTrainError):
    """A kernel failed while running a node; the message names the node and its input shapes."""


class ArtifactError(EdgeTrainError):
    """A training artifact or checkpoint file that is corrupt, truncated, of another version or model."""
