"""The recurrent kernels (LSTM, GRU, RNN) and ReverseSequence against onnxruntime, onnx's ReferenceEvaluator (for
layout 1, which onnxruntime refuses) and a plain numpy transcription of the spec's equations (float64, and what
onnxruntime reads differently from the spec); their errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernel_harness import assert_close, ort_run, ref_run
from onnx import helper

import edgetrain as et
from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.kernels import KERNELS

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
DIRECTIONS = ("forward", "reverse", "bidirectional")
OPS = tuple(GATES)
TOL = {np.float32: (1e-4, 1e-5), np.float64: (1e-10, 1e-12)}


# ---------------------------------------------------------------- inputs and runners


def make_inputs(
    op,
    direction="forward",
    *,
    T=5,
    N=3,
    I=4,
    H=3,
    seed=0,
    dtype=np.float32,
    bias=True,
    lens=None,
    states=False,
    peepholes=False,
    layout=0,
    scale=0.7,
):
    """[X, W, R, B, sequence_lens, initial_h(, initial_c, P)] by position (None where omitted, trailing ones
    dropped); the states (initial_h, and initial_c for LSTM) when states, P when peepholes."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    x = rand(*((N, T, I) if layout else (T, N, I)))
    state = (N, d, H) if layout else (d, N, H)
    ins = [
        x,
        rand(d, g * H, I),
        rand(d, g * H, H),
        rand(d, 2 * g * H) if bias else None,
        None if lens is None else np.asarray(lens, np.int32),
        rand(*state) if states else None,
    ]
    if op == "LSTM":
        ins += [rand(*state) if states else None, rand(d, 3 * H) if peepholes else None]
    while ins[-1] is None:
        ins.pop()
    return ins


def run(op, inputs, attrs, n_outputs):
    kern = KERNELS[op]
    got = kern.fn(*inputs, **attrs, noutputs=n_outputs)
    return list(got) if isinstance(got, tuple) else [got]


def check(op, inputs, attrs, *, n_outputs=None, ref=ort_run, what=""):
    """edgetrain's outputs equal the reference's (hidden_size is given: onnxruntime needs it)."""
    n_outputs = n_outputs or N_OUT[op]
    attrs = {"hidden_size": inputs[2].shape[-1], **attrs}
    expected = ref(op, inputs, attrs, n_outputs=n_outputs)
    got = run(op, inputs, attrs, n_outputs)
    assert len(got) == n_outputs
    rtol, atol = TOL[inputs[0].dtype.type]
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert np.isfinite(e).all(), f"{what}: the reference overflowed; choose tamer data"
        scale = max(1.0, float(np.abs(e).max()))
        assert_close(g, e, rtol=rtol, atol=atol * scale, what=f"{op} {what} {attrs} output {k}")


def _transposed(inputs):
    """Inputs in the other layout: X's first two axes swapped, and the states' (positions 5 and 6)."""
    ins = list(inputs)
    for k in (0, 5, 6):
        if k < len(ins) and ins[k] is not None:
            ins[k] = np.ascontiguousarray(ins[k].transpose(1, 0, 2))
    return ins


def ort_layout1(op, inputs, attrs, *, n_outputs):
    """onnxruntime on layout-1 inputs: its CPU kernels refuse layout=1 ("Batchwise recurrent operations (layout
    == 1) are not supported"), so it runs the transposed inputs in layout 0 and its outputs are transposed back."""
    outs = ort_run(op, _transposed(inputs), {**attrs, "layout": 0}, n_outputs=n_outputs)
    back = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    return [np.ascontiguousarray(o) for o in back]


# ---------------------------------------------------------------- the spec's equations, in plain numpy

SPEC_DEFAULTS = {
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, None),
}
TAKES = {  # activation -> (takes alpha, takes beta)
    "relu": (False, False),
    "tanh": (False, False),
    "sigmoid": (False, False),
    "affine": (True, True),
    "leakyrelu": (True, False),
    "thresholdedrelu": (True, False),
    "scaledtanh": (True, True),
    "hardsigmoid": (True, True),
    "elu": (True, False),
    "softsign": (False, False),
    "softplus": (False, False),
}


def spec_activation(name, alpha, beta):
    """The spec's formula of one activation; alpha and beta rounded to float32 (ONNX FLOAT attributes)."""
    n = name.lower()
    a = None if alpha is None else float(np.float32(alpha))
    b = None if beta is None else float(np.float32(beta))
    return {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "affine": lambda x: a * x + b,
        "leakyrelu": lambda x: np.where(x >= 0, x, a * x),
        "thresholdedrelu": lambda x: np.where(x > a, x, 0),
        "scaledtanh": lambda x: a * np.tanh(b * x),
        "hardsigmoid": lambda x: np.clip(a * x + b, 0, 1),
        "elu": lambda x: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.log1p(np.exp(x)),
    }[n]


def spec_activations(op, attrs, n_dirs):
    """Per direction, the activation functions; alpha and beta values consumed in order by the activations that
    take them, the ONNX operator's default where none is left."""
    names = list(attrs.get("activations") or DEFAULT_ACTS[op] * n_dirs)
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    fns = []
    for name in names:
        takes_a, takes_b = TAKES[name.lower()]
        da, db = SPEC_DEFAULTS.get(name.lower(), (None, None))
        a = (alphas.pop(0) if alphas else da) if takes_a else None
        b = (betas.pop(0) if betas else db) if takes_b else None
        fns.append(spec_activation(name, a, b))
    k = len(DEFAULT_ACTS[op])
    return [fns[d * k : (d + 1) * k] for d in range(n_dirs)]


def spec_reference(op, inputs, attrs, *, n_outputs=None, pre=None):
    """The spec's equations, one sample and one step at a time, in the inputs' dtype (float64 for the float64
    tests). A sequence of length L is steps 0..L-1 (reverse: L-1..0); its Y is zero past L and its final state is
    the state after its last step (the initial state when L is 0). pre: a list that receives every
    pre-activation as ("clip", value before clip), and LSTM's cell state that goes into h as ("cell", value) (the
    gradient tests keep their data away from kinks and the clip bound with it)."""
    ins = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, lens, h0, c0, p = ins
    layout = attrs.get("layout", 0)
    if layout:
        x, h0, c0 = (None if v is None else v.transpose(1, 0, 2) for v in (x, h0, c0))
    direction = attrs.get("direction", "forward")
    n_dirs = 2 if direction == "bidirectional" else 1
    t_len, n, _ = x.shape
    hs = r.shape[-1]
    g = GATES[op]
    dt = x.dtype.type
    clip = attrs.get("clip")
    clip = None if clip is None else float(np.float32(clip))
    lens = np.full(n, t_len) if lens is None else np.asarray(lens)
    acts = spec_activations(op, attrs, n_dirs)

    def seen(v, kind):
        if pre is not None:
            pre.append((kind, np.array(v)))
        return v

    def clipped(v):
        seen(v, "clip")
        return v if clip is None else np.clip(v, -clip, clip)

    y = np.zeros((t_len, n_dirs, n, hs), dt)
    yh = np.zeros((n_dirs, n, hs), dt)
    yc = np.zeros((n_dirs, n, hs), dt)
    for d in range(n_dirs):
        wd, rd = w[d], r[d]
        wb, rb = (
            (np.zeros(g * hs, dt), np.zeros(g * hs, dt)) if b is None else (b[d, : g * hs], b[d, g * hs :])
        )
        pd = np.zeros(3 * hs, dt) if p is None else p[d]
        reverse = direction == "reverse" or d == 1
        for s in range(n):
            h = np.zeros(hs, dt) if h0 is None else h0[d, s].copy()
            c = np.zeros(hs, dt) if c0 is None else c0[d, s].copy()
            steps = range(lens[s])
            for t in reversed(steps) if reverse else steps:
                xw, hr = wd @ x[t, s] + wb, rd @ h
                if op == "RNN":
                    h = acts[d][0](clipped(xw + hr + rb))
                elif op == "GRU":
                    f, gg = acts[d]
                    z = f(clipped(xw[:hs] + hr[:hs] + rb[:hs]))
                    rr = f(clipped(xw[hs : 2 * hs] + hr[hs : 2 * hs] + rb[hs : 2 * hs]))
                    rh, rbh = rd[2 * hs :], rb[2 * hs :]
                    if attrs.get("linear_before_reset", 0):
                        ah = xw[2 * hs :] + rr * (rh @ h + rbh)
                    else:
                        ah = xw[2 * hs :] + rh @ (rr * h) + rbh
                    h = (1 - z) * gg(clipped(ah)) + z * h
                else:
                    f, gg, hh = acts[d]
                    a = xw + hr + rb
                    ai, ao, af, ac = (a[k * hs : (k + 1) * hs] for k in range(4))
                    i = f(clipped(ai + pd[:hs] * c))
                    ff = 1 - i if attrs.get("input_forget", 0) else f(clipped(af + pd[2 * hs :] * c))
                    c = ff * c + i * gg(clipped(ac))
                    o = f(clipped(ao + pd[hs : 2 * hs] * c))
                    h = o * hh(seen(c, "cell"))
                y[t, d, s] = h
            yh[d, s] = h
            yc[d, s] = c
    if layout:
        y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
    outs = [y, yh, yc][: n_outputs or N_OUT[op]]
    return [np.ascontiguousarray(o) for o in outs]


# ---------------------------------------------------------------- against onnxruntime, layout 0

LENS = [4, 2, 5]  # shorter than T=5 and not all equal (one full)

# variant -> (make_inputs keywords, attributes); the op-specific ones apply to that op only
VARIANTS = {
    "plain": ({}, {}),
    "no_bias": ({"bias": False}, {}),
    "initial_states": ({"states": True}, {}),
    "lens": ({"lens": LENS}, {}),
    "lens_initial_states": ({"lens": LENS, "states": True}, {}),
    "lens_all_full": ({"lens": [5, 5, 5]}, {}),
    "clip": ({"scale": 1.5, "states": True}, {"clip": 1.2}),
    "clip_lens": ({"scale": 1.5, "lens": LENS}, {"clip": 1.5}),
    "lstm_peepholes": ({"states": True, "peepholes": True}, {}),
    "lstm_peepholes_lens_clip": (
        {"states": True, "peepholes": True, "lens": LENS, "scale": 1.5},
        {"clip": 1.2},
    ),
    "lstm_input_forget": ({"states": True}, {"input_forget": 1}),
    "lstm_input_forget_peepholes": ({"states": True, "peepholes": True, "lens": LENS}, {"input_forget": 1}),
    "gru_linear_before_reset": ({"states": True}, {"linear_before_reset": 1}),
    "gru_linear_before_reset_lens_clip": (
        {"lens": LENS, "scale": 1.5, "states": True},
        {"linear_before_reset": 1, "clip": 1.5},
    ),
    "gru_linear_before_reset_no_bias": ({"bias": False}, {"linear_before_reset": 1}),
}
CASES = [
    (op, direction, v)
    for op in OPS
    for direction in DIRECTIONS
    for v in VARIANTS
    if not v.startswith(("lstm_", "gru_")) or v.startswith(op.lower() + "_")
]


@pytest.mark.parametrize("op,direction,variant", CASES, ids=[f"{o}-{d}-{v}" for o, d, v in CASES])
def test_vs_onnxruntime(op, direction, variant):
    kw, attrs = VARIANTS[variant]
    inputs = make_inputs(op, direction, seed=len(variant), **kw)
    check(op, inputs, {"direction": direction, **attrs})


CLIP_VARIANTS = [
    (op, v)
    for op in OPS
    for v in VARIANTS
    if "clip" in v and (not v.startswith(("lstm_", "gru_")) or v.startswith(op.lower() + "_"))
]


@pytest.mark.parametrize("op,variant", CLIP_VARIANTS, ids=[f"{o}-{v}" for o, v in CLIP_VARIANTS])
def test_clip_cases_clip(op, variant):
    """The clip cases above clip for real: some pre-activations lie past the bound, others within it."""
    kw, attrs = VARIANTS[variant]
    for direction in DIRECTIONS:
        pre: list = []
        inputs = make_inputs(op, direction, seed=len(variant), **kw)
        spec_reference(op, inputs, {"direction": direction, **attrs}, pre=pre)
        a = np.abs(np.concatenate([v.ravel() for kind, v in pre if kind == "clip"]))
        past = int(np.sum(a > attrs["clip"]))
        assert 3 <= past <= a.size - 3, (direction, past, a.size)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_zero_length_sequence(op, direction):
    """A sequence of length 0 (beside a full one and a short one): Y is all zeros for it, as in onnxruntime."""
    inputs = make_inputs(op, direction, lens=[0, 5, 2], seed=3)
    check(op, inputs, {"direction": direction})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_zero_length_sequence_keeps_initial_state(op, direction):
    """With initial states, a length-0 sequence's final state is its initial state (no step changes it: the
    semantics of every shorter sequence, whose state stays as it was past its length). onnxruntime writes zeros
    there instead; the spec says nothing of length 0. Every other value matches onnxruntime."""
    inputs = make_inputs(op, direction, lens=[0, 5, 2], states=True, seed=5)
    attrs = {"direction": direction, "hidden_size": 3}
    got = run(op, inputs, attrs, N_OUT[op])
    theirs = ort_run(op, inputs, attrs, n_outputs=N_OUT[op])
    assert_close(got[0], theirs[0], rtol=1e-4, atol=1e-5, what="Y")
    for k, (g, t) in enumerate(zip(got[1:], theirs[1:])):
        assert_close(g[:, 1:], t[:, 1:], rtol=1e-4, atol=1e-5, what=f"output {k + 1}, sequences 1 and 2")
        np.testing.assert_array_equal(g[:, 0], inputs[5 + k][:, 0])
        np.testing.assert_array_equal(t[:, 0], 0)  # onnxruntime's reading (if it changes, revisit this test)
    for g, e in zip(got, spec_reference(op, inputs, attrs)):
        assert_close(g, e, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- activations

# activation -> (alpha, beta) given explicitly (None: takes none)
ACT_PARAMS = {
    "Relu": (None, None),
    "Tanh": (None, None),
    "Sigmoid": (None, None),
    "Affine": (0.7, 0.2),
    "LeakyRelu": (0.3, None),
    "ThresholdedRelu": (0.15, None),
    "ScaledTanh": (1.3, 0.8),
    "HardSigmoid": (0.3, 0.4),
    "Elu": (0.6, None),
    "Softsign": (None, None),
    "Softplus": (None, None),
}


def _with_params(names):
    """activations, activation_alpha, activation_beta attributes for these names with explicit values."""
    attrs = {"activations": list(names)}
    alphas = [ACT_PARAMS[n][0] for n in names if ACT_PARAMS[n][0] is not None]
    betas = [ACT_PARAMS[n][1] for n in names if ACT_PARAMS[n][1] is not None]
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    return attrs


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("act", list(ACT_PARAMS))
def test_activation_in_every_position_vs_onnxruntime(op, act):
    """Each activation in each position of the cell (the others default), with explicit alpha/beta, on a
    bidirectional node whose backward direction keeps the defaults; initial states and lengths too."""
    k = len(DEFAULT_ACTS[op])
    for pos in range(k):
        names = list(DEFAULT_ACTS[op])
        names[pos] = act
        attrs = _with_params(names + DEFAULT_ACTS[op])
        inputs = make_inputs(op, "bidirectional", T=4, lens=[4, 1, 3], states=True, seed=pos)
        check(op, inputs, {"direction": "bidirectional", **attrs}, what=f"position {pos}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("act", ["LeakyRelu", "HardSigmoid", "Elu"])
def test_activation_defaults_vs_onnxruntime(op, act):
    """Without activation_alpha/beta: the ONNX operator's defaults (LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1.0),
    which onnxruntime uses too. HardSigmoid in the gates' place, the unbounded ones in the others' (unbounded
    gates overflow)."""
    names = list(DEFAULT_ACTS[op])
    if act == "HardSigmoid" or op == "RNN":
        names[0] = act
    else:
        names[1:] = [act] * (len(names) - 1)
    check(op, make_inputs(op, "reverse", scale=1.2, seed=6), {"direction": "reverse", "activations": names})


@pytest.mark.parametrize("op", OPS)
def test_thresholded_relu_default_alpha_follows_the_spec(op):
    """ThresholdedRelu without alpha: the spec says the defaults are those of the ONNX operator (alpha 1.0);
    onnxruntime defaults it to 0.0, so this is checked against the spec's equations in numpy (which, with alpha
    0.7 explicit, agree with onnxruntime), and the result must differ from alpha 0.0's. (LSTM and GRU keep their
    gates' sigmoid: unbounded gates overflow within a few steps.)"""
    names = (
        DEFAULT_ACTS[op][:1] + ["ThresholdedRelu"] * (len(DEFAULT_ACTS[op]) - 1)
        if op != "RNN"
        else ["ThresholdedRelu"]
    )
    inputs = make_inputs(op, scale=1.5, states=True, seed=7)
    attrs = {"hidden_size": 3, "activations": names}
    for g, e in zip(run(op, inputs, attrs, N_OUT[op]), spec_reference(op, inputs, attrs), strict=True):
        assert_close(g, e, rtol=1e-5, atol=1e-6, what="default alpha")
    explicit = {**attrs, "activation_alpha": [0.7] * len(names)}
    for g, e in zip(spec_reference(op, inputs, explicit), ort_run(op, inputs, explicit, n_outputs=N_OUT[op])):
        assert_close(g, e, rtol=1e-4, atol=1e-5, what="the numpy reference vs onnxruntime, alpha 0.7")
    ones = run(op, inputs, {**attrs, "activation_alpha": [1.0] * len(names)}, 1)[0]
    zeros = run(op, inputs, {**attrs, "activation_alpha": [0.0] * len(names)}, 1)[0]
    np.testing.assert_array_equal(run(op, inputs, attrs, 1)[0], ones)
    assert np.abs(ones - zeros).max() > 0.1


# bidirectional activation lists mixing activations that take alpha only, both, or none: values consumed in order
# by the ones that take them, so a reading by position (alpha[k] for activation k) would give another result
MIXED = {
    "LSTM": ["HardSigmoid", "LeakyRelu", "ScaledTanh", "Sigmoid", "Elu", "Affine"],
    "GRU": ["HardSigmoid", "Affine", "Softsign", "LeakyRelu"],
    "RNN": ["LeakyRelu", "ScaledTanh"],
}


@pytest.mark.parametrize("op", OPS)
def test_alpha_beta_consumed_in_order_and_per_direction(op):
    names = MIXED[op]
    attrs = {"direction": "bidirectional", **_with_params(names)}
    inputs = make_inputs(op, "bidirectional", states=True, lens=[3, 5, 1], seed=8)
    check(op, inputs, attrs)
    for g, e in zip(
        run(op, inputs, {"hidden_size": 3, **attrs}, N_OUT[op]), spec_reference(op, inputs, attrs)
    ):
        assert_close(g, e, rtol=1e-5, atol=1e-6)
    # the two directions really use their own activations: swapping the lists changes both halves
    k = len(DEFAULT_ACTS[op])
    swapped = {"direction": "bidirectional", **_with_params(names[k:] + names[:k])}
    a, b = (
        run(op, inputs, {"hidden_size": 3, **attrs}, 1)[0],
        run(op, inputs, {"hidden_size": 3, **swapped}, 1)[0],
    )
    assert np.abs(a[:, 0] - b[:, 0]).max() > 1e-3 and np.abs(a[:, 1] - b[:, 1]).max() > 1e-3


@pytest.mark.parametrize("op", OPS)
def test_activation_names_are_case_insensitive(op):
    """The spec's names in any case give the same result (onnxruntime's LSTM and GRU lower-case them too; its RNN
    refuses other spellings)."""
    mixed = MIXED[op][: len(DEFAULT_ACTS[op])]
    attrs = {"hidden_size": 3, **_with_params(mixed)}
    inputs = make_inputs(op, seed=9)
    check(op, inputs, attrs)
    expected = run(op, inputs, attrs, N_OUT[op])
    for spelling in (str.lower, str.upper):
        got = run(op, inputs, {**attrs, "activations": [spelling(n) for n in mixed]}, N_OUT[op])
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)


# ---------------------------------------------------------------- outputs


LEADING = [(op, k) for op in OPS for k in range(1, N_OUT[op] + 1)]


@pytest.mark.parametrize("op,n_outputs", LEADING, ids=[f"{o}-{k}" for o, k in LEADING])
def test_leading_outputs(op, n_outputs):
    """Y alone, Y and Y_h, and (LSTM) all three."""
    inputs = make_inputs(op, "bidirectional", lens=LENS, states=True, seed=10)
    check(op, inputs, {"direction": "bidirectional"}, n_outputs=n_outputs)


def _model(op, inputs, attrs, outputs):
    """A one-node model with the given output names ("" for an output not asked for)."""
    names = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, inputs)
        if v is not None
    ]
    node = helper.make_node(op, names, outputs, **attrs)
    elem = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    (t_len, n, _), d, hs = inputs[0].shape, inputs[1].shape[0], inputs[2].shape[-1]
    shapes = [(t_len, d, n, hs), (d, n, hs), (d, n, hs)]  # layout 0
    outs = [helper.make_tensor_value_info(o, elem, s) for o, s in zip(outputs, shapes) if o]
    model = helper.make_model(
        helper.make_graph([node], "g", vis, outs), opset_imports=[helper.make_opsetid("", 21)]
    )
    model.ir_version = 10
    return model


OUTPUT_SETS = {
    "Y_h": ["", "yh"],
    "Y_c": ["", "", "yc"],
    "Y_h_Y_c": ["", "yh", "yc"],
    "Y_Y_c": ["y", "", "yc"],
}


LATER = [(op, o) for op in OPS for o in OUTPUT_SETS if len(OUTPUT_SETS[o]) <= N_OUT[op]]


@pytest.mark.parametrize("op,outputs", LATER, ids=[f"{op}-{o}" for op, o in LATER])
def test_later_outputs_alone_through_a_session(op, outputs):
    """Y_h (or Y_c) alone, Y's name empty: a model run end to end by et.InferenceSession equals onnxruntime."""
    import onnxruntime as ort

    names = OUTPUT_SETS[outputs]
    inputs = make_inputs(op, "bidirectional", lens=LENS, states=True, seed=11)
    model = _model(op, inputs, {"direction": "bidirectional", "hidden_size": 3}, names)
    onnx.checker.check_model(model)
    feeds = {f"in{k}": v for k, v in enumerate(inputs) if v is not None}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    ours = et.InferenceSession(model).run(None, feeds)
    assert len(ours) == len(theirs) == sum(1 for n in names if n)
    for o, t in zip(ours, theirs):
        assert_close(o, t, rtol=1e-4, atol=1e-5, what=outputs)


# ---------------------------------------------------------------- layout 1

# onnx's ReferenceEvaluator runs layout 1 for the default activations, no clip and no sequence_lens (it ignores
# them), and for LSTM without input_forget: those cases are checked against it
REF_VARIANTS = ["plain", "no_bias", "initial_states", "lstm_peepholes", "gru_linear_before_reset"]
REF_CASES = [
    (op, direction, v)
    for op in OPS
    for direction in DIRECTIONS
    for v in REF_VARIANTS
    if not v.startswith(("lstm_", "gru_")) or v.startswith(op.lower() + "_")
]


@pytest.mark.parametrize("op,direction,variant", REF_CASES, ids=[f"{o}-{d}-{v}" for o, d, v in REF_CASES])
def test_layout1_vs_reference_evaluator(op, direction, variant):
    kw, attrs = VARIANTS[variant]
    inputs = make_inputs(op, direction, layout=1, seed=12 + len(variant), **kw)
    check(op, inputs, {"direction": direction, "layout": 1, **attrs}, ref=ref_run)
    check(op, inputs, {"direction": direction, "layout": 1, **attrs}, ref=ort_layout1)


L1_VARIANTS = [
    "lens",
    "lens_initial_states",
    "clip_lens",
    "lstm_peepholes_lens_clip",
    "lstm_input_forget_peepholes",
    "gru_linear_before_reset_lens_clip",
]
L1_CASES = [
    (op, direction, v)
    for op in OPS
    for direction in DIRECTIONS
    for v in L1_VARIANTS
    if not v.startswith(("lstm_", "gru_")) or v.startswith(op.lower() + "_")
]


@pytest.mark.parametrize("op,direction,variant", L1_CASES, ids=[f"{o}-{d}-{v}" for o, d, v in L1_CASES])
def test_layout1_vs_transposed_onnxruntime(op, direction, variant):
    """What the ReferenceEvaluator cannot run (sequence_lens, clip, input_forget): onnxruntime on the transposed
    inputs."""
    kw, attrs = VARIANTS[variant]
    inputs = make_inputs(op, direction, layout=1, seed=13 + len(variant), **kw)
    check(op, inputs, {"direction": direction, "layout": 1, **attrs}, ref=ort_layout1)


@pytest.mark.parametrize("op", OPS)
def test_layout1_activations_and_leading_outputs(op):
    attrs = {"direction": "bidirectional", "layout": 1, **_with_params(MIXED[op])}
    inputs = make_inputs(op, "bidirectional", layout=1, states=True, lens=[2, 5, 3], seed=14)
    for n_outputs in range(1, N_OUT[op] + 1):
        check(op, inputs, attrs, n_outputs=n_outputs, ref=ort_layout1)


def test_reference_evaluator_ignores_sequence_lens():
    """Why layout-1 cases with lengths use onnxruntime: the ReferenceEvaluator ignores sequence_lens."""
    inputs = make_inputs("RNN", layout=1, lens=[2, 5, 3], seed=15)
    ref = ref_run("RNN", inputs, {"hidden_size": 3, "layout": 1}, n_outputs=1)[0]
    assert np.abs(ref[0, 2:]).max() > 0  # past sample 0's length 2: not zeroed
    assert np.abs(run("RNN", inputs, {"layout": 1}, 1)[0][0, 2:]).max() == 0


# ---------------------------------------------------------------- float64

F64_CASES = [
    (op, direction, v)
    for op in OPS
    for direction in DIRECTIONS
    for v in (
        "initial_states",
        "lens_initial_states",
        "clip_lens",
        "lstm_peepholes_lens_clip",
        "lstm_input_forget_peepholes",
        "gru_linear_before_reset_lens_clip",
    )
    if not v.startswith(("lstm_", "gru_")) or v.startswith(op.lower() + "_")
]


@pytest.mark.parametrize("op,direction,variant", F64_CASES, ids=[f"{o}-{d}-{v}" for o, d, v in F64_CASES])
@pytest.mark.parametrize("layout", [0, 1])
def test_float64_vs_spec_equations(op, direction, variant, layout):
    """float64 in, float64 out, equal to the spec's equations in float64 to rounding; onnxruntime has no float64
    recurrent kernels, so it checks the same inputs rounded to float32 (and the numpy reference with them)."""
    kw, attrs = VARIANTS[variant]
    inputs = make_inputs(op, direction, dtype=np.float64, layout=layout, seed=16 + len(variant), **kw)
    attrs = {"direction": direction, "layout": layout, **attrs}
    check(op, inputs, attrs, ref=spec_reference)
    as32 = [v if v is None or v.dtype.kind != "f" else v.astype(np.float32) for v in inputs]
    check(op, as32, attrs, ref=ort_layout1 if layout else ort_run)
    check(op, as32, attrs, ref=spec_reference)


@pytest.mark.parametrize("op", OPS)
def test_float64_activations_vs_spec_equations(op):
    every = list(ACT_PARAMS)
    k = len(DEFAULT_ACTS[op])
    for start in range(0, len(every), 2 * k):
        names = (every[start : start + 2 * k] * 2)[: 2 * k]
        attrs = {"direction": "bidirectional", **_with_params(names)}
        inputs = make_inputs(op, "bidirectional", dtype=np.float64, lens=[4, 5, 2], states=True, seed=start)
        check(op, inputs, attrs, ref=spec_reference, what=str(names))


@pytest.mark.parametrize("op", OPS)
def test_float64_vs_reference_evaluator(op):
    inputs = make_inputs(op, "bidirectional", dtype=np.float64, states=True, peepholes=True, seed=17)
    check(op, inputs, {"direction": "bidirectional"}, ref=ref_run)


# ---------------------------------------------------------------- errors


def _attrs_error(op, inputs, attrs, error, pattern):
    with pytest.raises(error, match=pattern):
        run(op, inputs, {"hidden_size": 3, **attrs}, N_OUT[op])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("act", ["Affine", "ScaledTanh"])
def test_affine_and_scaled_tanh_need_alpha_and_beta(op, act):
    """No ONNX operator's default can stand in for these: edgetrain refuses rather than guess (onnxruntime uses
    0.0)."""
    names = [act] * len(DEFAULT_ACTS[op])
    inputs = make_inputs(op, seed=18)
    _attrs_error(op, inputs, {"activations": names}, UnsupportedError, f"activation_alpha.*{act}")
    # alpha for each but no beta
    _attrs_error(
        op,
        inputs,
        {"activations": names, "activation_alpha": [1.0] * len(names)},
        UnsupportedError,
        f"activation_beta.*{act}",
    )
    # too few alphas: the last one runs out
    if len(names) > 1:
        few = {"activations": names, "activation_alpha": [1.0], "activation_beta": [1.0] * len(names)}
        _attrs_error(op, inputs, few, UnsupportedError, "activation_alpha")


@pytest.mark.parametrize("op", OPS)
def test_unknown_activation(op):
    names = list(DEFAULT_ACTS[op])
    names[-1] = "Swish"
    _attrs_error(
        op, make_inputs(op), {"activations": names}, UnsupportedError, "activations.*'Swish'.*Softplus"
    )


@pytest.mark.parametrize("op", OPS)
def test_wrong_number_of_activations(op):
    k = len(DEFAULT_ACTS[op])
    _attrs_error(op, make_inputs(op), {"activations": ["Tanh"] * (k + 1)}, UnsupportedError, "activations")
    bi = make_inputs(op, "bidirectional")
    _attrs_error(
        op,
        bi,
        {"direction": "bidirectional", "activations": ["Tanh"] * (2 * k + 1)},
        UnsupportedError,
        f"activations has {2 * k + 1} names.*takes {2 * k}",
    )


@pytest.mark.parametrize("op", OPS)
def test_unknown_direction(op):
    _attrs_error(op, make_inputs(op), {"direction": "sideways"}, UnsupportedError, "direction='sideways'")


@pytest.mark.parametrize("op", OPS)
def test_wrong_weight_shapes(op):
    inputs = make_inputs(op)
    bad_w = list(inputs)
    bad_w[1] = inputs[1][:, :-1]  # one row short
    _attrs_error(op, bad_w, {}, ShapeError, r"input W has shape")
    bad_dirs = make_inputs(op, "bidirectional")  # two directions' weights on a forward node
    _attrs_error(op, bad_dirs, {}, ShapeError, r"input W has shape \(2, ")
    bad_b = list(inputs)
    bad_b[3] = inputs[3][:, 1:]
    _attrs_error(op, bad_b, {}, ShapeError, r"input B has shape")
    bad_h = make_inputs(op, states=True)
    bad_h[5] = bad_h[5][:, :2]  # 2 of the 3 samples
    _attrs_error(op, bad_h, {}, ShapeError, r"input initial_h has shape")
    bad_r = list(inputs)
    bad_r[2] = inputs[2][..., :-1]
    _attrs_error(op, bad_r, {}, ShapeError, r"input (R|W|B)")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("lens", [[6, 2, 3], [-1, 2, 3], [2, 3]])
def test_sequence_lens_out_of_range(op, lens):
    inputs = make_inputs(op, lens=lens)
    _attrs_error(op, inputs, {}, ShapeError, r"sequence_lens.*between 0 and the sequence length 5")


# ---------------------------------------------------------------- ReverseSequence


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("tail", [(), (3,), (2, 3)])
def test_reverse_sequence_vs_onnxruntime(time_axis, batch_axis, dtype, tail):
    rng = np.random.default_rng(19)
    t_len, n = 5, 4
    shape = [0, 0, *tail]
    shape[time_axis], shape[batch_axis] = t_len, n
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    attrs = {"time_axis": time_axis, "batch_axis": batch_axis}
    for lens in ([5, 1, 3, 2], [1, 1, 1, 1], [5, 5, 5, 5], [0, 5, 2, 4]):
        lens = np.array(lens, np.int64)
        expected = ort_run("ReverseSequence", [x, lens], attrs)[0]
        got = KERNELS["ReverseSequence"].fn(x, lens, **attrs)
        assert_close(got, expected, what=f"{attrs} lens {lens.tolist()}")


def test_reverse_sequence_errors():
    x = np.zeros((5, 4), np.float32)
    rs = KERNELS["ReverseSequence"].fn
    with pytest.raises(ShapeError, match="sequence_lens"):
        rs(x, np.array([6, 1, 1, 1]))
    with pytest.raises(ShapeError, match="sequence_lens"):
        rs(x, np.array([1, 1, 1]))
    with pytest.raises(UnsupportedError, match="batch_axis=0, time_axis=0"):
        rs(x, np.array([1, 1, 1, 1, 1]), batch_axis=0, time_axis=0)
