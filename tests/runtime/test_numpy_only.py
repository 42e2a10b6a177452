"""The device side imports and runs with numpy alone: onnx and onnxruntime are made unimportable in a fresh
interpreter, a small CNN and a small LSTM + GRU are built with the IR builder, run, and checked against plain-numpy
references; training steps derived from them run and lower the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from device import PYTHONS, run_on_device

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
    import numpy as np
    import edgetrain as et
    import edgetrain.runtime
    from edgetrain.core.ir import Graph, GraphBuilder, TensorInfo

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    fc = rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32)

    g = Graph(nodes=[], inputs=["x"], outputs=[], initializers={}, opset=18,
              values={"x": TensorInfo(np.dtype("float32"), (2, 3, 8, 8))})
    gb = GraphBuilder(g)
    wn, bn, fcn = gb.initializer("w", w), gb.initializer("b", b), gb.initializer("fc", fc)
    h = gb.add1("Conv", "x", wn, bn, attrs={"pads": [1, 1, 1, 1]})
    h = gb.add1("Relu", h)
    h = gb.add1("MaxPool", h, attrs={"kernel_shape": [2, 2], "strides": [2, 2]})
    h = gb.add1("Flatten", h)
    h = gb.add1("MatMul", h, fcn)
    y = gb.add1("Softmax", h, attrs={"axis": -1})
    graph = gb.finish(outputs=[y])
    graph.verify()
    (got,) = et.InferenceSession(graph).run(None, {"x": x})

    # plain numpy reference, float64, written out loop by loop
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((2, 4, 8, 8))
    for i in range(8):
        for j in range(8):
            conv[:, :, i, j] = np.einsum("nchw,ochw->no", xp[:, :, i:i + 3, j:j + 3], w) + b
    r = np.maximum(conv, 0)
    p = r.reshape(2, 4, 4, 2, 4, 2).max(axis=(3, 5)).reshape(2, -1)
    z = p @ fc
    ref = np.exp(z - z.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert got.dtype == np.float32 and got.shape == (2, 5), (got.dtype, got.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)

    # a training step derived from the same graph (convert accepts an IR graph: no onnx needed) runs too,
    # fused backward kernels included, and lowers the loss
    from edgetrain.core.interpreter import Interpreter
    art = et.convert(graph, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1, momentum=0.9))
    assert any(n.domain == "com.edgetrain" for n in art.graph.nodes)
    step = Interpreter(art.graph)
    labels = np.array([1, 3])
    values, losses = dict(art.initial), []
    for _ in range(5):
        out = dict(zip(art.graph.outputs, step.run(art.feeds(x, labels, None, values))))
        losses.append(float(out[art.loss]))
        values = {k: out[v] for k, v in art.updates.items()}
    assert losses[-1] < losses[0], losses

    # a recurrent model too: an LSTM (checked against the equations written out) and a GRU, then their step
    T, N, I, H = 5, 2, 3, 4
    xs = rng.standard_normal((T, N, I)).astype(np.float32)
    W = (0.5 * rng.standard_normal((1, 4 * H, I))).astype(np.float32)
    R = (0.5 * rng.standard_normal((1, 4 * H, H))).astype(np.float32)
    B = (0.5 * rng.standard_normal((1, 8 * H))).astype(np.float32)
    Wg = (0.5 * rng.standard_normal((1, 3 * H, H))).astype(np.float32)
    Rg = (0.5 * rng.standard_normal((1, 3 * H, H))).astype(np.float32)
    fc2 = rng.standard_normal((H, 3)).astype(np.float32)
    g = Graph(nodes=[], inputs=["xs"], outputs=[], initializers={}, opset=18,
              values={"xs": TensorInfo(np.dtype("float32"), (T, N, I))})
    gb = GraphBuilder(g)
    names = [gb.initializer(k, v) for k, v in (("W", W), ("R", R), ("B", B), ("Wg", Wg), ("Rg", Rg), ("fc2", fc2))]
    ys, _, _ = gb.add("LSTM", ["xs", *names[:3]], attrs={"hidden_size": H}, outputs=3)
    seq = gb.add1("Squeeze", ys, gb.initializer("axis1", np.array([1], np.int64)))
    _, hg = gb.add("GRU", [seq, names[3], names[4]], attrs={"hidden_size": H, "linear_before_reset": 1}, outputs=2)
    last = gb.add1("Squeeze", hg, gb.initializer("axis0", np.array([0], np.int64)))
    logits = gb.add1("MatMul", last, names[5])
    graph = gb.finish(outputs=[logits, ys])
    graph.verify()
    _, got_y = et.InferenceSession(graph).run(None, {"xs": xs})
    sig = lambda v: 1 / (1 + np.exp(-v))
    h, c = np.zeros((N, H)), np.zeros((N, H))
    for t in range(T):
        a = xs[t].astype(np.float64) @ W[0].T + h @ R[0].T + B[0, :4 * H] + B[0, 4 * H:]
        i, o, f, cc = sig(a[:, :H]), sig(a[:, H:2 * H]), sig(a[:, 2 * H:3 * H]), np.tanh(a[:, 3 * H:])
        c = f * c + i * cc
        h = o * np.tanh(c)
        np.testing.assert_allclose(got_y[t, 0], h, rtol=1e-4, atol=1e-6)
    art = et.convert(graph, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.5, momentum=0.9), output=logits)
    assert {n.op_type for n in art.graph.nodes} >= {"LSTMGrad", "GRUGrad"}
    step = Interpreter(art.graph)
    values, losses = dict(art.initial), []
    for _ in range(5):
        out = dict(zip(art.graph.outputs, step.run(art.feeds(xs, np.array([0, 2]), None, values))))
        losses.append(float(out[art.loss]))
        values = {k: out[v] for k, v in art.updates.items()}
    assert losses[-1] < losses[0], losses

    print("numpy-only OK", np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_runtime_runs_with_numpy_alone(python, report):
    proc = run_on_device(python, SCRIPT)  # onnx, onnxruntime and torch cannot be imported
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "numpy-only OK" in proc.stdout
    report("numpy-only runtime", proc.stdout.strip().splitlines()[-1] + f"  ({python})")
