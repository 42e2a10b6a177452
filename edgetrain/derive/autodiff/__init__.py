"""Reverse-mode autodiff over the IR (build side; needs no onnx): differentiate(), the rule table, the context
rules build with, and the standard-op bodies of edgetrain's fused backward ops."""

from . import rules  # noqa: F401  (every rule and body registers into the op records)
from .context import GradContext, ShapedBuilder
from .driver import backprop, differentiate
from .functions import expand_body, inline_private
from .registry import BODIES, RULES, body, grad

__all__ = [
    "BODIES",
    "RULES",
    "GradContext",
    "ShapedBuilder",
    "body",
    "backprop",
    "differentiate",
    "expand_body",
    "grad",
    "inline_private",
]
