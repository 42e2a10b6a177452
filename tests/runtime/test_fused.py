"""The fast paths leave results unchanged: the fused optimizer over flat buffers gives, bit for bit, the parameters,
optimizer state and losses of the step graph's own update nodes (which onnxruntime runs in test_session.py), for
every SGD and Adam variant; a refused step changes nothing; a custom optimizer runs its graph."""

from __future__ import annotations

import numpy as np
import pytest
from models import MODELS, batch_for

import edgetrain as et

BATCH = 8
OPTIMIZERS = {
    "sgd": lambda: et.SGD(lr=0.05),
    "sgd_momentum_wd": lambda: et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd_nesterov": lambda: et.SGD(lr=0.05, momentum=0.9, nesterov=True),
    "sgd_dampening": lambda: et.SGD(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-3),
    "sgd_clip": lambda: et.SGD(lr=0.05, momentum=0.9, clip_grad_norm=0.5),
    "adam": lambda: et.Adam(lr=1e-3, weight_decay=1e-4),
    "adamw_clip": lambda: et.AdamW(lr=1e-3, clip_grad_norm=1.0),
}


def sessions(tmp_path, model: str, optimizer, **kw) -> tuple[et.TrainingSession, et.TrainingSession]:
    art = et.convert(
        MODELS[model][0](), loss=et.CrossEntropyLoss(), optimizer=optimizer, batch_size=BATCH, **kw
    )
    path = tmp_path / f"{model}.etrain"
    art.save(path)
    return et.TrainingSession(path), et.TrainingSession(path, fused=False)


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("model", ["mlp", "resnet_tiny"])
def test_fused_update_is_the_graph_update_bit_for_bit(tmp_path, model, opt):
    fast, graph = sessions(tmp_path, model, OPTIMIZERS[opt]())
    assert fast._fused is not None and graph._fused is None
    rng = np.random.default_rng(0)
    x, y = batch_for(model, BATCH)
    for step in range(6):
        xs = x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype)  # other batches, other gradients
        assert fast.train_step(xs, y) == graph.train_step(xs, y), f"step {step}"
    for name, value in graph.snapshot()["values"].items():  # parameters, momentum / moments, the step counter
        np.testing.assert_array_equal(fast.snapshot()["values"][name], value, err_msg=name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_refused_fused_step_changes_nothing_and_checkpoints_round_trip(tmp_path):
    fast, graph = sessions(tmp_path, "mlp", et.Adam(lr=1e-3))
    x, y = batch_for("mlp", BATCH)
    fast.train_step(x, y)
    before = {k: v.copy() for k, v in fast.snapshot()["values"].items()}
    fast.lr = 1e30
    with pytest.raises(et.NonFiniteError):
        for _ in range(5):
            before = {k: v.copy() for k, v in fast.snapshot()["values"].items()}
            fast.train_step(x, y)
    for k, v in fast.snapshot()["values"].items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    fast.lr = 1e-3
    fast.save_checkpoint(tmp_path / "c.etck")
    graph.load_checkpoint(tmp_path / "c.etck")  # the same file format either way
    for k, v in fast.snapshot()["values"].items():
        np.testing.assert_array_equal(graph.snapshot()["values"][k], v, err_msg=k)
    assert fast.train_step(x, y) == graph.train_step(x, y)
    fast.set_parameters({"fc1.weight": np.zeros_like(fast.parameters()["fc1.weight"])})
    assert not fast.parameters()["fc1.weight"].any()


def test_a_custom_optimizer_runs_its_graph(tmp_path):
    class HalfSGD(et.SGD):
        def make(self, g, weight, grad):  # a different update: the runtime cannot fuse it
            return super().make(g, weight, g.op("Mul", grad, g.scalar_like(0.5, grad)))

    fast, _ = sessions(tmp_path, "mlp", HalfSGD(lr=0.05))
    assert fast._fused is None and fast.artifact.fused is None
    x, y = batch_for("mlp", BATCH)
    before = fast.parameters()["fc2.bias"].copy()
    fast.train_step(x, y)
    assert not np.array_equal(fast.parameters()["fc2.bias"], before)


@pytest.mark.parametrize(
    "loss",
    [
        et.CrossEntropyLoss(),
        et.CrossEntropyLoss(reduction="sum"),
        et.CrossEntropyLoss(label_smoothing=0.1),
        et.CrossEntropyLoss(ignore_index=-100),
        et.CrossEntropyLoss(reduction="sum", ignore_index=3, label_smoothing=0.2),
    ],
    ids=["plain", "plain-sum", "smoothing", "ignore", "sum-ignore-smoothing"],
)
def test_fused_cross_entropy_follows_its_standard_op_body_in_onnxruntime(tmp_path, loss):
    """The fused softmax cross-entropy and its gradient kernel against onnxruntime running the training step
    with their ONNX function bodies (the unfused standard ops): losses and parameters over 3 steps."""
    import onnxruntime as ort

    art = et.convert(MODELS["mlp"][0](), loss=loss, optimizer=et.SGD(lr=0.02, momentum=0.9), batch_size=BATCH)
    assert any(n.op_type == "SoftmaxCrossEntropy" for n in art.graph.nodes)
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    osess = ort.InferenceSession(art.training_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in osess.get_outputs()]
    x, y = batch_for("mlp", BATCH)
    y = y.copy()
    y[:2] = -100 if loss.ignore_index == -100 else y[:2]  # rows the loss leaves out
    state = {k: np.array(v) for k, v in art.initial.items()}
    lr = np.asarray(0.02, np.float32)
    for step in range(3):
        out = dict(zip(names, osess.run(None, {"input": x, art.target: y, art.lr: lr, **state})))
        state = {k: out[v] for k, v in art.updates.items()}
        assert sess.train_step(x, y) == pytest.approx(float(out[art.loss]), rel=1e-5, abs=1e-6), step
    for name, value in sess.parameters().items():
        ref = state[name]
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=name)


# ---- every fast path at once, against the plain interpreter --------------------------------------------------
def _plain_steps(path, batches):
    """The artifact's step graph with the private fused ops inlined into standard ops, run node by node by the
    interpreter's plain loop (no memory plan, no compiled code, no buffers of its own), the graph's own update
    nodes applied: (losses, parameters)."""
    from edgetrain.derive.autodiff.functions import inline_private
    from edgetrain.runtime import Interpreter
    from edgetrain.runtime.artifact import load_artifact

    art = load_artifact(path)
    g = inline_private(art.program)
    assert not any(n.domain for n in g.nodes)
    interp = Interpreter(g, preallocate=False)
    io = art.io
    lr = np.asarray(art.record.optimizer.lr, np.float32)
    values = {k: np.array(v) for k, v in art.initial.items()}
    losses = []
    for x, y in batches:
        feeds = {io.data_inputs[0]: x, io.target: y, io.lr: lr, **values}
        out = dict(zip(g.outputs, interp.run({k: feeds[k] for k in g.inputs}, record={})))
        losses.append(float(out[io.loss]))
        for name, new in io.updates.items():
            values[name] = out[new]
    return losses, {p: values[p] for p in io.parameters}


def _optimized_vs_plain(path, batches):
    sess = et.TrainingSession(path)
    assert sess._fused is not None
    losses = [sess.train_step(x, y) for x, y in batches]
    plain_losses, plain = _plain_steps(path, batches)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for k, v in sess.parameters().items():
        scale = max(float(np.abs(plain[k]).max()), 1e-3)
        assert float(np.abs(v - plain[k]).max()) <= 1e-6 * scale, k


@pytest.mark.parametrize("model", list(MODELS))
def test_the_optimized_session_is_the_plain_interpreter(tmp_path, model):
    art = et.convert(
        MODELS[model][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
        batch_size=BATCH,
    )
    art.save(tmp_path / "m.etrain")
    batches = [batch_for(model, BATCH, seed=s) for s in range(3)]
    _optimized_vs_plain(tmp_path / "m.etrain", batches)


ZOO = ["mobilenet_v2", "mobilenet_v3_small", "resnet18", "efficientnet_b0"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ZOO)
def test_the_optimized_session_is_the_plain_interpreter_on_torchvision(tmp_path_factory, model):
    pytest.importorskip("torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)")
    import exports
    import onnx

    exports.declare_torchvision_ops()  # before torchvision loads its compiled ops
    pytest.importorskip("torchvision", reason="torchvision is optional: pip install torchvision==0.28.0")
    ex = exports.export(model, tmp_path_factory.mktemp("exports"), mode="eval", batch=None)
    art = et.convert(
        onnx.load(str(ex.path)),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        batch_size=2,
    )
    path = tmp_path_factory.mktemp("art") / "m.etrain"
    art.save(path)
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((2, *ex.sample_shape)).astype(np.float32), rng.integers(0, ex.num_classes, 2))
        for _ in range(2)
    ]
    _optimized_vs_plain(path, batches)


CONFIGS = {
    "sgd": {"type": "SGD"},
    "sgd_momentum_wd": {"type": "SGD", "momentum": 0.9, "weight_decay": 5e-4},
    "sgd_nesterov_damp": {
        "type": "SGD",
        "momentum": 0.9,
        "nesterov": True,
        "dampening": 0.3,
        "weight_decay": 1e-2,
    },
    "adam": {"type": "Adam", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-4},
    "adamw": {"type": "AdamW", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_the_in_place_update_keeps_a_copy_only_when_its_bound_cannot_vouch_for_the_step(kind):
    # The fused update runs in place; a refused step must still change nothing. The bound that lets it skip the
    # copy must be sound: over values from 1 to 1e25 (the usable limit of float32 is ~1.8e19) and learning rates
    # from 1e-3 to 1e12, whenever no copy was kept the new values are usable, and a refused step put back the
    # parameters and state bit for bit. Random values in (-s, s) over 3 tensors of 40,000 values (2 chunks).
    from edgetrain.runtime import fused
    from edgetrain.runtime.fused import FusedOptimizer
    from edgetrain.runtime.fused import usable as _usable

    config = CONFIGS[kind]
    kinds = ["momentum"] if config.get("momentum") else ["exp_avg", "exp_avg_sq"] if "betas" in config else []
    shapes = {"a": (200, 200), "b": (7,), "c": (3, 5)}
    params = {n: (s, np.float32) for n, s in shapes.items()}
    roles = {f"{k}.{n}": (k, n) for k in kinds for n in shapes}
    if "betas" in config:
        roles["step"] = ("step", "")
    rng = np.random.default_rng(7)
    kept = refused = 0
    for trial in range(60):
        scale = 10.0 ** rng.uniform(0, 25, 3)  # parameters, state, gradients
        lr = float(10.0 ** rng.uniform(-3, 12))
        initial = {
            n: (rng.uniform(-1, 1, s) * min(scale[0], 1.8e19)).astype(np.float32) for n, s in shapes.items()
        }
        for r, (k, n) in roles.items():
            if k != "step":
                v = rng.uniform(0 if k == "exp_avg_sq" else -1, 1, shapes[n]) * min(scale[1], 1.8e19)
                initial[r] = v.astype(np.float32)
        opt = FusedOptimizer(config, params, roles, initial)
        assert sum(g.size for g in opt.groups) > fused.CHUNK  # more than one chunk
        before = {n: v.copy() for n, v in opt.values().items()}
        with np.errstate(all="ignore"):
            for n, gview in opt.gradients().items():
                np.copyto(gview, (rng.uniform(-1, 1, shapes[n]) * scale[2]).astype(np.float32))
            backups = opt.backups
            bad = opt.update(lr)
        if opt.backups == backups:  # the bound vouched for the step: it must be right
            assert bad == [] and all(_usable(v) for v in opt.values().values()), (trial, scale, lr)
        else:
            kept += 1
        if bad:
            refused += 1
            for n, v in opt.values().items():
                np.testing.assert_array_equal(v, before[n], err_msg=f"{n} after a refused step")
    assert kept and refused  # the trials reached both sides of the bound


def test_ordinary_steps_keep_no_copy(tmp_path):
    fast, _ = sessions(tmp_path, "mlp", et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))
    x, y = batch_for("mlp", BATCH)
    for _ in range(5):
        fast.train_step(x, y)
    assert fast._fused.backups == 0
