"""The kernel table (numpy only): importing this package registers every kernel in KERNELS."""

from . import (  # noqa: F401  (imported for their @kernel registrations)
    activations,
    cast,
    elementwise,
    indexing,
    math,
    nn,
    nn_grad,
    resize,
    tensor,
)
from .registry import KERNELS, Kernel, kernel

__all__ = ["KERNELS", "Kernel", "kernel"]
