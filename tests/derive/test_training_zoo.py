"""Each of the nine light zoo models (random weights) converts into a training step; onnxruntime runs its
training ONNX for one step with a finite loss equal to edgetrain's; a few steps on one batch lower the loss."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest
from zoo import MODELS, input_name, load, randomize_weights

import edgetrain as et
from edgetrain.core.interpreter import Interpreter


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_trains(name, report):
    model = randomize_weights(load(name), seed=sum(map(ord, name)))
    t0 = time.perf_counter()
    art = et.convert(model, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=1e-3, momentum=0.9), batch_size=1)
    t_convert = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    y = np.zeros(art.graph.values[art.target].shape, np.int64) + 7
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(
        art.training_onnx().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    first = sess.run([art.loss], {input_name(model): x, art.target: y, art.lr: np.asarray(1e-3, np.float32)})[
        0
    ]
    assert np.isfinite(first)

    interp = Interpreter(art.graph)
    values = dict(art.initial)
    losses = []
    t0 = time.perf_counter()
    for _ in range(3):
        out = dict(zip(art.graph.outputs, interp.run(art.feeds(x, y, None, values))))
        losses.append(float(out[art.loss]))
        values = {k: out[v] for k, v in art.updates.items()}
    t_steps = (time.perf_counter() - t0) / 3
    assert losses[0] == pytest.approx(float(first), rel=1e-4)
    assert losses[-1] < losses[0], losses
    n_params = sum(int(np.prod(art.initial[p].shape)) for p in art.parameters)
    report(
        "zoo training (batch 1, SGD momentum)",
        f"{name:14s} {len(art.parameters):4d} params ({n_params / 1e6:6.2f} M)  convert {t_convert:5.1f} s  "
        f"step {t_steps:5.2f} s  loss {losses[0]:.4f} -> {losses[-1]:.4f}",
    )
