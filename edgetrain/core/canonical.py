"""Older op versions -> the newest form of the op (numpy only): each function rewrites one imported node, adding
constant inputs through the builder; edgetrain.core.ops says which op uses which rewrite, and below which version.

Attributes that later opsets turned into inputs (Slice, Squeeze, Unsqueeze, Split, Reduce*, Pad, Clip, Dropout,
TopK) become constant inputs, and the pre-13 flatten-to-2-D Softmax family becomes Flatten -> Softmax(axis=-1) ->
Reshape, so the interpreter, the autodiff and the emitted training graphs see one semantics per op type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import UnsupportedError
from .ir import GraphBuilder, Node

# rewrite(builder, node) -> the node in its newest form, or None when the rewrite appended the nodes itself
Rewrite = Callable[[GraphBuilder, Node], "Node | None"]


def _const(b: GraphBuilder, node: Node, what: str, value: Any, dtype: str) -> str:
    return b.initializer(f"{node.name}_{what}", np.asarray(value, dtype=dtype))


def attrs_to_inputs(b: GraphBuilder, node: Node, *, attrs: Sequence[tuple[str, str]], n_data: int) -> Node:
    """Moves attributes into trailing constant inputs (named by attrs: (attribute, dtype)), after n_data
    inputs; an absent attribute becomes an omitted input, trailing omitted ones are dropped."""
    inputs = list(node.inputs[:n_data]) + [""] * max(0, n_data - len(node.inputs))
    rest = dict(node.attrs)
    for attr, dtype in attrs:
        inputs.append(_const(b, node, attr, rest.pop(attr), dtype) if attr in rest else "")
    while inputs and not inputs[-1]:
        inputs.pop()
    return node.replace(inputs=tuple(inputs), attrs=rest)


def moved(*attrs: tuple[str, str], n_data: int = 1) -> Rewrite:
    """The rewrite of an op whose attributes (name, dtype) became inputs after its n_data data inputs."""
    return lambda b, n: attrs_to_inputs(b, n, attrs=attrs, n_data=n_data)


def softmax_pre13(b: GraphBuilder, node: Node) -> None:
    # Pre-13 Softmax coerces the input to 2-D at `axis` and normalises each row: Flatten, softmax over the
    # last axis, reshape back. Shape inference later drops the Flatten/Reshape when they change nothing.
    axis = node.attrs.get("axis", 1)
    x, y = node.inputs[0], node.outputs[0]
    flat = b.add1("Flatten", x, attrs={"axis": axis}, name=f"{node.name}_flatten")
    soft = b.add1(node.op_type, flat, attrs={"axis": -1}, name=node.name)
    shape = b.add1("Shape", x, name=f"{node.name}_shape")
    b.add("Reshape", [soft, shape], outputs=[y], name=f"{node.name}_reshape")


def split_pre18(b: GraphBuilder, node: Node) -> Node:
    if "split" in node.attrs:  # Split-2/11: sizes as an attribute
        node = attrs_to_inputs(b, node, attrs=[("split", "int64")], n_data=1)
    if len(node.inputs) < 2 or not node.inputs[1]:
        node = node.replace(attrs={**node.attrs, "num_outputs": len(node.outputs)})
    return node


def batchnorm_pre9(b: GraphBuilder, node: Node) -> Node:
    attrs = dict(node.attrs)
    if attrs.pop("spatial", 1) != 1:
        raise UnsupportedError(
            f"{node.label}: spatial=0 (per-activation statistics) is not supported; "
            "only the standard per-channel BatchNormalization (spatial=1)"
        )
    attrs.pop("is_test", None)
    attrs.pop("consumed_inputs", None)
    return node.replace(attrs=attrs)


def dropout_pre12(b: GraphBuilder, node: Node) -> Node:
    attrs = dict(node.attrs)
    attrs.pop("is_test", None)
    return attrs_to_inputs(b, node.replace(attrs=attrs), attrs=[("ratio", "float32")], n_data=1)


def pad_pre11(b: GraphBuilder, node: Node) -> Node:
    attrs = dict(node.attrs)
    pads = _const(b, node, "pads", attrs.pop("pads"), "int64")
    value = _const(b, node, "value", attrs.pop("value", 0.0), "float32")
    return node.replace(inputs=(node.inputs[0], pads, value), attrs=attrs)


def topk_pre10(b: GraphBuilder, node: Node) -> Node:
    # K became a 1-element 1-D input
    return attrs_to_inputs(
        b, node.replace(attrs={**node.attrs, "k": [node.attrs["k"]]}), attrs=[("k", "int64")], n_data=1
    )


def groupnorm_pre21(b: GraphBuilder, node: Node) -> Node:
    # GroupNormalization-18 scales per group, -21 (the kernel's form) per channel: refuse rather than misread.
    raise UnsupportedError(
        f"{node.label}: GroupNormalization before opset 21 has per-group scale and bias, "
        "which edgetrain does not support; export the model at opset 21 (per-channel)"
    )


def scatter(b: GraphBuilder, node: Node) -> Node:
    return node.replace(op_type="ScatterElements")
