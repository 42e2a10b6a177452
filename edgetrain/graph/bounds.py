"""A node and its inputs (arrays, or TensorInfo where only the shape is known) -> the bytes running it would take,
before it runs (numpy only): its outputs' dtypes and shapes, and the padded copy its kernel works on, for every op
whose outputs can be larger than its inputs. A shape-only pass (shape inference, constant folding) refuses a node
beyond a bound here, before numpy is asked for the memory.

The ops of the interpreter fall in two sets, and a test holds every kernel to one of them: RULES predict the
outputs (upper bounds where the exact size depends on the data: NonZero, TopK); NON_INFLATING ops give outputs no
larger than their largest input, in elements and in bytes (elementwise maps, reductions, slices, rearrangements),
so a bound on the inputs bounds them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, ModelLimitError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.kernels.cast import ONNX_TO_NUMPY
from edgetrain.core.kernels.resize import resize_plan
from edgetrain.core.ops import record

_I64, _BOOL, _F32 = np.dtype(np.int64), np.dtype(np.bool_), np.dtype(np.float32)


@dataclass(frozen=True)
class Bound:
    """The most bytes one value (or a kernel's working copy) may take, and whose bound it is, in the words a
    refusal uses: '... more than the 4.0 GiB <whose>'."""

    limit: int
    whose: str


@dataclass(frozen=True)
class Need:
    """What running a node takes: its outputs (None where not predicted) and the scratch copy its kernel makes."""

    outputs: list[TensorInfo | None]
    scratch: TensorInfo | None = None
    scratch_what: str = ""


# ---- reading the inputs -----------------------------------------------------------------------------------
def _shape(a: Any) -> tuple[int, ...] | None:
    if a is None:
        return None
    shape = a.shape if isinstance(a, (np.ndarray, TensorInfo)) else np.shape(a)
    return (
        None
        if shape is None or not all(isinstance(d, (int, np.integer)) for d in shape)
        else tuple(int(d) for d in shape)
    )


def _dtype(a: Any) -> np.dtype:
    return np.dtype(a.dtype)


def _ints(a: Any) -> list[int] | None:
    """A small shape-like input's values as Python ints; None when only its shape is known."""
    if not isinstance(a, np.ndarray) or a.size > 4096:
        return None
    return [int(v) for v in a.reshape(-1)]


def _scalar(a: Any) -> float | int | None:
    if not isinstance(a, np.ndarray) or a.size < 1:
        return None
    return a.reshape(-1)[0].item()


def _like(a: Any, shape: Sequence[int], dtype: Any = None) -> TensorInfo:
    return TensorInfo(np.dtype(a.dtype if dtype is None else dtype), tuple(int(d) for d in shape))


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} of rank {rank}")
    return axis % rank


# ---- the rules: (node, inputs) -> Need ----------------------------------------------------------------------
_COMPARE = {"And", "Or", "Xor", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"}


def _broadcast(node: Node, args: Sequence[Any]) -> Need:
    shapes = [_shape(a) for a in args if a is not None]
    out = np.broadcast_shapes(*shapes)
    if node.op_type in _COMPARE:
        dtype = _BOOL
    else:  # Where: its values' dtype; the others: their operands' (at most the widest)
        values = [a for a in (args[1:] if node.op_type == "Where" else args) if a is not None]
        dtype = max((_dtype(a) for a in values), key=lambda d: d.itemsize)
    return Need([TensorInfo(dtype, tuple(out))])


def _cast(node: Node, args: Sequence[Any]) -> Need:
    to = ONNX_TO_NUMPY.get(node.attrs.get("to")) if node.op_type == "Cast" else _dtype(args[1])
    return Need([_like(args[0], _shape(args[0]), to)] if to is not None else [None])


def _eye_like(node: Node, args: Sequence[Any]) -> Need:
    to = node.attrs.get("dtype")
    return Need([_like(args[0], _shape(args[0]), None if to is None else ONNX_TO_NUMPY.get(to, _I64))])


def _arg_reduce(node: Node, args: Sequence[Any]) -> Need:
    shape = list(_shape(args[0]))
    a = _axis(int(node.attrs.get("axis", 0)), len(shape))
    shape[a] = 1 if node.attrs.get("keepdims", 1) else None
    return Need([_like(args[0], [d for d in shape if d is not None], _I64)])


def _non_zero(node: Node, args: Sequence[Any]) -> Need:
    shape = _shape(args[0])
    return Need([TensorInfo(_I64, (max(len(shape), 1), math.prod(shape)))])  # at most every element


def _top_k(node: Node, args: Sequence[Any]) -> Need:
    shape = _shape(args[0])  # K is at most the axis (the kernel refuses more): the input's shape bounds both
    return Need([_like(args[0], shape), TensorInfo(_I64, shape)])


def _constant_of_shape(node: Node, args: Sequence[Any]) -> Need:
    dims = _ints(args[0])
    value = node.attrs.get("value")
    dtype = np.asarray(value).dtype if value is not None else _F32
    return Need([None if dims is None else TensorInfo(dtype, tuple(dims))])


def _expand(node: Node, args: Sequence[Any]) -> Need:
    dims = _ints(args[1])
    return Need([None if dims is None else _like(args[0], np.broadcast_shapes(_shape(args[0]), tuple(dims)))])


def _tile(node: Node, args: Sequence[Any]) -> Need:
    reps = _ints(args[1])
    shape = _shape(args[0])
    if reps is None or len(reps) != len(shape):
        return Need([None])
    return Need([_like(args[0], [max(r, 0) * d for r, d in zip(reps, shape)])])


def _range(node: Node, args: Sequence[Any]) -> Need:
    s, l, d = (_scalar(a) for a in args[:3])
    if s is None or l is None or not d:
        return Need([None])
    if _dtype(args[0]).kind in "iu":
        n = -((int(s) - int(l)) // int(d))
    else:
        n = math.ceil((float(l) - float(s)) / float(d))
    return Need([_like(args[0], [max(n, 0)])])


def _reshape(node: Node, args: Sequence[Any]) -> Need:
    """The target as declared (0 copies a dimension): a size that differs from the input's is the kernel's error,
    but a target beyond the bound is named as such first."""
    dims, shape = _ints(args[1]), _shape(args[0])
    if dims is None or -1 in dims:  # an inferred dimension: as many elements as the input
        return Need([None])
    if not node.attrs.get("allowzero", 0):
        dims = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(dims)]
    return Need([_like(args[0], [max(d, 0) for d in dims])])


def _pad(node: Node, args: Sequence[Any]) -> Need:
    pads, shape = _ints(args[1]), list(_shape(args[0]))
    axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else list(range(len(shape)))
    if pads is None or axes is None or len(pads) != 2 * len(axes):
        return Need([None])
    for k, a in enumerate(axes):
        a = _axis(a, len(shape))
        shape[a] = max(shape[a] + pads[k] + pads[k + len(axes)], 0)
    return Need([_like(args[0], shape)])


def _resize(node: Node, args: Sequence[Any]) -> Need:
    shape = list(_shape(args[0]))
    given = [args[k] if k < len(args) else None for k in (1, 2, 3)]
    if any(g is not None and not isinstance(g, np.ndarray) for g in given):
        return Need([None])
    plan = resize_plan(
        tuple(shape), *given, node.attrs.get("axes"), node.attrs.get("keep_aspect_ratio_policy", "stretch")
    )
    for axis, n, *_ in plan:
        shape[axis] = n
    return Need([_like(args[0], shape)])


def _one_hot(node: Node, args: Sequence[Any]) -> Need:
    depth, shape = _scalar(args[1]), list(_shape(args[0]))
    if depth is None:
        return Need([None])
    a = int(node.attrs.get("axis", -1))
    shape.insert(a % (len(shape) + 1), max(int(depth), 0))
    return Need([_like(args[2], shape)])


def _gather(node: Node, args: Sequence[Any]) -> Need:
    data, idx = _shape(args[0]), _shape(args[1])
    a = _axis(int(node.attrs.get("axis", 0)), len(data))
    return Need([_like(args[0], data[:a] + idx + data[a + 1 :])])


def _gather_elements(node: Node, args: Sequence[Any]) -> Need:
    return Need([_like(args[0], _shape(args[1]))])


def _gather_nd(node: Node, args: Sequence[Any]) -> Need:
    data, idx = _shape(args[0]), _shape(args[1])
    b = int(node.attrs.get("batch_dims", 0))
    return Need([_like(args[0], idx[:-1] + data[b + idx[-1] :])])


def _concat(node: Node, args: Sequence[Any]) -> Need:
    shapes = [_shape(a) for a in args if a is not None]
    a = _axis(int(node.attrs["axis"]), len(shapes[0]))
    out = list(shapes[0])
    out[a] = sum(s[a] for s in shapes)
    return Need([_like(args[0], out)])


def _matmul(node: Node, args: Sequence[Any]) -> Need:
    a, b = _shape(args[0]), _shape(args[1])
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    rows, cols = (() if len(a) == 1 else (a2[-2],)), (() if len(b) == 1 else (b2[-1],))  # numpy's 1-D rule
    return Need([_like(args[0], np.broadcast_shapes(a2[:-2], b2[:-2]) + rows + cols)])


def _gemm(node: Node, args: Sequence[Any]) -> Need:
    a, b = _shape(args[0]), _shape(args[1])
    m = a[1] if node.attrs.get("transA", 0) else a[0]
    n = b[0] if node.attrs.get("transB", 0) else b[1]
    return Need([_like(args[0], (m, n))])


_LETTERS = re.compile(r"[A-Za-z]|\.\.\.")


def _einsum(node: Node, args: Sequence[Any]) -> Need:
    equation = str(node.attrs["equation"]).replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    size: dict[str, int] = {}
    ellipses = []
    for term, a in zip(lhs.split(","), args):
        labels, shape = _LETTERS.findall(term), _shape(a)
        fixed = len(labels) - ("..." in labels)
        k = 0
        for label in labels:
            if label == "...":
                span = len(shape) - fixed
                ellipses.append(shape[k : k + span])
                k += span
            else:
                size[label] = max(size.get(label, 1), shape[k])
                k += 1
    if "->" not in equation:  # implicit: the labels seen once, in order, after the ellipsis
        counts = {c: lhs.count(c) for c in size}
        rhs = ("..." if ellipses else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    out: list[int] = []
    for label in _LETTERS.findall(rhs):
        out.extend(np.broadcast_shapes(*ellipses) if label == "..." else [size[label]])
    return Need([_like(args[0], out)])


def _padded(x: tuple[int, ...], p: Sequence[int], out: Sequence[int], k, s, d) -> tuple[int, ...]:
    """The padded input a windowed kernel copies x into (kernels.window.pad_input's extent)."""
    nd = len(out)
    return x[:2] + tuple(max(p[i] + x[2 + i], (out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1) for i in range(nd))


def _per_axis(v, nd: int, default: int) -> list[int]:
    return [default] * nd if v is None else [int(t) for t in v]


def _conv(node: Node, args: Sequence[Any]) -> Need:
    x, w = _shape(args[0]), _shape(args[1])
    nd = len(x) - 2
    attrs = {k: node.attrs.get(k) for k in ("dilations", "pads", "strides")}
    from edgetrain.core.kernels.window import conv_output_shape  # start-up: import loads no kernels

    out, p = conv_output_shape(x[2:], w[2:], auto_pad=node.attrs.get("auto_pad", "NOTSET"), **attrs)
    s, d = _per_axis(attrs["strides"], nd, 1), _per_axis(attrs["dilations"], nd, 1)
    scratch = _like(args[0], _padded(x, p, out, w[2:], s, d))
    return Need([_like(args[0], (x[0], w[0], *out))], scratch, "the padded input it works on")


def _conv_transpose(node: Node, args: Sequence[Any]) -> Need:
    x, w = _shape(args[0]), _shape(args[1])
    keys = ("dilations", "output_padding", "output_shape", "pads", "strides")
    from edgetrain.core.kernels.window import conv_transpose_output_shape  # start-up: import loads no kernels

    out, p = conv_transpose_output_shape(
        x[2:], w[2:], auto_pad=node.attrs.get("auto_pad", "NOTSET"), **{k: node.attrs.get(k) for k in keys}
    )
    m = w[1] * int(node.attrs.get("group", 1))
    full = [o + p[i] + p[i + len(out)] for i, o in enumerate(out)]  # the uncropped result it computes first
    return Need([_like(args[0], (x[0], m, *out))], _like(args[0], (x[0], m, *full)), "its uncropped result")


def _pool(node: Node, args: Sequence[Any]) -> Need:
    x = _shape(args[0])
    nd, k = len(x) - 2, node.attrs["kernel_shape"]
    attrs = {key: node.attrs.get(key) for key in ("dilations", "pads", "strides")}
    from edgetrain.core.kernels.window import pool_output_shape  # start-up: import loads no kernels

    out, p = pool_output_shape(
        x[2:],
        k,
        auto_pad=node.attrs.get("auto_pad", "NOTSET"),
        ceil_mode=node.attrs.get("ceil_mode", 0),
        **attrs,
    )
    s, d = _per_axis(attrs["strides"], nd, 1), _per_axis(attrs["dilations"], nd, 1)
    y = _like(args[0], (*x[:2], *out))
    outs = [y, TensorInfo(_I64, y.shape)] if node.op_type == "MaxPool" else [y]
    return Need(outs, _like(args[0], _padded(x, p, out, k, s, d)), "the padded input it works on")


_F64, _U8, _I32 = np.dtype(np.float64), np.dtype(np.uint8), np.dtype(np.int32)


def _quantized(shape_rule: Callable[[Node, Sequence[Any]], Need], positions: tuple[int, ...], dtype_of):
    """The rule of a quantized op that computes a float op exactly, in float64 (kernels.quantized): the float
    op's output shape from the inputs at positions, of dtype_of(args), and its float64 working copy."""

    def rule(node: Node, args: Sequence[Any]) -> Need:
        base = shape_rule(node, [args[p] if p < len(args) else None for p in positions])
        shape = base.outputs[0].shape
        work = max(
            (TensorInfo(_F64, i.shape) for i in (base.outputs[0], base.scratch) if i is not None),
            key=lambda i: i.nbytes,
        )
        return Need([TensorInfo(np.dtype(dtype_of(args)), shape)], work, "its float64 working copy")

    return rule


def _given(args: Sequence[Any], k: int, default) -> np.dtype:
    """The dtype of input k (a zero point, a scale), or default when it is omitted."""
    return _dtype(args[k]) if k < len(args) and args[k] is not None else np.dtype(default)


def _quantize_linear(node: Node, args: Sequence[Any]) -> Need:
    to = ONNX_TO_NUMPY.get(node.attrs.get("output_dtype") or 2, _U8)
    return Need([_like(args[0], _shape(args[0]), _given(args, 2, to))])


def _dequantize_linear(node: Node, args: Sequence[Any]) -> Need:
    return Need([_like(args[0], _shape(args[0]), _given(args, 1, _F32))])


def _qlinear_concat(node: Node, args: Sequence[Any]) -> Need:
    joined = _concat(node, list(args[2::3]))
    return Need([TensorInfo(_given(args, 1, _U8), joined.outputs[0].shape)])


_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent(node: Node, args: Sequence[Any]) -> Need:
    x, w = _shape(args[0]), _shape(args[1])
    layout = int(node.attrs.get("layout", 0))
    steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
    hidden = int(node.attrs.get("hidden_size") or w[1] // _GATES[node.op_type])
    dirs = 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1
    y = (batch, steps, dirs, hidden) if layout else (steps, dirs, batch, hidden)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    outs = [_like(args[0], y), _like(args[0], state)] + (
        [_like(args[0], state)] if node.op_type == "LSTM" else []
    )
    return Need(
        outs, _like(args[0], (steps, batch, _GATES[node.op_type] * hidden)), "its gates at every step"
    )


RULES: dict[str, Callable[[Node, Sequence[Any]], Need]] = {
    **dict.fromkeys(
        "Add Sub Mul Div Pow Max Min Mean Sum Mod PRelu Where And Or Xor Equal Greater GreaterOrEqual Less "
        "LessOrEqual".split(),
        _broadcast,
    ),
    "Cast": _cast,
    "CastLike": _cast,
    "EyeLike": _eye_like,
    "ArgMax": _arg_reduce,
    "ArgMin": _arg_reduce,
    "NonZero": _non_zero,
    "TopK": _top_k,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "Reshape": _reshape,
    "Pad": _pad,
    "Resize": _resize,
    "OneHot": _one_hot,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "Concat": _concat,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "LSTM": _recurrent,
    "GRU": _recurrent,
    "RNN": _recurrent,
    # quantized ops (kernels.quantized), the standard ones and onnxruntime's com.microsoft ones
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "ConvInteger": _quantized(_conv, (0, 1), lambda a: _I32),
    "QLinearConv": _quantized(_conv, (0, 3), lambda a: _given(a, 7, _U8)),
    "MatMulInteger": _quantized(_matmul, (0, 1), lambda a: _I32),
    "QLinearMatMul": _quantized(_matmul, (0, 3), lambda a: _given(a, 7, _U8)),
    "DynamicQuantizeMatMul": _quantized(_matmul, (0, 1), lambda a: _F32),
    "MatMulIntegerToFloat": _quantized(_matmul, (0, 1), lambda a: _F32),
    "QGemm": _quantized(_gemm, (0, 3), lambda a: _F32 if len(a) < 8 or a[7] is None else _given(a, 8, _U8)),
    "QLinearAdd": _quantized(_broadcast, (0, 3), lambda a: _dtype(a[0])),
    "QLinearMul": _quantized(_broadcast, (0, 3), lambda a: _dtype(a[0])),
    "QLinearConcat": _qlinear_concat,
}

# Outputs no larger than the largest input, in elements and bytes (a bool mask beside its input, one int64 per
# sample of a loss): a bound on the inputs bounds them. Constant's value is already in the model.
NON_INFLATING = frozenset(
    (
        "Abs Ceil Celu Cos Elu Erf Exp Floor Gelu HardSigmoid HardSwish LeakyRelu Log Mish Neg Reciprocal Relu "
        "Round Selu Shrink Sigmoid Sign Sin Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Not IsInf IsNaN Clip "
        "Identity Transpose Flatten Squeeze Unsqueeze Slice Split Dropout Softmax LogSoftmax Hardmax "
        "BatchNormalization LayerNormalization InstanceNormalization GroupNormalization LRN DepthToSpace "
        "SpaceToDepth GlobalAveragePool GlobalMaxPool CumSum ReverseSequence ScatterElements ScatterND Trilu "
        "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum "
        "ReduceSumSquare Shape Size Constant DynamicQuantizeLinear QLinearGlobalAveragePool QLinearLeakyRelu "
        "QLinearSigmoid QLinearSoftmax"
    ).split()
)


def need(node: Node, args: Sequence[Any]) -> Need | None:
    """What running node on args takes, before it runs; None when nothing beyond its inputs' size (a
    NON_INFLATING op), when an input a rule needs is unknown, or when the node is malformed (its kernel then says
    what is wrong, in its own words). edgetrain's fused ops answer by their records' shape functions."""
    rule = RULES.get(node.op_type)  # op types are unique across the domains edgetrain runs (core.ops)
    shape_of = record(node.op_type).shape if rule is None else None
    if rule is None and shape_of is None:
        return None
    first = 2 if node.op_type == "QLinearConcat" else 0  # its first tensor follows Y_scale and Y_zero_point
    if node.inputs and (len(args) <= first or args[first] is None or _shape(args[first]) is None):
        return None
    try:
        if rule is not None:
            return rule(node, args)
        infos = [None if a is None else a if isinstance(a, TensorInfo) else _like(a, _shape(a)) for a in args]
        return Need(list(shape_of(node, infos)))
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, EdgeTrainError):
        return None


def check_node(node: Node, args: Sequence[Any], bound: Bound) -> Need | None:
    """Refuses (ModelLimitError naming the node, its op, the value, its dtype and shape, the bytes and the bound)
    a node whose outputs or working copy would be larger than bound.limit; returns what it needs."""
    found = need(node, args)
    if found is None:
        return None
    named = [
        (f"its output '{o}'", info) for o, info in zip(node.outputs, found.outputs) if o and info is not None
    ]
    if found.scratch is not None:
        named.append((found.scratch_what, found.scratch))
    for what, info in named:
        n = info.nbytes
        if n is not None and n > bound.limit:
            raise ModelLimitError(
                f"{node.label}: {what} would be {info}, {size_text(n)}, more than the {size_text(bound.limit)} "
                f"{bound.whose}; it was refused before anything that size was allocated: check the model's shapes "
                "(and the shapes and values fed)",
                limit=bound.limit,
                needed=n,
            )
    return found


def size_text(n: int) -> str:
    """Bytes for a person: '37.3 GiB' (or 'about 2**200 bytes')."""
    if n >= 1 << 60:
        return f"about 2**{n.bit_length() - 1} bytes"
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} bytes"
