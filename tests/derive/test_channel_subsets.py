"""Weights that train on a subset of their input channels (`convert(channels=...)`, the memory budget's sparse
options): the sparse tensor update of "On-Device Training Under 256KB Memory" (issue 25).

The reference is PyTorch with each split weight written as cat(trained Parameter, frozen tensor) on its input-channel
axis, trained by torch.optim.SGD with momentum and weight decay: the trained channels follow it, the frozen ones
never move, and the export is the model as it came, its weights whole, which onnxruntime runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.core.errors import UnsupportedError
from edgetrain.derive.budget import CHANNEL_SHARE
from edgetrain.graph.sections import MemoryBudgetSection
from edgetrain.runtime.describe import artifact_step_memory

LENET = str(Path(et.__file__).parent / "data" / "digits_lenet.onnx")
BATCH, STEPS = 4, 4
LR, MOMENTUM, DECAY = 0.05, 0.9, 1e-3


def _model() -> onnx.ModelProto:
    """x [n, 3, 6, 6] -> Conv(8) + Relu -> Conv(8) + Relu -> Flatten -> Gemm(transB=1, 24) + Relu -> Gemm(transB=0,
    12) + Relu -> MatMul(5) -> Add bias: every form of layer that can be split, and a depthwise conv that cannot."""
    rng = np.random.default_rng(0)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("c1.w", 8, 3, 3, 3),
        init("c1.b", 8),
        init("dw.w", 8, 1, 3, 3),
        init("c2.w", 8, 8, 3, 3),
        init("c2.b", 8),
        init("fc1.w", 24, 288, scale=0.05),
        init("fc1.b", 24),
        init("fc2.w", 24, 12, scale=0.2),
        init("fc2.b", 12),
        init("proj.w", 12, 5, scale=0.3),
        init("proj.b", 5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["h1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("Conv", ["r1", "dw.w"], ["d1"], pads=[1, 1, 1, 1], group=8, name="depthwise"),
        helper.make_node("Conv", ["d1", "c2.w", "c2.b"], ["h2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "fc1.w", "fc1.b"], ["g1"], transB=1, name="fc1"),
        helper.make_node("Relu", ["g1"], ["s1"]),
        helper.make_node("Gemm", ["s1", "fc2.w", "fc2.b"], ["g2"], name="fc2"),
        helper.make_node("Relu", ["g2"], ["s2"]),
        helper.make_node("MatMul", ["s2", "proj.w"], ["m"], name="proj"),
        helper.make_node("Add", ["m", "proj.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


AXIS = {"c1.w": 1, "c2.w": 1, "fc1.w": 1, "fc2.w": 0, "proj.w": 0}  # each weight's input-channel axis


def _batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, BATCH)


def _torch_steps(model: onnx.ModelProto, channels: dict[str, int], x, y):
    """PyTorch: (losses, {parameter: value}) after STEPS steps, each split weight cat(trained, frozen)."""
    torch = pytest.importorskip("torch", reason="PyTorch is the reference (pip install torch==2.13.0)")
    F = torch.nn.functional
    w = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
    params, frozen = {}, {}
    for name, t in w.items():
        if name == "dw.w":  # the depthwise conv trains too (its weight cannot be split)
            params[name] = torch.nn.Parameter(t.clone())
        elif name in channels:
            k = channels[name]
            params[name] = torch.nn.Parameter(t.narrow(AXIS[name], 0, k).clone())
            frozen[name] = t.narrow(AXIS[name], k, t.shape[AXIS[name]] - k).clone()
        else:
            params[name] = torch.nn.Parameter(t.clone())

    def weight(name):
        return torch.cat([params[name], frozen[name]], AXIS[name]) if name in frozen else params[name]

    def forward(x):
        h = F.relu(F.conv2d(x, weight("c1.w"), params["c1.b"], padding=1))
        h = F.conv2d(h, params["dw.w"], padding=1, groups=8)
        h = F.relu(F.conv2d(h, weight("c2.w"), params["c2.b"], padding=1)).flatten(1)
        h = F.relu(F.linear(h, weight("fc1.w"), params["fc1.b"]))
        h = F.relu(h @ weight("fc2.w") + params["fc2.b"])
        return h @ weight("proj.w") + params["proj.b"]

    opt = torch.optim.SGD(params.values(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY)
    xt, yt = torch.tensor(x), torch.tensor(y)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(forward(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    def logits(x: np.ndarray) -> np.ndarray:  # the trained model, on numpy data
        with torch.no_grad():
            return forward(torch.tensor(x)).numpy()

    return losses, {k: v.detach().numpy() for k, v in params.items()}, logits


def _convert(model, **kw):
    opt = et.SGD(lr=LR, momentum=MOMENTUM, weight_decay=DECAY)
    return et.convert(model, loss=et.CrossEntropyLoss(), optimizer=opt, batch_size=BATCH, **kw)


CASES = {
    "conv": {"c2.w": 3},
    "first conv": {"c1.w": 1},
    "gemm transB": {"fc1.w": 100},
    "gemm": {"fc2.w": 7},
    "matmul": {"proj.w": 5},
    "all": {"c1.w": 2, "c2.w": 5, "fc1.w": 200, "fc2.w": 3, "proj.w": 11},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_trained_channels_follow_pytorch_and_the_others_never_move(case, tmp_path):
    channels = CASES[case]
    model = _model()
    x, y = _batch()
    ref_losses, ref, forward = _torch_steps(model, channels, x, y)
    art = _convert(model, channels=channels)
    art.save(tmp_path / "split.etrain")
    sess = et.TrainingSession(tmp_path / "split.etrain")
    losses = [sess.train_step(x, y) for _ in range(STEPS)]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    values = sess.parameters()
    trained = {f"{w}.channels": w for w in channels}
    assert sorted(trained.get(p, p) for p in values) == sorted(ref)  # the trained set: PyTorch's parameters
    for p, v in values.items():
        np.testing.assert_allclose(v, ref[trained.get(p, p)], rtol=1e-4, atol=1e-6, err_msg=p)
        assert v.shape == ref[trained.get(p, p)].shape
    # the export: the model as it came (same nodes, same weight names), its weights whole
    sess.export_onnx(tmp_path / "personal.onnx")
    out = onnx.load(str(tmp_path / "personal.onnx"))
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert {t.name for t in out.graph.initializer} == {t.name for t in model.graph.initializer}
    weights = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for w, k in channels.items():
        kept = np.take(original[w], range(k, original[w].shape[AXIS[w]]), axis=AXIS[w])
        assert np.array_equal(np.take(weights[w], range(k, weights[w].shape[AXIS[w]]), axis=AXIS[w]), kept)
        np.testing.assert_allclose(np.take(weights[w], range(k), axis=AXIS[w]), ref[w], rtol=1e-4, atol=1e-6)
    got = ort.InferenceSession(str(tmp_path / "personal.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, forward(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, sess.run(x), rtol=1e-5, atol=1e-5)  # the split sums its halves


def test_the_split_is_told_and_its_state_is_the_trained_part(tmp_path):
    art = _convert(_model(), channels={"fc1.w": np.int64(72)})  # a numpy count as well as an int
    assert any("'fc1.w' 72 of 288" in n for n in art.notes)
    assert "fc1.w" not in art.parameters and "fc1.w.channels" in art.parameters
    momentum = next(s for s in art.state if s.startswith("fc1.w.channels"))
    assert art.initial[momentum].shape == (24, 72)
    art.save(tmp_path / "a.etrain")
    # the trained part's gradient and momentum are a quarter of the weight's: the planned peak is smaller
    full = _convert(_model())
    full.save(tmp_path / "full.etrain")
    split_peak = artifact_step_memory(tmp_path / "a.etrain")["peak_bytes"]
    assert split_peak < artifact_step_memory(tmp_path / "full.etrain")["peak_bytes"]


@pytest.mark.parametrize(
    "channels,match",
    [
        ({"dw.w": 2}, r"'dw.w' cannot train on a subset .* Conv \(group 1\)"),
        ({"nope": 2}, r"'nope' cannot train on a subset"),
        ({"c2.w": 8}, r"'c2.w' has 8 input channels; give a count from 1 to 7"),
        ({"c2.w": 0}, r"from 1 to 7"),
        ({"c2.w": 2.5}, r"from 1 to 7"),
        (["c2.w"], r"channels must map weight names to counts, e\.g\."),
        ("c2.w", r"channels must map weight names to counts"),
    ],
)
def test_a_weight_that_cannot_be_split_is_refused_with_what_can(channels, match):
    with pytest.raises(UnsupportedError, match=match):
        _convert(_model(), channels=channels)


def test_channels_and_a_memory_budget_do_not_mix():
    with pytest.raises(UnsupportedError, match="memory_budget"):
        _convert(_model(), channels={"c2.w": 2}, memory_budget="1MB")


def test_a_tight_budget_takes_the_variant_on_part_of_the_channels_when_it_reaches_more_layers(tmp_path):
    """The digits LeNet at 1/8 of full fine-tuning's budgeted peak: in full, only the last layer fits; on a
    quarter of their input channels, the last two do, and the budget takes that."""
    full = et.convert(
        LENET,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9),
        batch_size=10,
    )
    full.save(tmp_path / "full.etrain")
    budget = artifact_step_memory(tmp_path / "full.etrain")["budgeted_bytes"] // 8
    art = et.convert(
        LENET,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9),
        batch_size=10,
        memory_budget=budget,
    )
    chosen = art.section(MemoryBudgetSection).chosen
    assert f"on 1/{CHANNEL_SHARE} of their input channels" in chosen["name"], chosen
    assert chosen["channels"] and all(f"{w}.channels" in art.parameters for w in chosen["channels"])
    assert chosen["trainable_values"] == sum(art.initial[p].size for p in art.parameters)
    art.save(tmp_path / "b.etrain")
    assert artifact_step_memory(tmp_path / "b.etrain")["budgeted_bytes"] <= budget
    names = [o["name"] for o in art.section(MemoryBudgetSection).weighed]
    assert any(
        "of their input channels" not in n and "the last 2 of" in n for n in names
    )  # weighed, too large


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda c: c[0].update(count=99), "malformed split layer"),
        (lambda c: c[0].update(frozen="nowhere"), "split of 'c2.w' names a tensor or node"),
        (lambda c: c[0].update(nodes=["gone"]), "split of 'c2.w' names a tensor or node"),
        (lambda c: c.append("a split"), "malformed split layer"),
    ],
)
def test_a_damaged_split_record_is_refused_naming_the_file(damage, match, tmp_path):
    from edgetrain.core.container import read_container, write_container
    from edgetrain.core.errors import ArtifactError

    _convert(_model(), channels={"c2.w": 3}).save(tmp_path / "a.etrain")
    header, tensors = read_container(tmp_path / "a.etrain")
    damage(header["channels"])
    write_container(tmp_path / "b.etrain", kind="artifact", header=header, tensors=dict(tensors))
    with pytest.raises(ArtifactError, match=match) as e:
        et.TrainingSession(tmp_path / "b.etrain")
    assert "b.etrain" in str(e.value)
