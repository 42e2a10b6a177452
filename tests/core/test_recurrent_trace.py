"""The recurrences' training-mode forward (fast path "recurrent-trace"): LSTMTrain / GRUTrain / RNNTrain keep the
trace of every step and the fused backward reads it instead of running the forward again. The step is bit for bit
the plain one (the backward recomputing) over every direction, layout, length, clip, activation and cell option;
the new ops' bodies equal their kernels (trace included); the emitted step runs in onnxruntime; real PyTorch
exports train bit for bit as on the plain path. The LSTM cell's fused backward loop agrees with the general one and
with finite differences. Head-only fine-tuning caches the frozen recurrence's output per sample (layout 0 and 1),
bit for bit the uncached step."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from grad_harness import build, check_grad
from onnx import TensorProto, helper, numpy_helper
from test_kernels_recurrent import make_inputs

import edgetrain as et
from edgetrain.core import fastpaths
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.kernels import recurrent as kr
from edgetrain.derive.autodiff import inline_private
from edgetrain.runtime.feature_cache import FeatureCache

TRACE = "recurrent-trace"
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
SIZES = {"T": 4, "N": 3, "I": 3, "H": 3}
ACTS = {  # activations whose slopes read the pre-activations (the trace then keeps them)
    "LSTM": ["Relu", "Elu", "Tanh", "HardSigmoid", "LeakyRelu", "Softsign"],
    "GRU": ["HardSigmoid", "LeakyRelu", "Softplus", "ThresholdedRelu"],
    "RNN": ["Softsign", "Relu"],
}

VARIANTS = {
    "plain": {},
    "lens": {"lens": [3, 1, 4]},
    "states-peepholes-lens": {"lens": [0, 4, 2], "states": True, "peepholes": True},
    "clip": {"attrs": {"clip": 0.4}, "states": True},
    "activations": {"attrs": {"acts": True}, "lens": [2, 4, 3]},
    "input-forget": {"attrs": {"input_forget": 1}, "peepholes": True, "only": "LSTM"},
    "linear-before-reset": {"attrs": {"linear_before_reset": 1}, "states": True, "only": "GRU"},
    "no-bias": {"bias": False, "states": True},
}
CASES = [
    (op, direction, layout, variant)
    for op in N_OUT
    for direction in ("forward", "reverse", "bidirectional")
    for layout in (0, 1)
    for variant, v in VARIANTS.items()
    if v.get("only", op) == op
]


def _case(op, direction, layout, variant, dtype=np.float64):
    v = VARIANTS[variant]
    kw = {k: v[k] for k in ("lens", "states", "peepholes", "bias") if k in v}
    inputs = make_inputs(op, direction, dtype=dtype, layout=layout, seed=7, **{**SIZES, **kw})
    attrs = {"direction": direction, "hidden_size": SIZES["H"], **v.get("attrs", {})}
    if attrs.pop("acts", False):
        per = len(kr.DEFAULT_ACTS[op])
        names = ACTS[op] * 2
        attrs["activations"] = names[: per * (2 if direction == "bidirectional" else 1)]
    if layout:
        attrs["layout"] = 1
    return inputs, attrs


def _both(op, inputs, attrs, dtype, wrt=None):
    """(graph with the trace, plain graph, feeds): loss and every float input's gradient as outputs."""
    if wrt is None:
        wrt = [k for k, x in enumerate(inputs) if x is not None and np.asarray(x).dtype.kind == "f"]
    fast, _, feeds = build(op, inputs, attrs, wrt, N_OUT[op], 0, dtype)
    with fastpaths.plain(TRACE):
        plain, _, _ = build(op, inputs, attrs, wrt, N_OUT[op], 0, dtype)
    return fast, plain, feeds


@pytest.mark.parametrize("op,direction,layout,variant", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_trace_path_is_the_plain_path_bit_for_bit(op, direction, layout, variant):
    inputs, attrs = _case(op, direction, layout, variant, np.float32)
    fast, plain, feeds = _both(op, inputs, attrs, np.float32)
    kinds = {n.op_type for n in fast.nodes if n.domain}
    assert kinds == {f"{op}Train", f"{op}Grad"}, kinds
    grad = next(n for n in fast.nodes if n.op_type == f"{op}Grad")
    train = next(n for n in fast.nodes if n.op_type == f"{op}Train")
    assert grad.inputs[5] == train.outputs[0], "the backward reads the trace (in initial_h's place)"
    assert {n.op_type for n in plain.nodes if n.domain} == {f"{op}Grad"}
    assert any(n.op_type == op for n in plain.nodes)
    a = Interpreter(fast, preallocate=False).run(feeds)
    b = Interpreter(plain, preallocate=False).run(feeds)
    for name, x, y in zip(fast.outputs, a, b, strict=True):
        assert np.array_equal(x, y), f"{op}: {name}"


BODY_CASES = [c for c in CASES if c[1] != "forward" or c[3] in ("activations", "clip", "input-forget")]


@pytest.mark.parametrize(
    "op,direction,layout,variant", BODY_CASES, ids=["-".join(map(str, c)) for c in BODY_CASES]
)
def test_the_training_forward_body_equals_its_kernel(op, direction, layout, variant):
    """LSTMTrain / GRUTrain / RNNTrain in standard ops (the standard op, the trace from the unrolled recurrence)
    against the kernel, every output and the trace itself, float64; and the whole step inlined."""
    inputs, attrs = _case(op, direction, layout, variant)
    fast, _, feeds = _both(op, inputs, attrs, np.float64)
    train = next(n for n in fast.nodes if n.op_type == f"{op}Train")
    outs = [o for o in train.outputs if o]
    g = fast.copy(outputs=list(fast.outputs) + outs)
    inlined = inline_private(g)
    assert not any(n.domain for n in inlined.nodes)
    kernel = Interpreter(g, preallocate=False).run(feeds)
    body = Interpreter(inlined, preallocate=False).run(feeds)
    for name, x, y in zip(g.outputs, kernel, body, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12, err_msg=f"{op}: {name}, kernel vs body")


@pytest.mark.parametrize("op", list(N_OUT))
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_the_emitted_backward_runs_in_onnxruntime(op, direction):
    """The step with LSTMTrain & co. as ONNX functions: onnxruntime gives edgetrain's loss and gradients (and
    finite differences agree with both)."""
    inputs = make_inputs(op, direction, dtype=np.float64, lens=[3, 4, 1], states=True, seed=3, **SIZES)
    assert fastpaths.enabled(TRACE)
    check_grad(op, inputs, {"direction": direction, "hidden_size": SIZES["H"]}, n_outputs=N_OUT[op])


# ---- the LSTM cell's fused backward loop --------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_the_fused_lstm_loop_against_finite_differences_and_onnxruntime(direction, layout):
    """No peepholes, input_forget or lengths: the seven-call loop. Finite differences in float64, and for layout 0
    onnxruntime running the emitted step."""
    inputs = make_inputs("LSTM", direction, dtype=np.float64, layout=layout, states=True, seed=5, **SIZES)
    attrs = {"direction": direction, "hidden_size": SIZES["H"], **({"layout": 1} if layout else {})}
    check_grad("LSTM", inputs, attrs, n_outputs=3, ort=layout == 0, max_coords=8)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_the_fused_lstm_loop_equals_the_general_cell(direction):
    """Zero peepholes send the same cell through the general per-step code: the gradients agree to rounding."""
    T, N, I, H = 12, 8, 16, 32
    x, w, r, b, _, h0, c0 = make_inputs(
        "LSTM", direction, T=T, N=N, I=I, H=H, states=True, seed=11, scale=0.3, dtype=np.float32
    )
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((T, d, N, H)).astype(np.float32)
    dyh = rng.standard_normal((d, N, H)).astype(np.float32)
    p0 = np.zeros((d, 3 * H), np.float32)
    args = dict(direction=direction, hidden_size=H, noutputs=6)
    fused = kr.lstm_grad(x, w, r, b, None, h0, c0, None, dy, dyh, **args)
    general = kr.lstm_grad(x, w, r, b, None, h0, c0, p0, dy, dyh, **args)
    for k, (a, g) in enumerate(zip(fused, general, strict=True)):
        np.testing.assert_allclose(a, g, rtol=1e-5, atol=1e-6 * np.abs(g).max(), err_msg=f"output {k}")


# ---- real exports ---------------------------------------------------------------------------------------------
def _classifier(op: str, layout: int, bidirectional: bool, lens: bool, seed: int = 0) -> onnx.ModelProto:
    """x [N, T, I] (-> Transpose for layout 0) -> a recurrence -> its final h, flattened -> Gemm -> logits."""
    rng = np.random.default_rng(seed)
    T, N, I, H, C = 6, 4, 5, 7, 3
    d, g = (2 if bidirectional else 1), kr.GATES[op]

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)

    inits = [init("W", d, g * H, I), init("R", d, g * H, H), init("B", d, 2 * g * H), init("fc.w", d * H, C)]
    inits += [init("fc.b", C), numpy_helper.from_array(np.array([N, d * H], np.int64), "shape")]
    ins = ["x_t" if not layout else "x", "W", "R", "B"]
    if lens:
        inits.append(numpy_helper.from_array(np.array([6, 3, 5, 1], np.int32), "lens"))
        ins.append("lens")
    attrs = {"hidden_size": H, "direction": "bidirectional" if bidirectional else "forward"}
    if layout:
        attrs["layout"] = 1
    state_perm = [1, 0, 2] if not layout else [0, 1, 2]
    nodes = [] if layout else [helper.make_node("Transpose", ["x"], ["x_t"], perm=[1, 0, 2])]
    nodes += [
        helper.make_node(op, ins, ["y", "yh"], **attrs),
        helper.make_node("Transpose", ["yh"], ["yh_t"], perm=state_perm),
        helper.make_node("Reshape", ["yh_t", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"]),
    ]
    x_shape = [N, T, I]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [N, C])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _convert(model, tmp_path, name, trainable=None):
    art = et.convert(
        model,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4),
        trainable=trainable,
    )
    path = tmp_path / f"{name}.etrain"
    art.save(path)
    return art, path


def _batches(model: onnx.ModelProto, n_batches=4, seed=0):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(shape).astype(np.float32), rng.integers(0, 3, shape[0]))
        for _ in range(n_batches)
    ]


@pytest.mark.parametrize("op", list(N_OUT))
@pytest.mark.parametrize("bidirectional,lens", [(False, False), (True, True)])
def test_full_fine_tuning_bit_for_bit_and_in_onnxruntime(tmp_path, op, bidirectional, lens):
    """A classifier over a recurrence, full fine-tuning: 4 steps with the trace give the plain path's losses and
    weights bit for bit; onnxruntime running training_onnx() gives the step's loss and updated weights."""
    import onnxruntime as ort

    model = _classifier(op, 0, bidirectional, lens)
    fast, fast_path = _convert(model, tmp_path, "fast")
    with fastpaths.plain(TRACE):
        plain, plain_path = _convert(model, tmp_path, "plain")
    assert any(n.op_type == f"{op}Train" for n in fast.graph.nodes)
    assert not any(n.op_type.endswith("Train") for n in plain.graph.nodes)
    batches = _batches(model)
    x, y = batches[0]
    rt = ort.InferenceSession(fast.training_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x, fast.target: y, fast.lr: np.asarray(0.1, np.float32)}
    wanted = [fast.loss, fast.updates["W"], fast.updates["R"]]
    feeds.update({k: v for k, v in fast.initial.items() if k in {i.name for i in rt.get_inputs()}})
    theirs = rt.run(wanted, feeds)
    s_fast, s_plain = et.TrainingSession(fast_path), et.TrainingSession(plain_path)
    for k, (x, y) in enumerate(batches):
        a, b = s_fast.train_step(x, y), s_plain.train_step(x, y)
        assert a == b, f"step {k}"
        if k == 0:
            assert a == pytest.approx(float(theirs[0]), rel=1e-5)
            for name, t in zip(("W", "R"), theirs[1:]):
                np.testing.assert_allclose(s_fast.parameters()[name], t, rtol=1e-5, atol=1e-6)
    for name, v in s_plain.parameters().items():
        assert np.array_equal(s_fast.parameters()[name], v), name
    # the personalized export keeps the one standard recurrent node
    s_fast.export_onnx(tmp_path / "personalized.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "personalized.onnx")).graph.node]
    assert ops.count(op) == 1 and not any(o.endswith(("Train", "Grad")) for o in ops), ops


# ---- the feature cache after a frozen recurrence -------------------------------------------------------------
def _train(path, batches, *, cache, epochs=3):
    sess = et.TrainingSession(path)
    if cache:
        sess.enable_feature_cache()
    losses = [sess.train_step(x, y) for _ in range(epochs) for x, y in batches]
    return losses, sess.parameters(), sess.feature_cache_info()


@pytest.mark.parametrize("op", list(N_OUT))
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_head_only_caches_the_frozen_recurrence_bit_for_bit(tmp_path, op, layout, bidirectional):
    model = _classifier(op, layout, bidirectional, False)
    art, path = _convert(model, tmp_path, "head", trainable=["fc.*"])
    from edgetrain.graph.prefix import split_step

    split, why = split_step(art.graph, art.data_inputs)
    assert split is not None, why
    assert op in {n.op_type for n in split.prefix.nodes}
    batches = _batches(model)
    # the first batch's check flips each value along its own batch axis (axis 1 or 2 before the cut in layout 0)
    assert bool(split.batch_axes) == (layout == 0), split.batch_axes
    assert FeatureCache(split, tag="t").position_dependent({"x": batches[0][0]}) == []
    batches = batches + [(x[::-1].copy(), y[::-1].copy()) for x, y in batches]  # samples meet new neighbours
    la, pa, info = _train(path, batches, cache=True)
    lb, pb, _ = _train(path, batches, cache=False)
    assert info["enabled"] and info["hits"] > 0, info
    assert la == lb
    for k in pb:
        assert np.array_equal(pa[k], pb[k]), k


@pytest.mark.parametrize("what", ["initial_h", "sequence_lens"])
def test_a_per_position_constant_keeps_the_recurrence_out_of_the_cache(tmp_path, what):
    """An initial state or lengths that differ per batch position tie a sample's result to its position: the
    prefix ends before the recurrence."""
    model = _classifier("GRU", 0, False, what == "sequence_lens")
    if what == "initial_h":
        h0 = np.random.default_rng(0).standard_normal((1, 4, 7)).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(h0, "h0"))
        model.graph.node[1].input.extend(["", "h0"])
    art, _ = _convert(model, tmp_path, "pos", trainable=["fc.*"])
    from edgetrain.graph.prefix import split_step

    split, why = split_step(art.graph, art.data_inputs)
    assert split is None or "GRU" not in {n.op_type for n in split.prefix.nodes}, why
