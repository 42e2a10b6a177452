"""Derived training steps on small real architectures: onnxruntime running training_onnx() equals edgetrain's
interpreter on the same step, training lowers the loss, frozen parameters stay bit-identical, and a head-only
conversion has no backward for the frozen layers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ops import PRIVATE_DOMAIN

BATCH = 8


def step_outputs(art: et.TrainingArtifact, interp: Interpreter, values, x, y, lr) -> dict[str, np.ndarray]:
    out = interp.run(art.feeds(x, y, lr, values))
    return dict(zip(art.graph.outputs, out))


def train(art: et.TrainingArtifact, x, y, steps: int, lr: float | None = None):
    """Runs steps on one batch with edgetrain's interpreter; returns (losses, final values)."""
    interp = Interpreter(art.graph)
    values = dict(art.initial)
    losses = []
    for _ in range(steps):
        out = step_outputs(art, interp, values, x, y, lr)
        losses.append(float(out[art.loss]))
        values = {name: out[new] for name, new in art.updates.items()}
    return losses, values


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


OPTIMIZERS = {
    "sgd_momentum_wd": lambda: et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd_nesterov": lambda: et.SGD(lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda: et.Adam(lr=1e-3),
    "adamw_clip": lambda: et.AdamW(lr=1e-3, weight_decay=0.01, clip_grad_norm=0.5),
}
CASES = (
    [(m, o) for m in MODELS for o in ("sgd_momentum_wd",)]
    + [("mlp", o) for o in OPTIMIZERS if o != "sgd_momentum_wd"]
    + [("lenet", "adam")]
)


@pytest.mark.parametrize("model,opt", CASES)
def test_step_matches_onnxruntime(model, opt):
    build, _, _ = MODELS[model]
    art = et.convert(build(), loss=et.CrossEntropyLoss(), optimizer=OPTIMIZERS[opt](), batch_size=BATCH)
    x, y = batch_for(model, BATCH)
    step_model = art.training_onnx()
    onnx.checker.check_model(step_model, full_check=True)
    # onnxruntime: data, labels and lr only; parameters and state take their initializer values
    lr = np.asarray(art.optimizer_config["lr"], np.float32)
    theirs = ort_session(step_model).run(None, {"input": x, art.target: y, art.lr: lr})
    ours = step_outputs(art, Interpreter(art.graph), art.initial, x, y, lr)
    assert [o.name for o in step_model.graph.output] == art.graph.outputs
    theirs = dict(zip(art.graph.outputs, theirs))
    for name, t in theirs.items():
        o = ours[name]
        assert o.shape == t.shape and o.dtype == t.dtype, name
        if name.endswith(".weight.updated") or name.endswith(".bias.updated"):
            param = name[: -len(".updated")]
            m = theirs.get(f"{param}.exp_avg.updated")
            if m is not None:
                # Adam divides each gradient element by its own magnitude: where a gradient is at float32
                # rounding level (|m| tiny), its step direction is rounding noise in either runtime. Compare the
                # parameter where the gradient is meaningful; m and v themselves are compared in full.
                keep = (np.abs(m) >= 1e-4 * np.abs(m).max()) | (m == 0)
                assert keep.mean() > 0.5, f"{name}: too few elements with a meaningful gradient"
                # elsewhere the two may step in different directions, but by no more than one step each
                assert np.all(np.abs(o[~keep] - t[~keep]) <= 2.01 * lr), name
                o, t = o[keep], t[keep]
        scale = max(float(np.abs(t).max()), 1e-3)
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{model}/{opt}: {name}")
    # the step really moves every parameter
    for p in art.parameters:
        assert not np.array_equal(ours[art.updates[p]], art.initial[p]), f"{p} did not change"


@pytest.mark.parametrize("model", list(MODELS))
def test_twenty_steps_lower_the_loss(model, report):
    build, _, _ = MODELS[model]
    art = et.convert(
        build(), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.02, momentum=0.9), batch_size=BATCH
    )
    x, y = batch_for(model, BATCH)
    losses, _ = train(art, x, y, 20)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses
    report(
        "training: 20 SGD steps on one batch of 8", f"{model:20s} loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )


def test_head_only_lenet_freezes_and_prunes():
    art = et.convert(
        MODELS["lenet"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        trainable=["fc3.*"],
        batch_size=BATCH,
    )
    assert art.parameters == ["fc3.weight", "fc3.bias"]
    frozen = set(art.frozen)
    assert {"conv1.weight", "conv2.bias", "fc1.weight", "fc2.bias"} <= frozen
    # No backward at all for the frozen layers: nothing but the head's Gemm and the loss gets a gradient, and no
    # fused convolution/pooling backward exists (the fused loss's own gradient does).
    forward = {n.name for n in art.inference.nodes}
    backward = [n for n in art.graph.nodes if n.name not in forward]
    assert not [
        n for n in backward if n.domain == PRIVATE_DOMAIN and "Conv" in n.op_type or "Pool" in n.op_type
    ]
    fc2_out = next(n.outputs[0] for n in art.inference.nodes if "fc2.weight" in n.inputs)
    assert not [n for n in backward if any(i in frozen for i in n.inputs)]
    assert len(backward) < 40, [n.op_type for n in backward]
    x, y = batch_for("lenet", BATCH)
    losses, values = train(art, x, y, 10)
    assert losses[-1] < losses[0]
    assert set(values) == {"fc3.weight", "fc3.bias", "fc3.weight.momentum", "fc3.bias.momentum"}
    # the frozen weights are not even inputs of the step: they are bit-identical constants
    for name in frozen:
        assert name in art.graph.initializers and name not in art.graph.inputs
        np.testing.assert_array_equal(
            art.graph.initializers[name],
            onnx.numpy_helper.to_array(
                next(t for t in MODELS["lenet"][0]().graph.initializer if t.name == name)
            ),
        )
    assert fc2_out  # the head reads the frozen trunk's output


def test_default_trainable_set_excludes_statistics():
    art = et.convert(
        MODELS["resnet_tiny"][0](), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), batch_size=2
    )
    assert "stem_bn.weight" in art.parameters and "stem_bn.bias" in art.parameters
    assert not [p for p in art.parameters if "running" in p]
    assert "stem.weight" in art.parameters and "fc.bias" in art.parameters


def test_trainable_patterns_and_errors():
    lenet = MODELS["lenet"][0]()
    art = et.convert(
        lenet,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.1),
        trainable=["conv*", "fc3.bias"],
        batch_size=2,
    )
    assert art.parameters == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc3.bias"]
    with pytest.raises(
        et.UnsupportedError,
        match=r"pattern 'head\.\*' matches no parameter name and no node name\. Parameters: 'conv1",
    ):
        et.convert(
            lenet, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), trainable=["head.*"], batch_size=2
        )
    resnet = MODELS["resnet_tiny"][0]()
    with pytest.raises(
        et.UnsupportedError, match="'stem_bn.running_mean' cannot be trained: it is the running mean of Batch"
    ):
        et.convert(
            resnet,
            loss=et.CrossEntropyLoss(),
            optimizer=et.SGD(lr=0.1),
            trainable=["stem_bn.running_mean"],
            batch_size=2,
        )


def test_missing_gradient_rule_names_op_node_and_what_to_freeze():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w2")
    three = numpy_helper.from_array(np.full((1,), 3.0, np.float32), "three")
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Mod", ["h", "three"], ["f"], name="modulo", fmod=1),
            helper.make_node("MatMul", ["f", "w2"], ["y"], name="mm2"),
        ],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [w1, w2, three],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        et.UnsupportedError, match=r"'modulo' \(Mod\) has no gradient rule.*'w1'.*trainable=\['w2'\]"
    ):
        et.convert(m, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1))
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), trainable=["w2"])
    assert art.parameters == ["w2"]
