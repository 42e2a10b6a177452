"""A data fault (file path + what is wrong) -> DataError, the one exception loaders raises for bad data."""

from __future__ import annotations


class DataError(Exception):
    """A dataset that cannot be read or used: the message names the file (or view) and the fault.

    loaders cannot import edgetrain, so this stands alone; edgetrain may wrap or subclass it.
    Bad arguments (a batch size of 0, fractions that do not add up) raise ValueError instead.
    """

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path
