"""Gradient rules of LSTM, GRU and RNN (the fused LSTMGrad, GRUGrad, RNNGrad) and ReverseSequence against float64
finite differences and onnxruntime running the emitted backward (the fused ops as ONNX functions of their
standard-op bodies); for layout 1, which onnxruntime's forward refuses, the fused kernels against their bodies run
by edgetrain's interpreter."""

from __future__ import annotations

import grad_harness
import numpy as np
import pytest
from grad_harness import build, check_against_onnxruntime, check_grad
from test_kernels_recurrent import make_inputs, spec_reference

from edgetrain.core.interpreter import Interpreter
from edgetrain.derive.autodiff import inline_private

OPS = ("LSTM", "GRU", "RNN")
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
DIRECTIONS = ("forward", "reverse", "bidirectional")
SIZES = {"T": 4, "N": 3, "I": 3, "H": 3}
LENS = [3, 1, 4]  # shorter than T=4 and not all equal (one full)
# finite-difference coordinates per input (a random direction over all elements checks the rest; each evaluation
# builds an interpreter, so they dominate the runtime): more for the direction x layout x length matrix
COORDS, MATRIX_COORDS = 4, 8


def _inputs(op, direction, **kw):
    return make_inputs(op, direction, dtype=np.float64, **{**SIZES, **kw})


def _fused_vs_body(op, inputs, attrs, *, n_outputs, wrt=None):
    """The fused backward kernel equals its standard-op body (inlined), both run by edgetrain in float64."""
    if wrt is None:
        wrt = [k for k, x in enumerate(inputs) if x is not None and np.asarray(x).dtype.kind == "f"]
    graph, _, feeds = build(op, inputs, attrs, wrt, n_outputs, 0, np.float64)
    assert any(n.op_type == f"{op}Grad" for n in graph.nodes), "no fused op emitted"
    inlined = inline_private(graph)
    assert not any(n.domain for n in inlined.nodes)
    fused = Interpreter(graph, preallocate=False).run(feeds)
    body = Interpreter(inlined, preallocate=False).run(feeds)
    for name, a, b in zip(graph.outputs, fused, body, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"{op}: {name}, fused vs body")


def _check(op, inputs, attrs, *, n_outputs=None, layout=0, wrt=None, ort=None, max_coords=COORDS):
    """check_grad, with onnxruntime running the emitted backward for layout 0; for layout 1 (or ort=False) the
    fused kernel against its body in edgetrain instead."""
    n_outputs = n_outputs or N_OUT[op]
    attrs = {"hidden_size": inputs[2].shape[-1], **attrs}  # onnxruntime needs it
    attrs = {"layout": layout, **attrs} if layout else attrs
    ort = layout == 0 if ort is None else ort
    check_grad(op, inputs, attrs, n_outputs=n_outputs, wrt=wrt, ort=ort, max_coords=max_coords)
    if not ort:
        _fused_vs_body(op, inputs, attrs, n_outputs=n_outputs, wrt=wrt)


# ---------------------------------------------------------------- every direction x layout x sequence_lens

MATRIX = [
    (op, direction, layout, lens)
    for op in OPS
    for direction in DIRECTIONS
    for layout in (0, 1)
    for lens in (False, True)
]


@pytest.mark.parametrize(
    "op,direction,layout,lens",
    MATRIX,
    ids=[f"{o}-{d}-layout{la}-{'lens' if le else 'full'}" for o, d, la, le in MATRIX],
)
def test_directions_layouts_lengths(op, direction, layout, lens):
    """X, W, R, B and the initial states (and LSTM's peepholes) all differentiated; every output seeded."""
    inputs = _inputs(
        op, direction, layout=layout, lens=LENS if lens else None, states=True, peepholes=True, seed=1
    )
    _check(op, inputs, {"direction": direction}, layout=layout, max_coords=MATRIX_COORDS)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_no_bias_no_initial_states(op, direction):
    _check(op, _inputs(op, direction, bias=False, lens=[2, 4, 1], seed=2), {"direction": direction})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_zero_length_sequence(op, direction):
    """A length-0 sequence: its Y is zeros and its final state the initial one, so d initial_h of it is the seed
    of Y_h. onnxruntime's forward writes zeros as that state (tests/core/test_kernels_recurrent.py): with initial
    states the body is checked in edgetrain instead."""
    _check(op, _inputs(op, direction, lens=[0, 4, 2], seed=3), {"direction": direction})
    with_states = _inputs(op, direction, lens=[0, 4, 2], states=True, peepholes=True, seed=3)
    _check(op, with_states, {"direction": direction}, ort=False)


# ---------------------------------------------------------------- cell options


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_input_forget(direction, peepholes):
    inputs = _inputs("LSTM", direction, lens=LENS, states=True, peepholes=peepholes, seed=4)
    _check("LSTM", inputs, {"direction": direction, "input_forget": 1})


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_gru_linear_before_reset(direction, layout):
    inputs = _inputs("GRU", direction, lens=LENS, states=True, layout=layout, seed=5)
    _check("GRU", inputs, {"direction": direction, "linear_before_reset": 1}, layout=layout)


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("RNN", 0), ("GRU", 0), ("GRU", 1)])
def test_no_bias_with_initial_states(op, lbr):
    """B omitted, initial states given (GRU: Rb_h absent from both readings of linear_before_reset). The fused op
    skips dB between dR and d initial_h: onnxruntime cannot run that emitted graph yet
    (test_emitted_graph_with_skipped_gradients_vs_onnxruntime), so the body is checked in edgetrain."""
    inputs = _inputs(op, "bidirectional", bias=False, states=True, peepholes=True, seed=6)
    attrs = {"direction": "bidirectional", **({"linear_before_reset": 1} if lbr else {})}
    _check(op, inputs, attrs, ort=False)


def _pre_activations(op, inputs, attrs):
    """(what goes through clip, what goes into any activation) at these inputs, from the spec's equations."""
    pre: list = []
    spec_reference(op, inputs, attrs, pre=pre)
    clipped = np.concatenate([v.ravel() for kind, v in pre if kind == "clip"])
    return clipped, np.concatenate([v.ravel() for _, v in pre])


def _clip_case(op, direction, layout, margin=1e-3):
    """Inputs and a clip bound such that some pre-activations are clipped, others not, and none lies within
    margin of the bound (finite differences across the kink would be meaningless)."""
    for seed in range(50):
        inputs = _inputs(
            op, direction, lens=LENS, states=True, peepholes=True, layout=layout, seed=seed, scale=1.5
        )
        for clip in (0.5, 0.625, 0.75, 0.875, 1.0, 1.25):
            attrs = {"direction": direction, "clip": clip, "layout": layout}
            a = np.abs(_pre_activations(op, inputs, attrs)[0])
            if np.abs(a - clip).min() > margin and 0.1 < np.mean(a > clip) < 0.8:
                return inputs, attrs
    raise AssertionError("no seed keeps the data away from the clip bound")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_clip(op, direction, layout):
    inputs, attrs = _clip_case(op, direction, layout)
    attrs.pop("layout")
    _check(op, inputs, attrs, layout=layout)


def test_clip_bound_in_float32():
    """A clip value not exact in float32 (attributes built in Python, not read from a model): the fused kernel and
    its body clip at the same bound, the attribute's float32 value (the finite differences above cannot see a
    1e-8 difference)."""
    rng = np.random.default_rng(0)
    x, w, r = rng.standard_normal((3, 2, 2)), rng.standard_normal((1, 2, 2)), rng.standard_normal((1, 2, 2))
    _fused_vs_body("RNN", [x, w, r], {"hidden_size": 2, "clip": 0.7}, n_outputs=1, wrt=[0])


# ---------------------------------------------------------------- activations

# activation -> (alpha, beta) (None: takes none); and its kinks for those values
GRAD_ACT_PARAMS = {
    "Relu": (None, None),
    "Tanh": (None, None),
    "Sigmoid": (None, None),
    "Affine": (0.8, 0.1),
    "LeakyRelu": (0.1, None),
    "ThresholdedRelu": (0.3, None),
    "ScaledTanh": (1.2, 0.7),
    "HardSigmoid": (0.5, 0.5),
    "Elu": (0.5, None),
    "Softsign": (None, None),
    "Softplus": (None, None),
}
KINKS = {
    "Relu": [0.0],
    "LeakyRelu": [0.0],
    "Elu": [0.0],
    "ThresholdedRelu": [0.3],
    "HardSigmoid": [-1.0, 1.0],
}


def _act_attrs(names):
    attrs = {"activations": list(names)}
    alphas = [GRAD_ACT_PARAMS[n][0] for n in names if GRAD_ACT_PARAMS[n][0] is not None]
    betas = [GRAD_ACT_PARAMS[n][1] for n in names if GRAD_ACT_PARAMS[n][1] is not None]
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    return attrs


def _away_from_kinks(op, direction, attrs, margin=1e-3, **kw):
    """Inputs whose pre-activations all keep margin from every kink of the activations used (of any of them:
    a conservative choice)."""
    kinks = [k for n in attrs["activations"] for k in KINKS.get(n, [])]
    for seed in range(100):
        inputs = _inputs(op, direction, seed=seed, **kw)
        a = _pre_activations(op, inputs, attrs)[1]
        if not kinks or min(np.abs(a - k).min() for k in kinks) > margin:
            return inputs
    raise AssertionError(f"no seed keeps the data away from the kinks {kinks}")


# (op, direction, activations of every direction)
ACT_CASES = [
    ("LSTM", "forward", ["HardSigmoid", "LeakyRelu", "Elu"]),
    ("LSTM", "bidirectional", ["Sigmoid", "ScaledTanh", "Softsign", "HardSigmoid", "Affine", "Softplus"]),
    ("LSTM", "reverse", ["Sigmoid", "Relu", "ThresholdedRelu"]),
    ("GRU", "forward", ["HardSigmoid", "Elu"]),
    ("GRU", "bidirectional", ["Sigmoid", "Softsign", "HardSigmoid", "ScaledTanh"]),
    ("GRU", "reverse", ["Sigmoid", "Affine"]),
    ("GRU", "forward", ["Softsign", "LeakyRelu"]),
    ("GRU", "forward", ["Sigmoid", "Softplus"]),
    *[("RNN", "forward", [a]) for a in GRAD_ACT_PARAMS if a not in ("Tanh", "Sigmoid", "Relu")],
    ("RNN", "bidirectional", ["LeakyRelu", "HardSigmoid"]),
    ("RNN", "reverse", ["Relu"]),
]


@pytest.mark.parametrize(
    "op,direction,names", ACT_CASES, ids=[f"{o}-{d}-{'-'.join(n)}" for o, d, n in ACT_CASES]
)
def test_activations(op, direction, names):
    attrs = {"direction": direction, **_act_attrs(names)}
    inputs = _away_from_kinks(op, direction, attrs, lens=LENS, states=True, scale=1.2)
    _check(op, inputs, attrs)


@pytest.mark.parametrize("op", OPS)
def test_activations_layout1(op):
    names = {
        "LSTM": ["HardSigmoid", "LeakyRelu", "Elu"],
        "GRU": ["HardSigmoid", "ScaledTanh"],
        "RNN": ["Elu"],
    }
    attrs = {"direction": "reverse", **_act_attrs(names[op])}
    inputs = _away_from_kinks(
        op, "reverse", {**attrs, "layout": 1}, lens=LENS, states=True, layout=1, scale=1.2
    )
    _check(op, inputs, attrs, layout=1)


# ---------------------------------------------------------------- seeds on some outputs only


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_only_y_seeded(op, direction):
    """n_outputs=1: the node has Y alone."""
    inputs = _inputs(op, direction, lens=LENS, states=True, peepholes=True, seed=7)
    _check(op, inputs, {"direction": direction}, n_outputs=1)


SEEDINGS = [
    (op, seeded, layout)
    for op in OPS
    for seeded in ((1,), (0, 2), (2,), (1, 2))
    for layout in (0, 1)
    if max(seeded) < N_OUT[op] and (layout == 0 or seeded == (1,))
]


@pytest.mark.parametrize(
    "op,seeded,layout", SEEDINGS, ids=[f"{o}-y{''.join(map(str, s))}-layout{la}" for o, s, la in SEEDINGS]
)
def test_only_some_outputs_seeded(op, seeded, layout):
    """Y_h alone (Y's name empty), Y_c alone, Y_h and Y_c, Y and Y_c: the other outputs get no seed."""
    inputs = _inputs(op, "bidirectional", lens=LENS, states=True, peepholes=True, layout=layout, seed=8)
    attrs = {"direction": "bidirectional", "hidden_size": 3, **({"layout": 1} if layout else {})}
    check_grad(op, inputs, attrs, n_outputs=N_OUT[op], ort=layout == 0, max_coords=COORDS, seeded=seeded)
    graph, _, feeds = grad_harness.build(
        op, inputs, attrs, [0, 1, 2, 3, 5], N_OUT[op], 0, np.float64, seeded=seeded
    )
    fused = [n for n in graph.nodes if n.op_type == f"{op}Grad"]
    assert len(fused) == 1
    # the fused node's seeds: dY, dY_h[, dY_c] after the forward inputs, "" (or dropped) where not seeded
    n_in = 8 if op == "LSTM" else 6
    seeds = list(fused[0].inputs[n_in:]) + [""] * (N_OUT[op] - len(fused[0].inputs[n_in:]))
    assert [bool(s) for s in seeds] == [k in seeded for k in range(N_OUT[op])], fused[0].inputs
    inlined = inline_private(graph)
    for a, b in zip(
        Interpreter(graph, preallocate=False).run(feeds), Interpreter(inlined, preallocate=False).run(feeds)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- some inputs differentiated only


def _fused_outputs(op, inputs, attrs, wrt):
    graph, _, _ = build(op, inputs, attrs, wrt, N_OUT[op], 0, np.float64)
    (fused,) = [n for n in graph.nodes if n.op_type == f"{op}Grad"]
    return [bool(o) for o in fused.outputs]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", [0, 1])
def test_wrt_x_only(op, layout):
    """Frozen weights (constants): dX alone, and the fused op computes nothing else."""
    inputs = _inputs(op, "bidirectional", lens=LENS, states=True, layout=layout, seed=9)
    attrs = {"direction": "bidirectional"}
    _check(op, inputs, attrs, wrt=[0], layout=layout)
    assert _fused_outputs(op, inputs, {**attrs, "layout": layout}, [0]) == [True]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", [0, 1])
def test_wrt_w_only(op, layout):
    """W alone: the fused op's first output (dX) is skipped. onnxruntime cannot run that emitted graph yet
    (test_emitted_graph_with_skipped_gradients_vs_onnxruntime), so the body is checked in edgetrain."""
    inputs = _inputs(op, "bidirectional", lens=LENS, states=True, layout=layout, seed=10)
    attrs = {"direction": "bidirectional"}
    _check(op, inputs, attrs, wrt=[1], layout=layout, ort=False)
    assert _fused_outputs(op, inputs, {**attrs, "layout": layout}, [1]) == [False, True]


@pytest.mark.parametrize("op", OPS)
def test_wrt_some(op):
    """R and initial_h (LSTM: and P) alone; the weights alone (frozen data: the usual training case); B with X."""
    inputs = _inputs(op, "reverse", lens=LENS, states=True, peepholes=True, seed=11)
    _check(op, inputs, {"direction": "reverse"}, wrt=[2, 5] + ([7] if op == "LSTM" else []), ort=False)
    _check(op, inputs, {"direction": "reverse"}, wrt=[1, 2, 3], ort=False)
    _check(op, inputs, {"direction": "reverse"}, wrt=[0, 3], ort=False)


# (op, wrt, omit B): the fused op skips a gradient before one it computes
SKIPPED = [
    ("RNN", [1], False),
    ("GRU", [1, 2, 3], False),
    ("LSTM", [1, 2, 3, 7], False),
    ("LSTM", [0, 1, 2, 5, 6], True),
    ("GRU", [0, 5], False),
]


@pytest.mark.parametrize(
    "op,wrt,no_bias", SKIPPED, ids=[f"{o}-wrt{''.join(map(str, w))}" for o, w, _ in SKIPPED]
)
def test_emitted_graph_with_skipped_gradients_vs_onnxruntime(op, wrt, no_bias):
    """A fused op whose outputs skip a gradient (unnamed) before one it computes: its ONNX function call lists the
    named outputs only, as the function does (regression: the call kept the empty names, and onnxruntime
    refused the model)."""
    inputs = _inputs(op, "forward", lens=LENS, states=True, peepholes=True, bias=not no_bias, seed=12)
    check_against_onnxruntime(op, inputs, {"hidden_size": 3}, wrt=wrt, n_outputs=N_OUT[op])


# ---------------------------------------------------------------- ReverseSequence


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
@pytest.mark.parametrize("tail", [(), (2,), (2, 3)])
def test_reverse_sequence(time_axis, batch_axis, tail):
    rng = np.random.default_rng(12)
    shape = [0, 0, *tail]
    shape[time_axis], shape[batch_axis] = 4, 5
    x = rng.standard_normal(shape)
    for lens in ([4, 1, 3, 2, 0], [4, 4, 4, 4, 4]):
        check_grad(
            "ReverseSequence",
            [x, np.array(lens, np.int64)],
            {"time_axis": time_axis, "batch_axis": batch_axis},
        )
