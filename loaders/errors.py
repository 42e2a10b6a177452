"""A data fault (file path + what is wrong) -> DataError, the one exception loaders raises for bad data.

The classes belong to edgetrain's one hierarchy (edgetrain.core.errors, a module that imports nothing): DataError is an
`edgetrain.EdgeTrainError` and a ValueError, DataLimitError also a `LimitError` and a MemoryError, and bad arguments
(a batch size of 0, fractions that do not add up) raise edgetrain's ConfigError, a ValueError too. loaders imports
nothing else of edgetrain; where edgetrain is not there at all (the package copied alone onto a device), the same
names stand alone on the builtins, so `except ValueError` / `except MemoryError` code works either way.
SampleIndexError, an index out of a view's range, is a DataError and an IndexError (Python's sequence protocol).
"""

from __future__ import annotations

try:
    from edgetrain.core.errors import ConfigError, EdgeTrainError, LimitError
except ImportError:  # loaders without edgetrain: the same shapes on the builtins

    class EdgeTrainError(Exception):
        """Base of every error raised on purpose (edgetrain.EdgeTrainError when edgetrain is installed)."""

    class ConfigError(EdgeTrainError, ValueError):
        """Arguments or settings that cannot work."""

    class LimitError(EdgeTrainError, MemoryError):
        """Input that declares, or would inflate to, more than a bound allows."""

        def __init__(self, message: str, *, limit: int | None = None, needed: int | None = None, path=None):
            super().__init__(message)
            self.limit, self.needed, self.path = limit, needed, None if path is None else str(path)


class DataError(EdgeTrainError, ValueError):
    """A dataset that cannot be read or used: the message names the file (or view) and the fault."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class DataLimitError(DataError, LimitError):
    """A data file that declares, or inflates to, more than a bound allows (a decompression bomb, a header claiming
    10**12 samples); refused before anything that size was allocated."""

    def __init__(
        self, message: str, path: str | None = None, *, limit: int | None = None, needed: int | None = None
    ):
        DataError.__init__(self, message, path)
        self.limit = limit
        self.needed = needed


class SampleIndexError(DataError, IndexError):
    """A sample index out of range for a view (view[i], SubsetView indices). An IndexError, so that Python's
    sequence protocol (iteration by __getitem__, `except IndexError`) works as for a list; and a DataError, whose
    message names the view, like numpy's AxisError is both a ValueError and an IndexError."""


__all__ = ["ConfigError", "DataError", "DataLimitError", "EdgeTrainError", "LimitError", "SampleIndexError"]
