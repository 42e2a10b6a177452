"""The one exception hierarchy every user-facing failure of edgetrain comes from."""


class EdgeTrainError(Exception):
    """Base of every error edgetrain raises on purpose; catch this to catch them all."""


class ModelError(EdgeTrainError):
    """A model file or graph that cannot be read or is malformed (not ONNX, dangling names, cycles)."""


class UnsupportedError(EdgeTrainError):
    """A valid model that uses something edgetrain does not support: an op, an opset, an attribute value."""


class ShapeError(EdgeTrainError):
    """A shape that cannot be made static, or shapes that do not fit together."""


class ConfigError(EdgeTrainError):
    """Settings that cannot work together, or that contradict the run a checkpoint continues."""


class RebatchError(ShapeError):
    """A model exported with a fixed batch that cannot be moved faithfully to the batch asked for."""


class FeedError(EdgeTrainError):
    """Run-time inputs with a wrong name, shape or dtype."""


class ExecutionError(EdgeTrainError):
    """A kernel failed while running a node; the message names the node and its input shapes."""


class ArtifactError(EdgeTrainError):
    """A training artifact or checkpoint file that is corrupt, truncated, of another version or model."""


class NonFiniteError(ExecutionError):
    """A training step whose loss or updated values are not finite (NaN or infinite): nothing of it was committed,
    the parameters and optimizer state are those before the step."""

    def __init__(self, message: str, *, loss: float, step: int, values: list[str]):
        super().__init__(message)
        self.loss = loss  # the step's loss (it may be finite when only an update overflowed)
        self.step = step  # the number the step would have had (1-based)
        self.values = values  # the parameters or state tensors whose new values were not finite
