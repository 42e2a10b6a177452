"""Losses against their closed forms in numpy (as torch defines them), and optimizers against closed-form numpy
implementations over several steps, on a linear model whose gradient is known analytically."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.core.interpreter import Interpreter


def linear_model(n_in: int, n_out: int, *, softmax: bool = False, seed: int = 0, extra_dims=()):
    """y = x @ W + b (optionally Softmax over axis 1); x: [N, n_in, *extra] is laid out so axis 1 is classes."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((n_in, n_out)).astype(np.float32) * 0.5
    b = rng.standard_normal(n_out).astype(np.float32) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"])]
    out = "z"
    if softmax:
        nodes.append(helper.make_node("Softmax", ["z"], ["p"], axis=1))
        out = "p"
    g = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", n_out])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), W, b


def run_loss(art, x, y):
    out = Interpreter(art.graph).run(art.feeds(x, y))
    return float(out[0])


def log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


@pytest.mark.parametrize("softmax", [False, True])
@pytest.mark.parametrize("smoothing,ignore", [(0.0, None), (0.1, None), (0.0, 2), (0.2, -100), (0.1, 0)])
def test_cross_entropy_matches_closed_form(softmax, smoothing, ignore):
    m, W, b = linear_model(6, 5, softmax=softmax)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 6)).astype(np.float32)
    y = rng.integers(0, 5, 7)
    y[1] = 2
    if ignore == -100:
        y[3] = -100
    loss = et.CrossEntropyLoss(label_smoothing=smoothing, ignore_index=ignore)
    art = et.convert(m, loss=loss, optimizer=et.SGD(lr=0.1), batch_size=7)
    z = x.astype(np.float64) @ W + b
    logp = log_softmax(z)
    keep = np.ones(7) if ignore is None else (y != ignore).astype(np.float64)
    safe_y = np.where(keep > 0, y, 0)
    nll = -logp[np.arange(7), safe_y]
    smooth = -logp.mean(1)
    per = (1 - smoothing) * nll + smoothing * smooth
    expected = (per * keep).sum() / keep.sum()
    assert run_loss(art, x, y) == pytest.approx(expected, rel=1e-5)


def test_cross_entropy_through_softmax_is_stable():
    m, W, b = linear_model(4, 3, softmax=True)
    x = np.full((2, 4), 60.0, np.float32)  # logits in the hundreds: probabilities underflow to 0
    y = np.array([np.argmin(x[0] @ W + b), 0])
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    expected = float(-(log_softmax(x.astype(np.float64) @ W + b)[np.arange(2), y]).mean())
    got = run_loss(art, x, y)
    assert np.isfinite(got) and got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_regression_losses_match_closed_form(reduction):
    m, W, b = linear_model(5, 3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = rng.standard_normal((6, 3)).astype(np.float32)
    z = x.astype(np.float64) @ W + b
    red = np.mean if reduction == "mean" else np.sum
    probs = 1 / (1 + np.exp(-t.astype(np.float64)))
    pw = np.array([1.0, 2.0, 0.5])
    log_sig = -np.logaddexp(0, -z)
    log_one_minus = -np.logaddexp(0, z)
    cases = [
        (et.MSELoss(reduction), t, red((z - t) ** 2)),
        (et.L1Loss(reduction), t, red(np.abs(z - t))),
        (
            et.BCEWithLogitsLoss(reduction),
            probs.astype(np.float32),
            red(-(probs * log_sig + (1 - probs) * log_one_minus)),
        ),
        (
            et.BCEWithLogitsLoss(reduction, pos_weight=pw),
            probs.astype(np.float32),
            red(-(pw * probs * log_sig + (1 - probs) * log_one_minus)),
        ),
    ]
    for loss, target, expected in cases:
        art = et.convert(m, loss=loss, optimizer=et.SGD(lr=0.1), batch_size=6)
        assert run_loss(art, x, target) == pytest.approx(float(expected), rel=1e-5), type(loss).__name__


def readme_huber_loss() -> type:
    """The Python API page's custom-loss example, taken from the page itself and run as it stands."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text(encoding="utf-8")
    m = re.search(r"^class HuberLoss\(et\.ILoss\):\n(?:(?:    .*)?\n)+", text, re.M)
    assert m, "docs/python.md lost its custom-loss example"
    ns = {"et": et}
    exec(m.group(0), ns)
    return ns["HuberLoss"]


HuberLoss = readme_huber_loss()


def test_readme_custom_huber_loss():
    m, W, b = linear_model(5, 3)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = (x.astype(np.float64) @ W + b + rng.standard_normal((6, 3)) * 0.6).astype(np.float32)
    d = np.abs(x.astype(np.float64) @ W + b - t)
    expected = np.where(d < 0.5, 0.5 * d**2, 0.5 * (d - 0.25)).mean()
    art = et.convert(m, loss=HuberLoss(0.5), optimizer=et.Adam(lr=1e-3), batch_size=6)
    assert run_loss(art, x, t) == pytest.approx(float(expected), rel=1e-5)
    assert 0 < (d < 0.5).mean() < 1  # both branches are exercised


def test_loss_options_are_checked():
    with pytest.raises(et.UnsupportedError, match="reduction='none'.*scalar"):
        et.CrossEntropyLoss(reduction="none")
    with pytest.raises(et.UnsupportedError, match="label_smoothing=1.5"):
        et.CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(et.UnsupportedError, match="momentum=-0.1"):
        et.SGD(lr=0.1, momentum=-0.1)
    with pytest.raises(et.UnsupportedError, match="nesterov"):
        et.SGD(lr=0.1, nesterov=True)


# ---- optimizers -------------------------------------------------------------------------------------------------


def numpy_optimizer(kind: str, opts: dict):
    """Closed-form reference optimizers (torch.optim semantics), float64; returns step(params, grads, lr)."""
    state: dict = {"t": 0}

    def step(params, grads, lr):
        if opts.get("clip_grad_norm") is not None:
            total = np.sqrt(sum(float((g**2).sum()) for g in grads.values()))
            coef = min(1.0, opts["clip_grad_norm"] / (total + 1e-6))
            grads = {k: g * coef for k, g in grads.items()}
        state["t"] += 1
        out = {}
        for k, w in params.items():
            g = grads[k].copy()
            if kind == "sgd":
                if opts.get("weight_decay"):
                    g = g + opts["weight_decay"] * w
                mom, damp = opts.get("momentum", 0.0), opts.get("dampening", 0.0)
                if mom:
                    buf = state.get(k)
                    buf = g.copy() if buf is None else mom * buf + (1 - damp) * g
                    state[k] = buf
                    g = g + mom * buf if opts.get("nesterov") else buf
                out[k] = w - lr * g
            else:
                b1, b2 = opts.get("betas", (0.9, 0.999))
                eps, wd = opts.get("eps", 1e-8), opts.get("weight_decay", 0.0)
                if kind == "adamw":
                    w = w * (1 - lr * wd)
                elif wd:
                    g = g + wd * w
                m, v = state.get((k, "m"), 0.0), state.get((k, "v"), 0.0)
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                state[(k, "m")], state[(k, "v")] = m, v
                t = state["t"]
                out[k] = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        return out

    return step


OPT_CASES = [
    ("sgd", {}),
    ("sgd", {"momentum": 0.9}),
    ("sgd", {"momentum": 0.9, "weight_decay": 0.01}),
    ("sgd", {"momentum": 0.8, "nesterov": True}),
    ("sgd", {"momentum": 0.9, "dampening": 0.3}),
    ("sgd", {"momentum": 0.9, "clip_grad_norm": 0.05}),
    ("adam", {}),
    ("adam", {"weight_decay": 0.05}),
    ("adam", {"betas": (0.8, 0.99), "eps": 1e-6}),
    ("adamw", {"weight_decay": 0.1}),
    ("adamw", {"weight_decay": 0.01, "clip_grad_norm": 0.1}),
]


@pytest.mark.parametrize("kind,opts", OPT_CASES, ids=[f"{k}-{o}" for k, o in OPT_CASES])
def test_optimizer_matches_closed_form(kind, opts):
    m, W, b = linear_model(4, 3, seed=5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    cls = {"sgd": et.SGD, "adam": et.Adam, "adamw": et.AdamW}[kind]
    lr0 = 0.1 if kind == "sgd" else 0.01
    art = et.convert(m, loss=et.MSELoss(), optimizer=cls(lr=lr0, **opts), batch_size=5)
    interp = Interpreter(art.graph)
    ref = numpy_optimizer(kind, opts)
    params = {"W": W.astype(np.float64), "b": b.astype(np.float64)}
    values = dict(art.initial)
    for k, lr in enumerate([lr0, lr0, lr0, lr0 / 2, lr0 / 2, lr0 * 2]):  # lr is an input: it changes freely
        out = dict(zip(art.graph.outputs, interp.run(art.feeds(x, t, lr, values))))
        values = {name: out[new] for name, new in art.updates.items()}
        r = x.astype(np.float64) @ params["W"] + params["b"] - t
        grads = {"W": 2 * x.T.astype(np.float64) @ r / r.size, "b": 2 * r.sum(0) / r.size}
        params = ref(params, grads, lr)
        for name in ("W", "b"):
            np.testing.assert_allclose(
                values[name],
                params[name],
                rtol=2e-5,
                atol=1e-6,
                err_msg=f"{kind} {opts} step {k + 1}: {name}",
            )
