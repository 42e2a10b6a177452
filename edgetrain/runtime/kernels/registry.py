"""The kernel table: one numpy function per ONNX op, registered by decorator.

Conventions every kernel follows (the interpreter and the autodiff rely on them):
- inputs are positional, in the ONNX order of the op's newest form (the importer rewrites older opsets into it);
  an omitted optional input arrives as None; variadic ops take *inputs;
- ONNX attributes are keyword-only parameters with the spec's defaults (names exactly as in the spec);
- `out=None` (keyword) marks a kernel that can write its first output into a preallocated buffer of the right
  shape and dtype; it must then return that buffer;
- `noutputs` (keyword) marks a kernel with optional outputs: the interpreter passes how many outputs the node
  asked for, so work for unused outputs (e.g. MaxPool's Indices) is skipped;
- the result is one array, or a tuple of arrays for several outputs; dtypes follow the spec exactly
  (float32 in, float32 out: no silent promotion to float64);
- a user-caused failure (an attribute value the kernel does not support, say) raises an EdgeTrainError subclass
  whose message names the attribute and what would work; the interpreter adds the node's name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Parameters of a kernel that are not ONNX attributes.
RESERVED = ("out", "noutputs")


@dataclass(frozen=True)
class Kernel:
    op_type: str
    fn: Callable[..., Any]
    attrs: dict[str, Any]  # ONNX attribute name -> default (inspect.Parameter.empty when required)
    writes_out: bool
    wants_noutputs: bool
    n_inputs: tuple[int, int | None]  # (required positional inputs, max or None when variadic)
    domain: str = ""  # "" for ai.onnx; PRIVATE_DOMAIN for edgetrain's fused backward ops


# edgetrain's own ops (fused gradient kernels); each has an ONNX function body in standard ops, so a graph that
# uses them still runs in any ONNX runtime.
PRIVATE_DOMAIN = "com.edgetrain"


KERNELS: dict[str, Kernel] = {}


def kernel(*op_types: str, domain: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers fn as the kernel of each op type given (in domain ai.onnx unless told otherwise); op type
    names are unique across domains."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        attrs, n_req, n_max = {}, 0, 0
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name not in RESERVED:
                attrs[p.name] = p.default
            elif p.kind is p.POSITIONAL_OR_KEYWORD or p.kind is p.POSITIONAL_ONLY:
                n_max += 1
                n_req += p.default is p.empty
            elif p.kind is p.VAR_POSITIONAL:
                n_max = None
        for op in op_types:
            assert op not in KERNELS, f"two kernels registered for {op}"
            KERNELS[op] = Kernel(
                op, fn, attrs, "out" in sig.parameters, "noutputs" in sig.parameters, (n_req, n_max), domain
            )
        return fn

    return register
