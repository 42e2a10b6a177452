"""The kernel table (numpy only): importing this package registers every kernel in KERNELS."""

from . import elementwise, math, nn, tensor  # noqa: F401  (imported for their @kernel registrations)
from .registry import KERNELS, Kernel, kernel

__all__ = ["KERNELS", "Kernel", "kernel"]
