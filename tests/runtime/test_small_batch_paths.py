"""Issue 25's small-batch fast paths leave every result as the plain path makes it: kernels specialized for a step's
static shapes ("lean_kernels"), the fused update's carried norm bounds ("update_bound"), SGD over whole buffers with
the gradients as scratch ("update_whole") and the session's one-pass feed checks ("lean_step") give, bit for bit,
the losses, parameters and optimizer state of the same session built under fastpaths.plain(), on the test models at
batch 1 and 8; the fused update equals closed-form numpy for every SGD and Adam variant; the step at batch 1 equals
a float64 numpy MLP; feeds the lean checks pass are refused as before."""

from __future__ import annotations

import numpy as np
import pytest
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core import fastpaths

PATHS = ("lean_kernels", "update_bound", "update_whole", "lean_step")
OPTIMIZERS = {
    "sgd": lambda: et.SGD(lr=0.05),
    "sgd_momentum_wd": lambda: et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd_nesterov": lambda: et.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adamw": lambda: et.AdamW(lr=1e-3, weight_decay=1e-2),
}


def _session(model: str, batch: int, optimizer, off: tuple[str, ...] | None = None) -> et.TrainingSession:
    """A session of the model; off: the fast paths turned off while converting and compiling (() for none)."""
    proto = MODELS[model][0]()

    def make():
        art = et.convert(proto, loss=et.CrossEntropyLoss(), optimizer=optimizer, batch_size=batch)
        return et.TrainingSession(art)

    if not off:
        return make()
    with fastpaths.plain(*off):
        return make()


def _lean_steps(sess: et.TrainingSession) -> list[str]:
    """The op types whose kernels the step runs specialized."""
    return [st.node.op_type for st in sess._step_program.steps if "_lean" in st.fn.__qualname__]


def _same_training(
    fast: et.TrainingSession, plain: et.TrainingSession, model: str, batch: int, steps: int = 4
):
    x, y = batch_for(model, batch)
    rng = np.random.default_rng(0)
    for step in range(steps):
        xs = x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype)  # other batches, other gradients
        assert fast.train_step(xs, y) == plain.train_step(xs, y), f"step {step}"
    want = plain.snapshot()["values"]
    for name, value in fast.snapshot()["values"].items():  # parameters, momentum / moments, the step counter
        np.testing.assert_array_equal(value, want[name], err_msg=name)


@pytest.mark.parametrize("opt", ["sgd", "sgd_momentum_wd"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("model", list(MODELS))
def test_the_fast_paths_train_as_the_plain_path_bit_for_bit(model, batch, opt):
    fast = _session(model, batch, OPTIMIZERS[opt]())
    plain = _session(model, batch, OPTIMIZERS[opt](), off=("all",))
    lean = _lean_steps(fast)
    assert "Gemm" in lean and "SoftmaxCrossEntropyGrad" in lean  # the test runs the specialized kernels
    assert not _lean_steps(plain)
    assert fast._lean_feeds is not None and plain._lean_feeds is None
    _same_training(fast, plain, model, batch)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_each_fast_path_alone_changes_nothing(path, opt):
    # the MLP at batch 1 with one path off at a time: each is exact by itself, not only all of them together
    fast = _session("mlp", 1, OPTIMIZERS[opt]())
    without = _session("mlp", 1, OPTIMIZERS[opt](), off=(path,))
    _same_training(fast, without, "mlp", 1, steps=6)


def test_the_plain_path_is_what_edgetrain_plain_turns_on(monkeypatch):
    monkeypatch.setenv("EDGETRAIN_PLAIN", "lean_kernels")
    sess = _session("mlp", 1, OPTIMIZERS["sgd"]())
    assert not _lean_steps(sess) and sess._lean_feeds is not None
    monkeypatch.setenv("EDGETRAIN_PLAIN", "all")
    sess = _session("mlp", 1, OPTIMIZERS["sgd"]())
    assert not _lean_steps(sess) and sess._lean_feeds is None
    assert not sess._fused._carry and not sess._fused._whole


# ---- the step at batch 1 against float64 numpy -------------------------------------------------------------------
def _mlp_reference(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, lr: float):
    """(loss, the parameters after one plain SGD step) of tests/harness/models.py's MLP in float64 numpy."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x = x.astype(np.float64)
    h = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
    z = h @ p["fc2.weight"].T + p["fc2.bias"]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(y)
    loss = -logp[np.arange(n), y].mean()
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1
    dz /= n
    dh = (dz @ p["fc2.weight"]) * (h > 0)
    grads = {
        "fc2.weight": dz.T @ h,
        "fc2.bias": dz.sum(axis=0),
        "fc1.weight": dh.T @ x,
        "fc1.bias": dh.sum(axis=0),
    }
    return loss, {k: p[k] - lr * g for k, g in grads.items()}


@pytest.mark.parametrize("batch", [1, 3])
def test_a_small_batch_step_is_float64_numpy(batch):
    sess = _session("mlp", batch, et.SGD(lr=0.5))
    assert _lean_steps(sess)
    x, y = batch_for("mlp", batch, seed=4)
    before = sess.parameters()
    loss = sess.train_step(x, y)
    want_loss, want = _mlp_reference(before, x, y, 0.5)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name, value in sess.parameters().items():
        scale = float(np.abs(want[name]).max())
        assert float(np.abs(value - want[name]).max()) <= 1e-5 * scale, name


# ---- the fused update against closed-form numpy --------------------------------------------------------------------
CLOSED_FORM = {
    "sgd": {"type": "SGD"},
    "sgd_wd": {"type": "SGD", "weight_decay": 1e-2},
    "momentum": {"type": "SGD", "momentum": 0.9},
    "momentum_wd": {"type": "SGD", "momentum": 0.9, "weight_decay": 5e-4},
    "nesterov": {"type": "SGD", "momentum": 0.8, "nesterov": True, "weight_decay": 1e-3},
    "dampening": {"type": "SGD", "momentum": 0.9, "dampening": 0.3},
    "adam": {"type": "Adam", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-4},
    "adamw": {"type": "AdamW", "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 1e-2},
}


def _closed_form(c: dict, w, state: dict, g, lr: float, t: int):
    """PyTorch's update rules in float64: (w', state')."""
    wd = c.get("weight_decay", 0.0)
    if c["type"] == "SGD":
        d = g + wd * w
        if c.get("momentum"):
            m, damp = c["momentum"], c.get("dampening", 0.0)
            v = d if t == 1 else m * state["momentum"] + (1 - damp) * d
            state = {"momentum": v}
            d = d + m * v if c.get("nesterov") else v
        return w - lr * d, state
    b1, b2 = c["betas"]
    if c["type"] == "AdamW":
        w = w * (1 - lr * wd)
    else:
        g = g + wd * w
    m = b1 * state["exp_avg"] + (1 - b1) * g
    v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
    step = lr / (1 - b1**t) * m / (np.sqrt(v / (1 - b2**t)) + c["eps"])
    return w - step, {"exp_avg": m, "exp_avg_sq": v}


@pytest.mark.parametrize("kind", list(CLOSED_FORM))
def test_the_fused_update_is_the_closed_form(kind):
    from edgetrain.runtime.fused import FusedOptimizer

    c = CLOSED_FORM[kind]
    kinds = ["momentum"] if c.get("momentum") else ["exp_avg", "exp_avg_sq"] if "betas" in c else []
    shapes = {"w": (300, 130), "b": (130,), "s": ()}  # more than a chunk, a vector, a scalar
    rng = np.random.default_rng(3)
    initial = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    roles = {f"{k}.{n}": (k, n) for k in kinds for n in shapes}
    if "betas" in c or c.get("dampening"):  # the step counter (dampening: v = g on the first step)
        roles["step"] = ("step", "")
    opt = FusedOptimizer(c, {n: (s, np.float32) for n, s in shapes.items()}, roles, initial)
    w = {n: v.astype(np.float64) for n, v in initial.items()}
    state = {n: {k: np.zeros(shapes[n]) for k in kinds} for n in shapes}
    lr = 0.03
    for t in range(1, 6):
        grads = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        for n, view in opt.gradients().items():
            np.copyto(view, grads[n])
        assert opt.update(lr) == []
        for n in shapes:
            w[n], state[n] = _closed_form(c, w[n], state[n], grads[n].astype(np.float64), lr, t)
        values = opt.values()
        for n in shapes:
            # float32 against float64: within 1e-6 of the tensor's scale (w - step cancels near zero)
            scale = 1e-6 * max(1.0, float(np.abs(w[n]).max()))
            np.testing.assert_allclose(values[n], w[n], rtol=1e-5, atol=scale, err_msg=f"{n} step {t}")
            for k in kinds:
                np.testing.assert_allclose(
                    values[f"{k}.{n}"], state[n][k], rtol=1e-5, atol=1e-6, err_msg=f"{k}.{n} step {t}"
                )
    assert opt.backups == 0 and all(k is not None for k in opt._known)  # the bounds were carried


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kind", ["sgd", "momentum_wd", "adam"])
def test_carried_bounds_stay_sound_as_the_values_grow(kind):
    # Over steps whose learning rate grows by 10x each, the carried bound must always bound the true norms: a
    # step it vouches for (no copy kept) leaves every value usable, and a refused step changes nothing.
    from edgetrain.runtime.fused import FusedOptimizer, usable

    c = CLOSED_FORM[kind]
    kinds = ["momentum"] if c.get("momentum") else ["exp_avg", "exp_avg_sq"] if "betas" in c else []
    shapes = {"a": (200, 200), "b": (7,)}
    rng = np.random.default_rng(5)
    initial = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in shapes.items()}
    roles = {f"{k}.{n}": (k, n) for k in kinds for n in shapes}
    if "betas" in c:
        roles["step"] = ("step", "")
    opt = FusedOptimizer(c, {n: (s, np.float32) for n, s in shapes.items()}, roles, initial)
    refused = 0
    for t in range(40):
        before = {n: v.copy() for n, v in opt.values().items()}
        for n, view in opt.gradients().items():
            np.copyto(view, rng.uniform(-1, 1, shapes[n]).astype(np.float32) * np.float32(1e3))
        backups = opt.backups
        bad = opt.update(10.0 ** (t - 5))
        if opt.backups == backups:
            assert bad == [] and all(usable(v) for v in opt.values().values()), t
        for k, g in zip(opt._known, opt.groups):  # a carried bound is at least the norm it bounds
            if k is not None:
                # (within the float32 dot's rounding of the gradients' norms, which MARGIN covers)
                assert k["params"] * (1 + 1e-3) >= float(np.linalg.norm(g.params.astype(np.float64))), t
        if bad:
            refused += 1
            for n, v in opt.values().items():
                np.testing.assert_array_equal(v, before[n], err_msg=f"{n} after a refused step {t}")
    assert refused


@pytest.mark.parametrize("kind", [k for k in CLOSED_FORM if CLOSED_FORM[k]["type"] == "SGD"])
def test_sgd_over_whole_buffers_is_the_chunked_update_and_keeps_gradients_it_may_not_use(kind):
    # rewrites_gradients=False (a session whose step leaves a gradient unwritten): the chunked update, gradients
    # untouched; True: the gradients may be overwritten, the parameters and state are the same bit for bit
    from edgetrain.runtime.fused import FusedOptimizer

    c = CLOSED_FORM[kind]
    kinds = ["momentum"] if c.get("momentum") else []
    shapes = {"w": (300, 130), "b": (130,)}
    rng = np.random.default_rng(11)
    initial = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    roles = {f"{k}.{n}": (k, n) for k in kinds for n in shapes}
    if c.get("dampening"):
        roles["step"] = ("step", "")
    params = {n: (s, np.float32) for n, s in shapes.items()}
    whole = FusedOptimizer(c, params, roles, initial)
    chunked = FusedOptimizer(c, params, roles, initial, rewrites_gradients=False)
    assert whole._whole and not chunked._whole
    for _ in range(3):
        grads = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        for opt in (whole, chunked):
            for n, view in opt.gradients().items():
                np.copyto(view, grads[n])
            assert opt.update(0.1) == []
        for n, view in chunked.gradients().items():
            np.testing.assert_array_equal(view, grads[n], err_msg=n)
        for n, v in whole.values().items():
            np.testing.assert_array_equal(v, chunked.values()[n], err_msg=n)


# ---- the lean feed checks refuse what check_feeds refuses ----------------------------------------------------------
@pytest.mark.parametrize("labels", [[-1], [10], [2**63 + 5]])
def test_out_of_range_labels_are_still_refused(labels):
    sess = _session("mlp", 1, OPTIMIZERS["sgd"]())
    x, _ = batch_for("mlp", 1)
    y = np.array(labels, np.uint64 if labels[0] > 2**62 else np.int64)
    with pytest.raises(et.FeedError, match="out of range|beyond|label"):
        sess.train_step(x, y)


def test_labels_of_other_integer_dtypes_train_as_int64():
    sess = _session("mlp", 2, OPTIMIZERS["sgd"]())
    plain = _session("mlp", 2, OPTIMIZERS["sgd"](), off=("lean_step",))
    x, y = batch_for("mlp", 2)
    for dtype in (np.int32, np.uint8, np.int16):
        assert sess.train_step(x, y.astype(dtype)) == plain.train_step(x, y)


def test_batches_of_another_shape_or_dtype_are_still_refused():
    sess = _session("mlp", 2, OPTIMIZERS["sgd"]())
    x, y = batch_for("mlp", 2)
    with pytest.raises(et.FeedError, match=r"shape \[2, 784\]"):
        sess.train_step(x[:1], y[:1])
    with pytest.raises(et.FeedError, match=r"shape \[2, 784\]"):
        sess.train_step(x.reshape(2, 28, 28), y)
    with pytest.raises(et.FeedError, match="takes float32"):
        sess.train_step(x.astype(np.float16).view(np.int16), y)
