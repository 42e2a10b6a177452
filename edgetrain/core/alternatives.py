"""What to tell a user whose model uses an op edgetrain lacks (numpy only; the device side uses it too).

One message for every place that refuses an op (the importer, the interpreter, the autodiff): it names the node and
the op, the nearest thing edgetrain does support, if there is one, and where the full list is. "Nearest" is, in
order: a real equivalence from the small tables below (quantized ops -> the float model, Loop/Scan -> an unrolled
export or LSTM/GRU/RNN, onnxruntime's fused contrib ops -> the standard ops plain torch.onnx.export writes), else a
close spelling among the supported ops ("relu" -> Relu) for a name that is no real ONNX op, else nothing. Every op
named in an advice here is one edgetrain runs (and, for the gradient advice, one with a rule); a test keeps it so.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection

from .kernels import KERNELS
from .ops import OPS, record

SEE_OPS = "see the supported ops with `edgetrain check --ops` or `edgetrain.runtime.supported_ops()`"
SEE_RULES = "`edgetrain check --ops` lists the ops with gradient rules"

CONTRIB_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops: its optimizer and quantizer write them

_QUANTIZED = (
    "quantize with onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ), whose models "
    "edgetrain runs and trains, or convert the float model, as exported before quantization"
)
_UNROLL = (
    "export with a fixed sequence length so the loop is unrolled, or write the recurrence as LSTM, GRU or RNN"
)
_SEQUENCE = "export with a fixed number of tensors (Split, Concat) instead of a tensor sequence"
_RMS = "Pow, ReduceMean, Add, Sqrt, Div and Mul"
_ATTENTION = "MatMul, Softmax, Reshape and Transpose"
_ROTARY = "Slice, Mul, Neg, Concat and Add"

# op type (compared without case) -> what to do instead: a clause that follows "op 'X' has no kernel in edgetrain; "
ADVICE: dict[str, str] = {
    "Loop": _UNROLL,
    "Scan": _UNROLL,
    "If": "export with the branch decided at export time (a traced export), so that only the branch taken remains",
    **dict.fromkeys(
        (
            "SequenceConstruct",
            "SequenceAt",
            "SequenceEmpty",
            "SequenceErase",
            "SequenceInsert",
            "SequenceLength",
            "SequenceMap",
            "SplitToSequence",
            "ConcatFromSequence",
        ),
        _SEQUENCE,
    ),
    "Upsample": "use Resize (export at opset 11 or later)",
    "Scatter": "use ScatterElements, its newer name (the same op)",
    "Compress": "use Gather along the axis with NonZero of the condition as indices",
    "LpNormalization": "divide by ReduceL2 (p=2) or ReduceL1 (p=1) with keepdims=1",
    "GlobalLpPool": "use ReduceL2 (p=2) or ReduceL1 (p=1) over the spatial axes with keepdims=1",
    "MeanVarianceNormalization": "write it with ReduceMean, Sub, Mul, Sqrt and Div",
    "CenterCropPad": "write it with Slice and Pad",
    "RMSNormalization": f"export at an opset below 23, where the norm is {_RMS}",
    "RotaryEmbedding": f"export at an opset below 23, where it is {_ROTARY}",
    "Attention": f"export at an opset below 23, where attention is {_ATTENTION}",
    "SoftmaxCrossEntropyLoss": "export the model without its loss: edgetrain adds the loss (et.CrossEntropyLoss())",
    "NegativeLogLikelihoodLoss": "export the model without its loss: edgetrain adds the loss (et.CrossEntropyLoss())",
    "ATen": "the exporter kept a PyTorch op (ONNX_ATEN_FALLBACK): export with the default operator_export_type",
}

# op type (compared without case) -> the standard ops that compute the same: "its standard form is ..."
STANDARD_FORM: dict[str, str] = {
    "Relu6": "Clip with min 0 and max 6",
    "HardTanh": "Clip with min -1 and max 1",
    "Silu": "x * Sigmoid(x): Sigmoid and Mul",
    "Swish": "x * Sigmoid(x): Sigmoid and Mul",
    "SwiGLU": "Split, Sigmoid and Mul",
    "LogSigmoid": "-Softplus(-x): Neg, Softplus and Neg",
}
# onnxruntime's contrib ops (com.microsoft) -> the standard ops its optimizer fused into them
CONTRIB_FORM: dict[str, str] = {
    "LayerNormalization": "LayerNormalization in the standard domain (opset 17)",
    "SkipLayerNormalization": "Add and LayerNormalization",
    "SimplifiedLayerNormalization": _RMS,
    "SkipSimplifiedLayerNormalization": f"Add, then {_RMS}",
    "EmbedLayerNormalization": "Gather, Add and LayerNormalization",
    "FastGelu": "Gelu with approximate='tanh' (opset 20) or Tanh, Mul, Pow and Add",
    "Gelu": "Gelu in the standard domain (opset 20), or Erf, Mul and Add",
    "BiasGelu": "Add, then Gelu (opset 20) or Erf, Mul and Add",
    "QuickGelu": "x * Sigmoid(1.702 x): Mul and Sigmoid",
    "BiasAdd": "Add",
    "BiasSoftmax": "Add and Softmax",
    "BiasDropout": "Add and Dropout",
    "FusedConv": "Conv followed by its activation",
    "FusedGemm": "Gemm followed by its activation",
    "FusedMatMul": "MatMul, with Transpose and Mul for its transposes and alpha",
    "TransposeMatMul": "MatMul, with Transpose and Mul for its transposes and alpha",
    "NhwcConv": "Transpose, Conv and Transpose",
    "MultiHeadAttention": _ATTENTION,
    "GroupQueryAttention": _ATTENTION,
    "PackedAttention": _ATTENTION,
    "PackedMultiHeadAttention": _ATTENTION,
    "DecoderMaskedMultiHeadAttention": _ATTENTION,
    "DecoderMaskedSelfAttention": _ATTENTION,
}
_CONTRIB_FIX = "convert the plain torch.onnx.export output, before onnxruntime's optimizer fused it"
_CONTRIB_ANY = (
    "onnxruntime's optimizer and quantizer write these ops: convert the model as exported, before either ran"
)

# ops edgetrain runs but cannot differentiate -> how to write them with ops that have gradient rules (or the
# counterpart a trained model uses), as their records say: a clause that follows "Or, to train them too, "
RULE_ADVICE: dict[str, str] = {op: rec.rule_advice for op, rec in OPS.items() if rec.rule_advice}

# Real standard ONNX ops edgetrain has no kernel for and no advice about: a similarly spelled supported op is a
# different op (MaxUnpool is not MaxPool, Acosh is not Cos), so their message suggests nothing.
ONNX_OPS_WITHOUT_KERNEL = frozenset(
    """Acos Acosh AffineGrid Asin Asinh Atan Atanh Bernoulli BitCast BitShift BitwiseAnd BitwiseNot BitwiseOr
    BitwiseXor BlackmanWindow CausalConvWithState Col2Im ConvInteger Cosh CumProd DFT DeformConv DequantizeLinear
    Det DynamicQuantizeLinear GridSample HammingWindow HannWindow ImageDecoder LinearAttention MatMulInteger
    MaxRoiPool MaxUnpool MelWeightMatrix Multinomial NonMaxSuppression Optional OptionalGetElement
    OptionalHasElement QLinearConv QLinearMatMul QuantizeLinear RandomNormal RandomNormalLike RandomUniform
    RandomUniformLike RegexFullMatch RoiAlign STFT Sinh StringConcat StringNormalizer StringSplit
    TensorScatter TfIdfVectorizer Unique""".lower().split()
)

_ADVICE = {k.lower(): v for k, v in ADVICE.items()}
_FORM = {k.lower(): v for k, v in STANDARD_FORM.items()}
_CONTRIB = {k.lower(): v for k, v in CONTRIB_FORM.items()}


def _quantized(op_type: str) -> bool:
    """QuantizeLinear, QLinearConv, ConvInteger, MatMulNBits, QGemm, QAttention, DynamicQuantizeMatMul, ..."""
    return (
        any(w in op_type for w in ("QLinear", "Integer", "NBits"))
        or "quantize" in op_type.lower()
        or len(op_type) > 1
        and op_type[0] == "Q"
        and op_type[1].isupper()
    )


def _supported() -> frozenset[str]:
    return frozenset(op for op, k in KERNELS.items() if not k.domain)


def alternative(op_type: str, domain: str = "", supported: Collection[str] | None = None) -> str:
    """What to use instead of an op edgetrain has no kernel for, as a clause ("" when nothing is close)."""
    key = op_type.lower()
    if _quantized(op_type):
        return _QUANTIZED
    if domain == CONTRIB_DOMAIN:
        form = _CONTRIB.get(key) or _FORM.get(key) or (_ATTENTION if "Attention" in op_type else "")
        return f"its standard form is {form}: {_CONTRIB_FIX}" if form else _CONTRIB_ANY
    if domain:
        return ""
    if key in _ADVICE:
        return _ADVICE[key]
    if key in _FORM:
        return f"its standard form is {_FORM[key]}"
    if key in ONNX_OPS_WITHOUT_KERNEL:
        return ""  # a real op: a look-alike name is another op (MaxUnpool is not MaxPool)
    names = {s.lower(): s for s in (_supported() if supported is None else supported)}
    close = difflib.get_close_matches(key, names, n=2, cutoff=0.85)
    if not close or len(close) > 1 and _ratio(key, close[1]) == _ratio(key, close[0]):
        if key in _CONTRIB:  # a contrib op written without its domain
            return f"its standard form is {_CONTRIB[key]}"
        return ""
    return f"did you mean '{names[close[0]]}'?"


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def explain(head: str, op_type: str, domain: str = "", supported: Collection[str] | None = None) -> str:
    """head (why the node cannot run, naming it), then what to use instead if anything is close, then where the
    supported ops are listed: one or two sentences."""
    advice = alternative(op_type, "" if domain == "ai.onnx" else domain, supported)
    if not advice:
        return f"{head}; {SEE_OPS}."
    sep = " " if advice.endswith("?") else ". "
    return f"{head}; {advice}{sep}{SEE_OPS[0].upper()}{SEE_OPS[1:]}."


def no_kernel_message(
    label: str, op_type: str, domain: str = "", supported: Collection[str] | None = None
) -> str:
    """The message for a node whose op edgetrain does not run; label is the node's label (Node.label)."""
    if domain not in ("", "ai.onnx"):
        return explain(
            f"{label} is in domain '{domain}', which edgetrain does not run", op_type, domain, supported
        )
    return explain(f"{label}: op '{op_type}' has no kernel in edgetrain", op_type, domain, supported)


def rule_alternative(op_type: str) -> str:
    """How to write an op without a gradient rule by ops with rules, as a clause ("" when there is no way)."""
    return record(op_type).rule_advice
