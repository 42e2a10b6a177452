"""One record per ONNX op (numpy only): op type -> what edgetrain knows about it, found in this one place.

A record says which inputs hold parameters by role (weights, biases, scales, embedding tables), which are
statistics or shape-deciding values (never parameters), whether the op is random or data-dependent, whether it
only rearranges its input (so a weight read through it is still the initializer under it), how an older opset's
form is rewritten into the newest, and where its kernel and gradient rule are. The importer, the passes, the
parameter roles and `edgetrain check` all read these records; a new op is one record plus its kernel and rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import canonical as cn

REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
NORMALIZATIONS = (
    "BatchNormalization",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "LpNormalization",
    "MeanVarianceNormalization",
)


@dataclass(frozen=True, eq=False)
class OpRecord:
    op_type: str
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
    random: bool = False  # output is random: never folded, even on constant inputs
    data_dependent: bool = False  # output shape depends on the data: cannot be planned statically
    rearranges: bool = (
        False  # output 0 holds input 0's values rearranged or retyped (Transpose, Reshape, Cast)
    )
    normalizes: bool = (
        False  # output 0 is normalized (zero mean / unit scale): a Mul by a constant after it scales
    )
    # (since, rewrite): a node of an older version (its schema's since_version < since) is rewritten by it
    upgrade: tuple[int, Callable[..., Any]] | None = None

    @property
    def kernel(self):
        """The numpy kernel (edgetrain.runtime.kernels), or None when the interpreter does not run the op."""
        from .runtime.kernels import KERNELS

        return KERNELS.get(self.op_type)

    @property
    def rule(self):
        """The gradient rule (edgetrain.autodiff), or None when the op has none."""
        from .autodiff import rules  # noqa: F401  (registers the rule table)
        from .autodiff.driver import RULES

        return RULES.get(self.op_type)


_TABLE: list[OpRecord] = [
    # ---- ops with parameters by role
    OpRecord("Conv", weights={1: "weight", 2: "bias"}, bias=2, linear=True),
    OpRecord("ConvTranspose", weights={1: "weight", 2: "bias"}, bias=2, linear=True),
    OpRecord("Gemm", weights={0: "weight", 1: "weight", 2: "bias"}, bias=2, linear=True),
    # a constant MatMul operand is a weight; its bias, if any, is an Add after it
    OpRecord("MatMul", weights={0: "weight", 1: "weight"}, linear=True),
    OpRecord("Einsum", weights={k: "weight" for k in range(8)}, linear=True),
    OpRecord("Gather", weights={0: "embedding table"}),
    OpRecord("PRelu", weights={1: "slope"}),
    OpRecord(
        "BatchNormalization",
        weights={1: "scale", 2: "bias"},
        statistics={3: "running mean", 4: "running variance"},
        normalizes=True,
        upgrade=(9, cn.batchnorm_pre9),
    ),
    OpRecord("LayerNormalization", weights={1: "scale", 2: "bias"}, normalizes=True),
    OpRecord("InstanceNormalization", weights={1: "scale", 2: "bias"}, normalizes=True),
    OpRecord(
        "GroupNormalization",
        weights={1: "scale", 2: "bias"},
        normalizes=True,
        upgrade=(21, cn.groupnorm_pre21),
    ),
    OpRecord("LpNormalization", normalizes=True),
    OpRecord("MeanVarianceNormalization", normalizes=True),
    *[
        OpRecord(op, weights={1: "input weights W", 2: "recurrence weights R", 3: "bias B"})
        for op in ("RNN", "GRU")
    ],
    OpRecord(
        "LSTM", weights={1: "input weights W", 2: "recurrence weights R", 3: "bias B", 7: "peepholes P"}
    ),
    # ---- ops that only rearrange or retype their input: a weight read through them is the initializer under them
    OpRecord("Identity", rearranges=True),
    OpRecord("Transpose", rearranges=True),
    OpRecord("Cast", rearranges=True),
    OpRecord("Flatten", rearranges=True),
    OpRecord("Reshape", rearranges=True, shape_inputs=(1,)),
    OpRecord("Squeeze", rearranges=True, shape_inputs=(1,), upgrade=(13, cn.moved(("axes", "int64")))),
    OpRecord("Unsqueeze", rearranges=True, shape_inputs=(1,), upgrade=(13, cn.moved(("axes", "int64")))),
    # ---- shape-deciding inputs
    OpRecord("Expand", shape_inputs=(1,)),
    OpRecord("ConstantOfShape", shape_inputs=(0,)),
    OpRecord("Tile", shape_inputs=(1,)),
    OpRecord(
        "Slice",
        shape_inputs=(1, 2, 3, 4),
        upgrade=(10, cn.moved(("starts", "int64"), ("ends", "int64"), ("axes", "int64"))),
    ),
    OpRecord("Pad", shape_inputs=(1, 3), upgrade=(11, cn.pad_pre11)),
    OpRecord("Split", shape_inputs=(1,), upgrade=(18, cn.split_pre18)),
    OpRecord("Range", shape_inputs=(0, 1, 2)),
    OpRecord("TopK", shape_inputs=(1,), upgrade=(10, cn.topk_pre10)),
    OpRecord("OneHot", shape_inputs=(1,)),
    OpRecord("Resize", shape_inputs=(1, 2, 3)),
    OpRecord("Upsample", shape_inputs=(1,)),
    OpRecord("CumSum", shape_inputs=(1,)),
    OpRecord("EyeLike"),
    *[
        # axes became an input in opset 13 for ReduceSum, in 18 for the other reductions
        OpRecord(
            op, shape_inputs=(1,), upgrade=(13 if op == "ReduceSum" else 18, cn.moved(("axes", "int64")))
        )
        for op in REDUCE_OPS
    ],
    # ---- other opset rewrites
    OpRecord("Clip", upgrade=(11, cn.moved(("min", "float32"), ("max", "float32")))),
    OpRecord("Dropout", upgrade=(12, cn.dropout_pre12)),
    OpRecord("Softmax", upgrade=(13, cn.softmax_pre13)),
    OpRecord("LogSoftmax", upgrade=(13, cn.softmax_pre13)),
    OpRecord("Hardmax", upgrade=(13, cn.softmax_pre13)),
    OpRecord("Scatter", upgrade=(99, cn.scatter)),  # deprecated: always ScatterElements
    # ---- random and data-dependent ops
    *[
        OpRecord(op, random=True)
        for op in (
            "RandomNormal",
            "RandomUniform",
            "RandomNormalLike",
            "RandomUniformLike",
            "Multinomial",
            "Bernoulli",
        )
    ],
    *[
        OpRecord(op, data_dependent=True)
        for op in ("NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit")
    ],
]
OPS: dict[str, OpRecord] = {r.op_type: r for r in _TABLE}
assert len(OPS) == len(_TABLE), "two records for one op"


def record(op_type: str) -> OpRecord:
    """The record of an op; an op with nothing special to say about it gets a plain one."""
    rec = OPS.get(op_type)
    return rec if rec is not None else OpRecord(op_type)


def shape_inputs(op_type: str) -> tuple[int, ...]:
    return record(op_type).shape_inputs
