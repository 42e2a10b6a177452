"""Hostile int8 models (issue 33, surface "int8"): a QDQ model (x quantized and dequantized, an int8 weight
dequantized, MatMul) whose quantization tensors Hypothesis draws from the edges: scales of 0, negative, NaN,
infinite, subnormal or huge; per-channel scales of the wrong length or on an axis the weight lacks; zero points of
another shape or type than their tensor's; weights of other integer types. `convert` refuses each bad one with a
ModelError naming the tensor or node at fault, or takes it: then a training step is finite and the session runs the
model as onnxruntime does (its graph optimizations off, the graph as written)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hostile import Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et

RNG = np.random.default_rng(0)
W = RNG.normal(size=(4, 3)).astype(np.float32)
X = RNG.uniform(-2, 2, size=(2, 4)).astype(np.float32)
SCALES = [0.05, 0.0, -0.05, float("nan"), float("inf"), 1e-45, 3e38, 1e-3]


def model(w_scale, w_zp, *, axis=None, wq=None, x_scale=0.02, x_zp=128) -> bytes:
    wq = np.clip(np.round(W / 0.05), -127, 127).astype(np.int8) if wq is None else wq
    zp = np.asarray(w_zp, dtype=wq.dtype if wq.dtype.kind in "iu" else np.int8)
    inits = [
        numpy_helper.from_array(wq, "w_q"),
        numpy_helper.from_array(np.asarray(w_scale, np.float32), "w_scale"),
        numpy_helper.from_array(zp, "w_zp"),
        numpy_helper.from_array(np.asarray(x_scale, np.float32), "x_scale"),
        numpy_helper.from_array(np.asarray(x_zp, np.uint8), "x_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="quantize_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="dequantize_x"),
        helper.make_node(
            "DequantizeLinear",
            ["w_q", "w_scale", "w_zp"],
            ["wd"],
            name="dequantize_w",
            **({} if axis is None else {"axis": axis}),
        ),
        helper.make_node("MatMul", ["xd", "wd"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


def _ort(data: bytes) -> np.ndarray | None:
    """onnxruntime's output on X, the graph as written; None where onnxruntime refuses the model itself."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    except Exception:  # noqa: BLE001  (onnxruntime's own refusals: nothing to compare with)
        return None


def _case(tally: Tally, what: str, data: bytes) -> None:
    names = (
        "dequantize_w",
        "quantize_x",
        "dequantize_x",
        "w_scale",
        "w_zp",
        "w_q",
        "x_scale",
        "x_zp",
        "axis",
    )
    with tally.case(what, either=True):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                art = et.convert(data, loss=et.MSELoss(), optimizer=et.SGD(lr=0.01), batch_size=2)
        except et.EdgeTrainError as e:
            assert any(n in str(e) for n in names), f"the refusal names no tensor or node: {e}"
            raise
        sess = et.TrainingSession(art)
        got, want = sess.run(X), _ort(data)
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)
        loss = sess.train_step(X, np.zeros((2, 3), np.float32))
        assert np.isfinite(loss) and all(np.isfinite(v).all() for v in sess.parameters().values()), what


def test_the_edges_by_hand(report):
    tally = Tally("int8 models (quantization tensors at their edges)")
    for s in SCALES:
        _case(tally, f"weight scale {s}", model(s, 0))
        _case(tally, f"input scale {s}", model(0.05, 0, x_scale=s))
    for n, axis in [(2, 1), (2, 0), (3, 9), (3, -1), (4, 0), (3, 1), (5, 1)]:
        _case(tally, f"{n} channel scales on axis {axis}", model([0.05] * n, [0] * n, axis=axis))
    _case(tally, "zero point of 2 values for 1 scale", model(0.05, [0, 0]))
    _case(tally, "input zero point of 2 values", model(0.05, 0, x_zp=[1, 2]))
    _case(tally, "int32 weight with an int8 zero point", model(0.05, 0, wq=np.ones((4, 3), np.int32)))
    _case(tally, "uint8 weight", model(0.05, 128, wq=np.full((4, 3), 130, np.uint8)))
    report("hostile inputs", tally.line())
    tally.assert_clean()
    assert tally.refused >= 10 and tally.accepted >= 4


FLOATS = st.sampled_from(SCALES) | st.floats(width=32, allow_nan=True, allow_infinity=True)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scale=st.lists(FLOATS, min_size=1, max_size=5) | FLOATS.map(lambda f: [f]),
    zp=st.integers(-128, 127),
    axis=st.none() | st.integers(-3, 3),
    x_scale=FLOATS,
    scalar=st.booleans(),
)
def test_generated_quantization_tensors(scale, zp, axis, x_scale, scalar):
    tally = Tally("int8 models (generated)")
    w_scale = scale[0] if scalar else scale
    w_zp = zp if scalar else [zp] * len(scale)
    _case(
        tally,
        f"scale {w_scale}, zp {w_zp}, axis {axis}, x_scale {x_scale}",
        model(w_scale, w_zp, axis=axis, x_scale=x_scale),
    )
    tally.assert_clean()


def test_a_model_onnx_checks_is_the_starting_point():
    onnx.checker.check_model(onnx.load_from_string(model(0.05, 0)))
