"""The op records (edgetrain.core.ops) are the one place an op is known: every op the interpreter runs has a
record, a kernel and either a gradient rule or the reason it has none; edgetrain's own ops carry a shape function
and a standard-op body; a kernel or rule for an op without a record is refused; and the fused ops' shape functions
give the shapes their kernels compute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgetrain as et
from edgetrain.core.ir import TensorInfo
from edgetrain.core.kernels import KERNELS
from edgetrain.core.kernels.registry import kernel
from edgetrain.core.ops import OPS, PRIVATE_DOMAIN, record
from edgetrain.derive.autodiff import RULES, grad

ROOT = Path(__file__).resolve().parents[2]


def test_every_op_the_interpreter_runs_has_its_record():
    assert len(KERNELS) > 120
    for op, k in KERNELS.items():
        assert op in OPS and OPS[op].kernel is k, op
        assert OPS[op].domain == k.domain, op


def test_every_op_with_a_kernel_has_a_rule_or_says_why_not():
    for op in KERNELS:
        rec = record(op)
        assert (rec.rule is not None) != bool(rec.no_rule), (op, rec.rule, rec.no_rule)
        assert not rec.rule_advice or rec.no_rule, op  # advice is for ops without a rule
    assert set(RULES) <= set(KERNELS)  # a rule for an op nobody can run is dead code


def test_edgetrains_own_ops_carry_their_shape_function_and_body():
    own = [op for op, rec in OPS.items() if rec.domain == PRIVATE_DOMAIN]
    assert {"SoftmaxCrossEntropy", "ConvGradInput", "LSTMGrad", "FakeQuantize", "After"} <= set(own)
    for op in own:
        rec = record(op)
        assert rec.kernel is not None and rec.kernel.domain == PRIVATE_DOMAIN, op
        assert rec.shape is not None and rec.body is not None, op
    assert all(rec.shape is None for rec in OPS.values() if rec.domain != PRIVATE_DOMAIN)  # onnx knows those


def test_edgetrains_own_ops_take_no_name_onnx_uses():
    # the records are keyed by op type alone: an own op named as an ONNX op (Attention, since opset 23) would
    # capture that op's nodes
    onnx = pytest.importorskip("onnx")
    own = [op for op, rec in OPS.items() if rec.domain == PRIVATE_DOMAIN]
    assert not [op for op in own if onnx.defs.has(op)]


def test_a_kernel_or_rule_without_a_record_is_refused():
    with pytest.raises(AssertionError, match="'NoSuchOp' has no record in edgetrain.core.ops"):
        kernel("NoSuchOp")(lambda x: x)
    with pytest.raises(AssertionError, match="'NoSuchOp' has no record"):
        grad("NoSuchOp")(lambda g, node, dys, needs: [None])
    with pytest.raises(AssertionError, match="two kernels registered for Relu"):
        kernel("Relu")(lambda x: x)
    with pytest.raises(AssertionError, match="two rules registered for Relu"):
        grad("Relu")(lambda g, node, dys, needs: [None])


MODELS = ROOT / "edgetrain" / "data"


@pytest.mark.parametrize(
    "model,optimizer",
    [
        ("digits_lenet.onnx", et.SGD(lr=0.1, momentum=0.9)),
        ("digits_lstm.onnx", et.Adam(lr=1e-3)),
        ("digits_gru.onnx", et.SGD(lr=0.1)),
    ],
)
def test_the_fused_ops_shape_functions_give_what_their_kernels_compute(model, optimizer):
    """Every fused node of a real training step: its record's shape function (what onnx's shape inference is
    told) against the shapes its kernel produced when the step was built (ShapedBuilder runs each new node)."""
    art = et.convert(str(MODELS / model), loss=et.CrossEntropyLoss(), optimizer=optimizer, batch_size=3)
    g = art.graph
    seen = set()
    for node in g.nodes:
        if node.domain != PRIVATE_DOMAIN:
            continue
        infos = [None if not i else g.values[i] for i in node.inputs]
        want = [g.values.get(o) if o else None for o in node.outputs]
        got = record(node.op_type).shape(node, infos)
        for o, w, s in zip(node.outputs, want, got):
            if o and w is not None:
                assert s is not None and s.shape == w.shape and np.dtype(s.dtype) == np.dtype(w.dtype), (
                    node.label,
                    o,
                    s,
                    w,
                )
        seen.add(node.op_type)
    assert seen, "no fused node in the step"
    assert isinstance(next(iter(g.values.values())), TensorInfo)
