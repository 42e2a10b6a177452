"""The nine real model graphs onnx ships under backend/test/data/light, run by edgetrain's interpreter:
their stored outputs, and (because those are uniform softmaxes from constant weights) the same graphs with
seeded random weights against onnxruntime."""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from zoo import LIGHT, MODELS, randomize_weights

import edgetrain as et

HEAVY = ("vgg19", "bvlc_alexnet", "zfnet512")  # 60-140 M parameters: seconds each


def _with_logits_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """Adds the input of the final Softmax (when there is one) as a graph output: logits are far more sensitive
    than probabilities."""
    last = next((n for n in reversed(model.graph.node) if n.op_type == "Softmax"), None)
    if last is not None:
        model.graph.output.append(helper.make_empty_tensor_value_info(last.input[0]))
    return model


def _ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.slow) if m in HEAVY else m for m in MODELS]
)
def test_light_model(name, report):
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    model = onnx.load(path)
    input_name = next(
        i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
    )

    # 1. The stored output, from the constant weights the file carries.
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    x_fixed = (np.arange(3 * 224 * 224, dtype=np.float64).reshape(1, 3, 224, 224) / (3 * 224 * 224)).astype(
        np.float32
    )
    t0 = time.perf_counter()
    sess = et.InferenceSession(path)
    t_load = time.perf_counter() - t0
    (got,) = sess.run(None, {input_name: x_fixed})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)

    # 2. Random weights and inputs against onnxruntime, probabilities and logits.
    rnd = _with_logits_output(randomize_weights(onnx.load(path), seed=sum(map(ord, name))))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = _ort_session(rnd).run(None, {input_name: x})
    t0 = time.perf_counter()
    sess = et.InferenceSession(rnd)
    t_import = time.perf_counter() - t0
    sess.run(None, {input_name: x})
    t0 = time.perf_counter()
    ours = sess.run(None, {input_name: x})
    t_run = time.perf_counter() - t0
    assert len(ours) == len(ref)
    for r, o, what in zip(ref, ours, ("output", "logits")):
        scale = float(np.abs(r).max())
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-6 * scale, err_msg=f"{name}: {what}")
    logits = ref[-1]
    assert np.ptp(logits) > 1e-2 * np.abs(logits).max(), "random weights should make the classes differ"
    report(
        "light models (batch 1, 224x224)",
        f"{name:14s} import {t_import:5.2f} s  run {t_run:5.2f} s  (stored-output load {t_load:4.2f} s)  "
        f"max |logit err| {float(np.abs(ours[-1] - logits).max()):.2e} of |logit| {float(np.abs(logits).max()):.2e}",
    )
