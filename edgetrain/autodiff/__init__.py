"""Reverse-mode autodiff over the IR (build side; needs no onnx): differentiate(), the rule table, the context
rules build with, and the standard-op bodies of edgetrain's fused backward ops."""

from .context import GradContext, ShapedBuilder
from .driver import RULES, backprop, differentiate, grad
from .functions import BODIES, body, expand_body, inline_private

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
