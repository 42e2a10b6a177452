"""The one exception hierarchy every user-facing failure of edgetrain comes from.

Each class is also the builtin exception that matches its kind, so that code written against the builtins keeps
working: bad values and files are ValueErrors, unsupported features NotImplementedErrors, file-system failures
OSErrors, a size bound hit a MemoryError, a kernel failing a RuntimeError.

    EdgeTrainError
    ├── ModelError (ValueError)            └── ModelLimitError (+ LimitError)
    ├── UnsupportedError (NotImplementedError)
    ├── ShapeError (ValueError)            └── RebatchError
    ├── ConfigError (ValueError)           └── UsageError
    ├── FeedError (ValueError)
    ├── ArtifactError (ValueError)         └── ArtifactLimitError (+ LimitError)
    ├── loaders.DataError (ValueError)     └── loaders.DataLimitError (+ LimitError)
    ├── ExecutionError (RuntimeError)      └── NonFiniteError
    ├── StorageError (OSError)             └── MissingFileError (FileNotFoundError)
    └── LimitError (MemoryError)

This module imports nothing: loaders (which never imports the rest of edgetrain) builds DataError on it.
"""

from __future__ import annotations


class EdgeTrainError(Exception):
    """Base of every error edgetrain raises on purpose; catch this to catch them all."""


class ModelError(EdgeTrainError, ValueError):
    """A model file or graph that cannot be read or is malformed (not ONNX, dangling names, cycles)."""


class UnsupportedError(EdgeTrainError, NotImplementedError):
    """A valid model that uses something edgetrain does not support: an op, an opset, an attribute value."""


class ShapeError(EdgeTrainError, ValueError):
    """A shape that cannot be made static, or shapes that do not fit together."""


class ConfigError(EdgeTrainError, ValueError):
    """Settings that cannot work together, or that contradict the run a checkpoint continues."""


class UsageError(ConfigError):
    """A command line used wrongly: an unknown or missing argument, options that do not go together; the commands
    exit with code 2."""


class RebatchError(ShapeError):
    """A model exported with a fixed batch that cannot be moved faithfully to the batch asked for."""


class FeedError(EdgeTrainError, ValueError):
    """Run-time inputs with a wrong name, shape, dtype or value (a class label outside the model's classes)."""


class ExecutionError(EdgeTrainError, RuntimeError):
    """A kernel failed while running a node; the message names the node and its input shapes."""


class ArtifactError(EdgeTrainError, ValueError):
    """A training artifact or checkpoint file that is corrupt, truncated, of another version or model."""


class NonFiniteError(ExecutionError):
    """A training step whose loss or updated values are not finite (NaN or infinite): nothing of it was committed,
    the parameters and optimizer state are those before the step."""

    def __init__(self, message: str, *, loss: float, step: int, values: list[str]):
        super().__init__(message)
        self.loss = loss  # the step's loss (it may be finite when only an update overflowed)
        self.step = step  # the number the step would have had (1-based)
        self.values = values  # the parameters or state tensors whose new values were not finite


class LimitError(EdgeTrainError, MemoryError):
    """Input that declares, or would inflate to, more than a bound allows. It was refused before anything that
    size was allocated; `limit` is the bound in bytes (or items), `needed` what the input asked for when known."""

    def __init__(self, message: str, *, limit: int | None = None, needed: int | None = None, path=None):
        super().__init__(message)
        self.limit = limit
        self.needed = needed
        self.path = None if path is None else str(path)


class ModelLimitError(ModelError, LimitError):
    """An ONNX model whose declared sizes exceed a bound (a dimension of 2**62, a 40 GB static input)."""


class ArtifactLimitError(ArtifactError, LimitError):
    """An artifact or checkpoint whose header, tensors or memory plan declare more than a bound allows."""


class StorageError(EdgeTrainError, OSError):
    """A file-system failure (missing, forbidden, read-only, full) on a file the user named. The message and
    `filename` name that file (a checkpoint, not its temporary file); `errno` and `strerror` are the system's."""

    def __init__(self, message: str, *, path=None, errno: int | None = None, strerror: str | None = None):
        super().__init__(message)
        self.filename = None if path is None else str(path)
        self.errno = errno
        self.strerror = strerror

    def __str__(
        self,
    ) -> str:  # OSError would print "[Errno n] ..." only for its 2-argument form; ours is the message
        return str(self.args[0]) if self.args else ""

    @classmethod
    def of(cls, error: OSError, path, doing: str) -> StorageError:
        """The OSError `error`, met while `doing` (e.g. "cannot write the checkpoint") to `path`, as a StorageError
        naming `path`: a missing file becomes a MissingFileError."""
        kind = MissingFileError if isinstance(error, FileNotFoundError) else cls
        reason = error.strerror or str(error) or type(error).__name__
        return kind(f"{doing} {str(path)!r}: {reason}", path=path, errno=error.errno, strerror=error.strerror)


class MissingFileError(StorageError, FileNotFoundError):
    """A file or folder the user named does not exist."""
