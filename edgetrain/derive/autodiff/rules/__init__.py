"""The gradient rule table: importing this package registers every rule (and fused-op body) by op family."""

from . import elementwise, math, nn, quantized, recurrent, tensor, transformer  # noqa: F401
