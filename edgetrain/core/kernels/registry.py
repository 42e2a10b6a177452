"""The kernels: one numpy function per ONNX op, registered by decorator into the op's record (edgetrain.core.ops).

Conventions every kernel follows (the interpreter and the autodiff rely on them):
- inputs are positional, in the ONNX order of the op's newest form (the importer rewrites older opsets into it);
  an omitted optional input arrives as None; variadic ops take *inputs;
- ONNX attributes are keyword-only parameters with the spec's defaults (names exactly as in the spec);
- `out=None` (keyword) marks a kernel that can write its first output into a preallocated buffer of the right
  shape and dtype; it must then return that buffer;
- `noutputs` (keyword) marks a kernel with optional outputs: the interpreter passes how many outputs the node
  asked for, so work for unused outputs (e.g. MaxPool's Indices) is skipped;
- `view=` on the decorator marks a kernel whose outputs may be views of its first input (Reshape, Transpose,
  Slice, ...; a kernel without inputs, Constant, returns an array it owns): the memory planner gives such outputs no
  buffer and keeps the input's buffer alive while they are. view="reshape" promises more: the view holds the
  input's bytes in the input's order (a reshape of a contiguous input), so an elementwise op may write over it in
  place. `view_if=` makes the view conditional on the node (attributes, constant inputs), see DYNAMIC below;
- `inplace=` marks a kernel (with out=) that stays correct when out is the very memory of one of the given
  inputs (True: any input) of the same dtype and shape: each output element is computed from the same element of
  the inputs, and no input is read again after out is written (a ufunc call is; a kernel that writes out, then
  reads an input again, is not);
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

import numpy as np

from edgetrain.core.ops import PRIVATE_DOMAIN, register

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
    aliases_input: bool = False  # outputs may be views of input 0 (see view= above)
    keeps_layout: bool = False  # ... and then hold input 0's bytes in its order (view="reshape")
    view_if: Callable[..., bool] | None = None  # view only when view_if(attrs, consts) holds
    inplace: tuple[int, ...] = ()  # inputs whose memory out= may be (see inplace= above)


__all__ = ["DYNAMIC", "PRIVATE_DOMAIN", "Kernel", "kernel"]

# view_if conditions: (attrs, consts) -> bool, where consts[k] is the value of input k when the graph fixes it (an
# initializer), None when the input is omitted, and DYNAMIC when it is computed at run time. A condition that
# cannot decide says False: the output then gets its own buffer (and a copy when the kernel returns a view).
DYNAMIC = object()


def _const(consts, k: int):
    return consts[k] if k < len(consts) else None


def noop_reduction(attrs, consts) -> bool:
    """A Reduce* node with empty axes and noop_with_empty_axes=1 returns its input itself."""
    axes = _const(consts, 1)
    return bool(attrs.get("noop_with_empty_axes", 0)) and (
        axes is None or axes is not DYNAMIC and np.size(axes) == 0
    )


def inference_dropout(attrs, consts) -> bool:
    """Dropout outside training mode (or with ratio 0) returns its input itself."""
    ratio, mode = _const(consts, 1), _const(consts, 2)
    if mode is None or mode is not DYNAMIC and not np.asarray(mode).item():
        return True
    return ratio is not None and ratio is not DYNAMIC and float(np.asarray(ratio).item()) == 0


def kernel(
    *op_types: str,
    domain: str = "",
    view: bool | str = False,
    view_if: Callable[..., bool] | None = None,
    inplace: bool | tuple[int, ...] = False,
    shape: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers fn as the kernel of each op type given (in domain ai.onnx unless told otherwise) in the op's
    record; op type names are unique across domains. view, view_if and inplace tell the memory planner what the
    kernel's outputs may share with its inputs (see the module docstring). shape, for edgetrain's own ops (which
    onnx's shape inference does not know): (node, input TensorInfos) -> output TensorInfos."""
    assert view in (False, True, "reshape"), f"view={view!r}: use True or 'reshape'"

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
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
        writes_out = "out" in sig.parameters
        if inplace is True:
            assert n_max is not None, f"{fn.__name__}: a variadic kernel names its in-place inputs"
            ins: tuple[int, ...] = tuple(range(n_max))
        else:
            ins = tuple(inplace or ())
        assert not ins or writes_out, f"{fn.__name__}: in place means writing out= over an input"
        for op in op_types:
            register(
                op,
                "kernel",
                Kernel(
                    op,
                    fn,
                    attrs,
                    writes_out,
                    "noutputs" in sig.parameters,
                    (n_req, n_max),
                    domain,
                    aliases_input=bool(view),
                    keeps_layout=view == "reshape",
                    view_if=view_if,
                    inplace=ins,
                ),
                domain=domain,
            )
            if shape is not None:
                register(op, "shape", shape)
        return fn

    return add
