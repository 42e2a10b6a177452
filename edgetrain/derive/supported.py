"""What edgetrain supports (numpy only): `edgetrain check --ops`, the standard ONNX ops the interpreter runs,
grouped by family, with those that have no gradient rule marked."""

from __future__ import annotations

import textwrap

from edgetrain.core.kernels import KERNELS

from .autodiff.registry import RULES

# kernel module -> the heading its ops are listed under by `edgetrain check --ops`, in this order
_OP_GROUPS = {
    "conv": "convolution and pooling",
    "pool": "convolution and pooling",
    "math": "matrix products, normalization, reductions, softmax",
    "normalization": "matrix products, normalization, reductions, softmax",
    "reductions": "matrix products, normalization, reductions, softmax",
    "softmax": "matrix products, normalization, reductions, softmax",
    "activations": "activations",
    "elementwise": "elementwise math, comparison and logic",
    "recurrent": "recurrent",
    "tensor": "shape and layout",
    "resize": "shape and layout",
    "cast": "shape and layout",
    "indexing": "gather, scatter and indexing",
    "quantized": "quantized",
    "qproducts": "quantized",
}


def ops_text(width: int = 100) -> str:
    """`edgetrain check --ops`: the standard ONNX ops edgetrain runs, grouped and wrapped; the ops without a
    gradient rule are in [brackets]."""
    groups: dict[str, list[str]] = {title: [] for title in _OP_GROUPS.values()}
    for op, k in sorted(KERNELS.items()):
        if not k.domain:
            module = k.fn.__module__.rsplit(".", 1)[-1]
            groups.setdefault(_OP_GROUPS.get(module, module), []).append(op)
    ops = [op for members in groups.values() for op in members]
    no_rule = [op for op in ops if op not in RULES]
    lines = textwrap.wrap(
        f"edgetrain runs these {len(ops)} standard ONNX ops (domain ai.onnx). {len(ops) - len(no_rule)} have "
        f"gradient rules; the {len(no_rule)} in [brackets] have none: a trainable parameter before one of them, "
        "on the way to the loss, cannot train (most of them give integers or booleans, which carry no gradient).",
        width,
    )
    for title, members in groups.items():
        if members:
            names = " ".join(op if op in RULES else f"[{op}]" for op in members)
            lines += ["", f"{title} ({len(members)}):"]
            lines += textwrap.wrap(
                names, width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
            )
    return "\n".join(lines)
