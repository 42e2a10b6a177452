"""One record per op (numpy only): op type -> everything edgetrain knows about it, found in this one place.

A record says which inputs hold parameters by role (weights, biases, scales, embedding tables), which are
statistics or shape-deciding values (never parameters), whether the op is random or data-dependent, whether it
only rearranges its input (so a weight read through it is still the initializer under it), how an older opset's
form is rewritten into the newest (edgetrain.core.canonical), how it treats the rows of a batch (edgetrain.core.rows:
the frozen-prefix cache), whether it is worth caching, which inputs are per-sample recurrent states, and why it has
no gradient rule when it has none.

Three more fields are filled by the layer that defines them, when it is imported, by decorator: `kernel` (and a
fused op's `shape` function) by edgetrain.core.kernels (@kernel), `rule` and a fused op's standard-op `body` by
edgetrain.derive.autodiff (@grad, @body). Read kernels through edgetrain.core.kernels.KERNELS and rules through
edgetrain.derive.autodiff.RULES: those load every module that registers. A new op is one record here, one kernel,
one gradient rule (or the reason it has none): see CONTRIBUTING.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import canonical as cn
from . import rows

# edgetrain's own ops (fused backward kernels, the fused softmax cross-entropy); each has an ONNX function body in
# standard ops, so a graph that uses them still runs in any ONNX runtime.
PRIVATE_DOMAIN = "com.edgetrain"
# onnxruntime's contrib ops: the quantized ones its quantizer writes (QOperator form) are read and run
MICROSOFT_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class QParams:
    """Where one quantized tensor's scale and zero point are among a node's inputs: the import checks them
    (positive finite scales, zero points of the tensor's integer type, per-channel lengths) before anything is
    allocated, and the QAT step will read them."""

    value: int  # input position of the integer tensor; -1: the node's output 0 (QuantizeLinear's y)
    scale: int
    zero_point: int | None  # None: the op has no zero point for it
    # the axis of `value` a 1-D scale runs along: a fixed axis, or (attrs, rank) -> axis; None: per-tensor only
    axis: int | Callable[[dict, int], int] | None = None


def _attr_axis(attrs: dict, rank: int) -> int:
    return int(attrs.get("axis", 1))


@dataclass(eq=False)
class OpRecord:
    op_type: str
    domain: str = ""  # "" for ai.onnx; PRIVATE_DOMAIN for edgetrain's own ops
    # inputs (position -> role) that are parameters when a float initializer feeds them
    weights: dict[int, str] = field(default_factory=dict)
    # the position of the op's own bias among `weights`: an Add after the op is then not a bias (see params.py)
    bias: int | None = None
    linear: bool = (
        False  # a linear map of its input by its weights: a constant added to its output is its bias
    )
    # inputs (position -> what) that are statistics or settings: never parameters, whatever their dtype
    statistics: dict[int, str] = field(default_factory=dict)
    # inputs whose values decide the output shape: constants after folding, or the shapes depend on the data
    shape_inputs: tuple[int, ...] = ()
    random: bool = False  # output is random: never folded, never cached, even on constant inputs
    data_dependent: bool = False  # output shape depends on the data: cannot be planned statically
    rearranges: bool = (
        False  # output 0 holds input 0's values rearranged or retyped (Transpose, Reshape, Cast)
    )
    normalizes: bool = (
        False  # output 0 is normalized (zero mean / unit scale): a Mul by a constant after it scales
    )
    # (since, rewrite): a node of an older version (its schema's since_version < since) is rewritten by it
    upgrade: tuple[int, Callable[..., Any]] | None = None
    # how it treats the rows of a batch (edgetrain.core.rows); None: it may mix samples (the cache stops there)
    rows: rows.Rule | None = None
    heavy: bool = False  # costly enough that a frozen prefix holding it is worth caching
    sequential: bool = (
        False  # loops in Python over a sequence axis: shapes by rule beyond a length (passes.py)
    )
    reads_shape: bool = False  # reads only its input's shape, never its values (Shape, Size)
    batch_states: tuple[
        int, ...
    ] = ()  # inputs holding one state per sample (initial_h, initial_c): re-batched
    folds: bool = True  # False: never folded, even on constants (DequantizeLinear: int8 weights stay int8)
    quantized: tuple[QParams, ...] = ()  # its quantized tensors' scales and zero points (QParams)
    no_rule: str = ""  # why the op has no gradient rule (every op with a kernel has a rule or a reason)
    rule_advice: str = ""  # how to write it with ops that have rules: "Or, to train them too, <advice>"
    # ---- registered by the layers that define them (see the module docstring)
    kernel: Any = None  # edgetrain.core.kernels.registry.Kernel
    shape: Callable[..., Any] | None = (
        None  # a fused op's output TensorInfos from its inputs' (onnx knows no rule)
    )
    rule: Callable[..., Any] | None = None  # edgetrain.derive.autodiff's gradient rule
    body: Callable[..., Any] | None = (
        None  # a fused op's standard-op body builder (edgetrain.derive.autodiff)
    )


def _all(names: str, **fields: Any) -> list[OpRecord]:
    """Records of the ops named (space-separated) that share everything else."""
    return [OpRecord(op, **fields) for op in names.split()]


# Why ops without a gradient rule have none (the op records' `no_rule`).
_BOOLEAN = "its output is boolean: no gradient flows back through it"
_INDICES = "its output holds integer indices: no gradient flows back through it"
_NO_FLOAT_INPUT = "its output does not depend on the values of a float input"
_SHAPE_ONLY = "it reads only its input's shape"
_BACKWARD = "a backward op the autodiff writes: edgetrain differentiates once"
_NOT_YET = "no rule has been written for it yet"
_QUANTIZED = (
    "it computes on integers: convert lowers an int8 model to float ops read through FakeQuantize "
    "(edgetrain.graph.quantized) before it takes gradients"
)
_QUANTIZED_ADVICE = (
    "convert the int8 model as it is: its weights train as float masters through fake quantization"
)


def _q(op: str, *params: tuple, domain: str = "", **fields: Any) -> OpRecord:
    """The record of a quantized op: no gradient rule (convert lowers it first), its scales and zero points as
    QParams(value, scale, zero point[, axis])."""
    return OpRecord(
        op,
        domain=domain,
        quantized=tuple(QParams(*p) for p in params),
        no_rule=_QUANTIZED,
        rule_advice=_QUANTIZED_ADVICE,
        **fields,
    )


def _last(attrs: dict, rank: int) -> int:
    return rank - 1


def _qgemm_b(attrs: dict, rank: int) -> int:
    return 0 if attrs.get("transB", 0) else 1


_MS = MICROSOFT_DOMAIN
# the quantized ops: QDQ, dynamic (integer products), QOperator, and onnxruntime's contrib ops its quantizer writes
_QUANTIZED_OPS = [
    _q("QuantizeLinear", (-1, 1, 2, _attr_axis), rows=rows.on_axis(1)),
    # never folded: the int8 weights under it stay int8 in the graph and the artifact (4x smaller than float)
    _q("DequantizeLinear", (0, 1, 2, _attr_axis), folds=False, rows=rows.on_axis(1)),
    _q("DynamicQuantizeLinear"),
    _q("MatMulInteger", heavy=True),
    _q("ConvInteger", heavy=True),
    _q("QLinearConv", (0, 1, 2), (3, 4, 5, 0), (-1, 6, 7), heavy=True, rows=rows.per_sample),
    _q("QLinearMatMul", (0, 1, 2, lambda a, r: r - 2), (3, 4, 5, _last), (-1, 6, 7), heavy=True),
    _q("MatMulIntegerToFloat", (0, 2, 4, lambda a, r: r - 2), (1, 3, 5, _last), domain=_MS, heavy=True),
    _q("DynamicQuantizeMatMul", (1, 2, 3, _last), domain=_MS, heavy=True),
    _q("QGemm", (0, 1, 2), (3, 4, 5, _qgemm_b), (-1, 7, 8), domain=_MS, heavy=True),
    *[_q(op, (0, 1, 2), (3, 4, 5), (-1, 6, 7), domain=_MS) for op in ("QLinearAdd", "QLinearMul")],
    *[
        _q(op, (0, 1, 2), (-1, 3, 4), domain=_MS, rows=rows.per_sample)
        for op in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool")
    ],
    _q("QLinearSoftmax", (0, 1, 2), (-1, 3, 4), domain=_MS),
    _q("QLinearConcat", (-1, 0, 1), domain=_MS),
]

_TABLE: list[OpRecord] = [
    # ---- ops with parameters by role
    OpRecord("Conv", weights={1: "weight", 2: "bias"}, bias=2, linear=True, rows=rows.per_sample, heavy=True),
    OpRecord(
        "ConvTranspose",
        weights={1: "weight", 2: "bias"},
        bias=2,
        linear=True,
        rows=rows.per_sample,
        heavy=True,
    ),
    OpRecord(
        "Gemm", weights={0: "weight", 1: "weight", 2: "bias"}, bias=2, linear=True, rows=rows.gemm, heavy=True
    ),
    # a constant MatMul operand is a weight; its bias, if any, is an Add after it
    OpRecord("MatMul", weights={0: "weight", 1: "weight"}, linear=True, rows=rows.matmul, heavy=True),
    OpRecord("Einsum", weights={k: "weight" for k in range(8)}, linear=True, heavy=True),
    OpRecord("Gather", weights={0: "embedding table"}, rows=rows.gather),
    OpRecord("PRelu", weights={1: "slope"}, rows=rows.elementwise),
    OpRecord(
        "BatchNormalization",
        weights={1: "scale", 2: "bias"},
        statistics={3: "running mean", 4: "running variance"},
        normalizes=True,
        upgrade=(9, cn.batchnorm_pre9),
        rows=rows.batchnorm,
    ),
    OpRecord("LayerNormalization", weights={1: "scale", 2: "bias"}, normalizes=True, rows=rows.layernorm),
    OpRecord("InstanceNormalization", weights={1: "scale", 2: "bias"}, normalizes=True, rows=rows.per_sample),
    OpRecord(
        "GroupNormalization",
        weights={1: "scale", 2: "bias"},
        normalizes=True,
        upgrade=(21, cn.groupnorm_pre21),
        rows=rows.per_sample,
    ),
    OpRecord("LpNormalization", normalizes=True, rows=rows.on_axis(-1)),
    OpRecord("MeanVarianceNormalization", normalizes=True, rows=rows.mvn),
    *[
        OpRecord(
            op,
            weights={1: "input weights W", 2: "recurrence weights R", 3: "bias B"},
            heavy=True,
            sequential=True,
            batch_states=(5,),
            rows=rows.recurrent,
        )
        for op in ("RNN", "GRU")
    ],
    OpRecord(
        "LSTM",
        weights={1: "input weights W", 2: "recurrence weights R", 3: "bias B", 7: "peepholes P"},
        heavy=True,
        sequential=True,
        batch_states=(5, 6),
        rows=rows.recurrent,
    ),
    # ---- ops that only rearrange or retype their input: a weight read through them is the initializer under them
    OpRecord("Identity", rearranges=True, rows=rows.elementwise),
    OpRecord("Transpose", rearranges=True, rows=rows.transpose),
    OpRecord("Cast", rearranges=True, rows=rows.elementwise),
    OpRecord("Flatten", rearranges=True, rows=rows.on_axis(1)),
    OpRecord("Reshape", rearranges=True, shape_inputs=(1,), rows=rows.reshape),
    *[
        OpRecord(
            op, rearranges=True, shape_inputs=(1,), upgrade=(13, cn.moved(("axes", "int64"))), rows=rows.axes
        )
        for op in ("Squeeze", "Unsqueeze")
    ],
    # ---- shape-deciding inputs
    OpRecord("Expand", shape_inputs=(1,), rows=rows.expand),
    OpRecord("ConstantOfShape", shape_inputs=(0,), no_rule=_NO_FLOAT_INPUT),
    OpRecord("Tile", shape_inputs=(1,), rows=rows.tile),
    OpRecord(
        "Slice",
        shape_inputs=(1, 2, 3, 4),
        upgrade=(10, cn.moved(("starts", "int64"), ("ends", "int64"), ("axes", "int64"))),
        rows=rows.slices,
    ),
    OpRecord("Pad", shape_inputs=(1, 3), upgrade=(11, cn.pad_pre11), rows=rows.pad),
    OpRecord("Split", shape_inputs=(1,), upgrade=(18, cn.split_pre18), rows=rows.split),
    OpRecord("Range", shape_inputs=(0, 1, 2), no_rule=_NO_FLOAT_INPUT),
    OpRecord(
        "TopK",
        shape_inputs=(1,),
        upgrade=(10, cn.topk_pre10),
        no_rule=_NOT_YET,
        rule_advice="read its values as GatherElements of the input at its indices",
    ),
    OpRecord("OneHot", shape_inputs=(1,), no_rule=_NO_FLOAT_INPUT),
    OpRecord("Resize", shape_inputs=(1, 2, 3), rows=rows.per_sample),
    OpRecord("Upsample", shape_inputs=(1,), rows=rows.per_sample),
    OpRecord("CumSum", shape_inputs=(1,)),
    OpRecord("EyeLike", no_rule=_NO_FLOAT_INPUT),
    *[
        # axes became an input in opset 13 for ReduceSum, in 18 for the other reductions
        OpRecord(
            op,
            shape_inputs=(1,),
            upgrade=(13 if op == "ReduceSum" else 18, cn.moved(("axes", "int64"))),
            rows=rows.axes,
        )
        for op in (
            "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ReduceL2 ReduceLogSum "
            "ReduceLogSumExp"
        ).split()
    ],
    # ---- other opset rewrites
    OpRecord("Clip", upgrade=(11, cn.moved(("min", "float32"), ("max", "float32"))), rows=rows.elementwise),
    OpRecord("Dropout", upgrade=(12, cn.dropout_pre12), rows=rows.dropout),
    OpRecord("Softmax", upgrade=(13, cn.softmax_pre13), rows=rows.on_axis(-1)),
    OpRecord("LogSoftmax", upgrade=(13, cn.softmax_pre13), rows=rows.on_axis(-1)),
    OpRecord(
        "Hardmax",
        upgrade=(13, cn.softmax_pre13),
        rows=rows.on_axis(-1),
        no_rule="it is piecewise constant: its gradient is zero wherever it is defined",
        rule_advice="use Softmax, its differentiable counterpart",
    ),
    OpRecord("Scatter", upgrade=(99, cn.scatter)),  # deprecated: always ScatterElements
    # ---- elementwise: rows stay apart when every operand is a row, or a constant without a batch axis
    *_all(
        "Abs Add Ceil Celu CastLike Cos Div Elu Erf Exp Floor Gelu HardSigmoid HardSwish LeakyRelu Log Max Mean "
        "Min Mish Mul Neg Pow Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Softplus Softsign Sqrt Sub Sum "
        "Tan Tanh ThresholdedRelu Where",
        rows=rows.elementwise,
    ),
    *_all(
        "And Or Xor Not Equal Greater GreaterOrEqual Less LessOrEqual IsInf IsNaN",
        rows=rows.elementwise,
        no_rule=_BOOLEAN,
    ),
    OpRecord(
        "Mod",
        rows=rows.elementwise,
        no_rule=_NOT_YET,
        rule_advice="write x mod y as x - y * Floor(x / y), with Sign(q) * Floor(Abs(q)) for Floor(q) when fmod=1",
    ),
    # ---- each sample by itself, with constant settings
    *_all("DepthToSpace SpaceToDepth GlobalAveragePool GlobalLpPool GlobalMaxPool LRN", rows=rows.per_sample),
    *_all("AveragePool", rows=rows.per_sample, heavy=True),
    OpRecord("MaxPool", rows=rows.maxpool, heavy=True),
    OpRecord(
        "LpPool",
        rows=rows.per_sample,
        no_rule=_NOT_YET,
        rule_advice="write it as Pow(kernel size * AveragePool(Pow(Abs(x), p)), 1/p) with count_include_pad=1",
    ),
    *_all("ArgMax ArgMin", rows=rows.on_axis(0), no_rule=_INDICES),
    OpRecord("Concat", rows=rows.on_axis(0, then=rows.elementwise)),
    # ---- the rest of the ops the interpreter runs (they may mix the samples of a batch)
    *_all("GatherElements GatherND ReverseSequence ScatterElements ScatterND Trilu"),
    OpRecord("Constant", no_rule=_NO_FLOAT_INPUT),
    *_all("Shape Size", reads_shape=True, no_rule=_SHAPE_ONLY),
    # ---- random and data-dependent ops
    *_all("RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli", random=True),
    OpRecord("NonZero", data_dependent=True, no_rule=_INDICES),
    *_all("Unique Compress NonMaxSuppression StringSplit", data_dependent=True),
    # ---- edgetrain's own ops: the fused backward kernels, and the fused softmax cross-entropy
    OpRecord("SoftmaxCrossEntropy", domain=PRIVATE_DOMAIN),
    *_all(
        "ReluGrad SoftmaxCrossEntropyGrad ConvGradInput ConvGradWeight MaxPoolGrad AveragePoolGrad",
        domain=PRIVATE_DOMAIN,
        no_rule=_BACKWARD,
    ),
    *_all("LSTMGrad GRUGrad RNNGrad", domain=PRIVATE_DOMAIN, sequential=True, no_rule=_BACKWARD),
    # the recurrences' training-mode forwards: the op's outputs and the trace their fused backward reads
    *_all(
        "LSTMTrain GRUTrain RNNTrain",
        domain=PRIVATE_DOMAIN,
        heavy=True,
        sequential=True,
        no_rule=(
            "a training-mode forward the autodiff writes, read by its fused backward: edgetrain differentiates once"
        ),
    ),
    # activation recomputation (edgetrain.graph.recompute): x passed on once token exists, so that a forward value
    # recomputed for the backward is computed when the backward reaches it, not as soon as its inputs are ready
    OpRecord("After", domain=PRIVATE_DOMAIN, no_rule=_BACKWARD),
    # quantization-aware training: QuantizeLinear -> DequantizeLinear as one op (a float master weight read through
    # its int8 grid, an activation's quantization); a weight read through it is still the initializer under it
    OpRecord(
        "FakeQuantize",
        domain=PRIVATE_DOMAIN,
        rearranges=True,
        quantized=(QParams(0, 1, 2, _attr_axis),),
        rows=rows.on_axis(1),
    ),
    OpRecord("FakeQuantizeGrad", domain=PRIVATE_DOMAIN, no_rule=_BACKWARD, rows=rows.on_axis(1)),
    # the transformer fast paths of a training step (edgetrain.graph.fuse): Gelu keeping Phi(x) for its backward,
    # softmax attention keeping its probabilities (only where a gradient flows: never in a frozen prefix), and
    # the fused backward ops
    OpRecord("GeluTraining", domain=PRIVATE_DOMAIN, rows=rows.elementwise),
    OpRecord("SoftmaxAttention", domain=PRIVATE_DOMAIN),
    *_all("GeluGrad LayerNormGrad SoftmaxAttentionGrad", domain=PRIVATE_DOMAIN, no_rule=_BACKWARD),
    *_QUANTIZED_OPS,
]
OPS: dict[str, OpRecord] = {r.op_type: r for r in _TABLE}
# the ops of an int8 model: they run; training lowers them to float ops and FakeQuantize (edgetrain.graph.quantized)
QUANTIZED_OPS = frozenset(r.op_type for r in _QUANTIZED_OPS)
assert len(OPS) == len(_TABLE), "two records for one op"


def record(op_type: str) -> OpRecord:
    """The record of an op; an op edgetrain knows nothing about gets a plain one (not kept)."""
    rec = OPS.get(op_type)
    return rec if rec is not None else OpRecord(op_type)


def shape_inputs(op_type: str) -> tuple[int, ...]:
    return record(op_type).shape_inputs


def register(op_type: str, slot: str, value: Any, *, domain: str | None = None) -> None:
    """Fills a registered slot (kernel, shape, rule, body) of an op's record, once. An op a kernel module
    registers without a record in the table is an error: every op edgetrain runs has its record here."""
    rec = OPS.get(op_type)
    assert rec is not None, f"'{op_type}' has no record in edgetrain.core.ops: add one to _TABLE"
    assert domain is None or rec.domain == domain, (
        f"'{op_type}': registered in '{domain}', recorded in '{rec.domain}'"
    )
    assert getattr(rec, slot) is None, f"two {slot}s registered for {op_type}"
    setattr(rec, slot, value)
