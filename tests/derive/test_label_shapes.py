"""How labels must look, by the model's output: class scores with singleton spatial axes ([N, C, 1, 1], SqueezeNet's
pooled Conv head, exported by PyTorch both ways) take one class per sample, [N] or [N, 1, 1], from the command line
and from Python, and train as PyTorch's CrossEntropyLoss on the flattened logits; a [N, C] classifier trains as
before; a segmentation's [N, C, H, W] keeps one label per position. `edgetrain check` and `convert` say how the
labels must look; convert's notes summarize the re-batched nodes; check counts the frozen tensors as convert does."""

from __future__ import annotations

import copy
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.cli import main
from edgetrain.core.ir import TensorInfo
from edgetrain.derive.autodiff.rules.math import cross_entropy_graph
from edgetrain.runtime.trainer import evaluate
from loaders import ArrayDataView, DataError, DataLoader, check_labels

CLASSES, BATCH, SAMPLES = 5, 4, 12  # 3 steps of 4 samples
LR, MOMENTUM = 0.1, 0.9


# ---- models written with onnx.helper ------------------------------------------------------------------------------
def _save(tmp_path, name, nodes, inputs, outputs, inits, opset=17) -> str:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _f32(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def _conv_head(tmp_path, name: str, tail: list, out_shape: list, extra=(), hw: int = 4) -> tuple[str, dict]:
    """x [N, 3, hw, hw] -> Conv(3 -> CLASSES, 1x1) 'scores' -> tail nodes -> 'y' of out_shape (N symbolic)."""
    rng = np.random.default_rng(0)
    weights = {"w": _f32(rng, CLASSES, 3, 1, 1), "b": _f32(rng, CLASSES)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["scores"], name="head"), *tail]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()] + list(extra)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    return _save(tmp_path, name, nodes, [x], [y], inits), weights


def _segmentation(tmp_path) -> tuple[str, dict]:
    return _conv_head(
        tmp_path, "segment", [helper.make_node("Identity", ["scores"], ["y"])], ["N", CLASSES, 4, 4]
    )


def _language_model(tmp_path, vocab: int = 11, positions: int = 6, width: int = 8) -> str:
    """token ids [N, T] -> embedding table -> MatMul head -> [N, T, vocab] logits."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head"),
    ]
    inits = [
        numpy_helper.from_array(_f32(rng, vocab, width), "table"),
        numpy_helper.from_array(_f32(rng, width, vocab), "head"),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", positions])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", positions, vocab])
    return _save(tmp_path, "lm", nodes, [ids], [out], inits)


def _regression(tmp_path) -> str:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")]
    inits = [numpy_helper.from_array(_f32(rng, 4, 1), "w"), numpy_helper.from_array(_f32(rng, 1), "b")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])
    return _save(tmp_path, "regress", nodes, [x], [y], inits)


def _pooled(tmp_path) -> str:
    """Conv -> GlobalAveragePool: [N, CLASSES, 1, 1] class scores."""
    pool = helper.make_node("GlobalAveragePool", ["scores"], ["y"])
    return _conv_head(tmp_path, "pooled", [pool], ["N", CLASSES, 1, 1])[0]


def _classifier(tmp_path) -> str:
    """Conv -> GlobalAveragePool -> Flatten: [N, CLASSES]."""
    tail = [
        helper.make_node("GlobalAveragePool", ["scores"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    return _conv_head(tmp_path, "flat", tail, ["N", CLASSES])[0]


def _check(capsys, path: str) -> str:
    """`edgetrain check MODEL`'s output."""
    code = main(["check", path])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _labels_line(out: str, prefix: str = "labels     ") -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(prefix)]
    return line[len(prefix) :]


# ---- check and convert say how labels must look ---------------------------------------------------------------
def test_check_says_how_labels_look_for_each_kind_of_output(tmp_path, capsys):
    said = {
        "classifier": _labels_line(_check(capsys, _classifier(tmp_path))),
        "pooled": _labels_line(_check(capsys, _pooled(tmp_path))),
        "segmentation": _labels_line(_check(capsys, _segmentation(tmp_path)[0])),
        "language model": _labels_line(_check(capsys, _language_model(tmp_path))),
        "regression": _labels_line(_check(capsys, _regression(tmp_path))),
    }
    assert said["classifier"].startswith("one class index 0..4 per sample, shape [N] ("), said
    assert "[N,5] holds 5 class scores" in said["classifier"]
    assert said["pooled"] == (
        "one class index 0..4 per sample, shape [N] (the output [N,5,1,1] has singleton spatial axes)"
    )
    assert said["segmentation"].startswith("one class index 0..4 per position, shape [N,4,4] ("), said
    assert said["language model"].startswith("one token id 0..10 per position, shape [N,6] ("), said
    assert "class axis -1 of the output [N,6,11]" in said["language model"]
    assert (
        "convert with --class-axis -1" in said["language model"]
        and "--loss next-token" in said["language model"]
    )
    assert said["regression"].startswith(
        "one value per sample, shape [N,1] (float32): convert with --loss mse"
    )


def test_convert_prints_the_labels_line_check_prints_and_declares_that_shape(tmp_path, capsys):
    """The line names the target shape the artifact declares: [N] for [N, C, 1, 1], [N, T] for a language model
    converted with the class axis check asked for."""
    for path, options, target in (
        (_pooled(tmp_path), [], (BATCH,)),
        (_segmentation(tmp_path)[0], [], (BATCH, 4, 4)),
        (_language_model(tmp_path), ["--class-axis", "-1"], (BATCH, 6)),
    ):
        checked = _labels_line(_check(capsys, path))
        art = str(tmp_path / "model.etrain")
        assert main(["convert", path, "-o", art, "--batch-size", str(BATCH), *options]) == 0
        converted = _labels_line(capsys.readouterr().out, "  labels      ")
        assert checked.startswith(converted.split(" (")[0]), (checked, converted)
        sess = et.TrainingSession(art)
        assert sess.artifact.program.values[sess.artifact.io.target].shape == target


def test_a_segmentation_keeps_one_label_per_position(tmp_path):
    torch = pytest.importorskip(
        "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
    )
    path, weights = _segmentation(tmp_path)
    art = et.convert(path, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=LR), batch_size=2)
    sess = et.TrainingSession(art)
    rng = np.random.default_rng(1)
    x, y = _f32(rng, 2, 3, 4, 4), rng.integers(0, CLASSES, (2, 4, 4))
    logits = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(weights["w"]), torch.from_numpy(weights["b"])
    )
    want = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)))
    assert sess.train_step(x, y) == pytest.approx(want, rel=1e-5)
    with pytest.raises(et.FeedError, match=r"the target must have shape \[2, 4, 4\], got \[2\]"):
        sess.train_step(x, y[:, 0, 0])
    check_labels(ArrayDataView(x, y), CLASSES, per_sample=(4, 4))  # the loaders' check, told the label shape
    with pytest.raises(DataError, match=r"one integer per sample, shape \[N\], got shape \(2, 4, 4\)"):
        check_labels(ArrayDataView(x, y), CLASSES)
    with pytest.raises(DataError, match=r"one integer per position, shape \[N, 4, 4\], got shape \(2,\)"):
        check_labels(ArrayDataView(x, y[:, 0, 0]), CLASSES, per_sample=(4, 4))


def test_the_loss_reads_the_logits_under_a_reshaped_softmax(tmp_path):
    """The onnx zoo's SqueezeNet ends in Softmax, then a Reshape to [N, C, 1, 1]: the loss is the cross-entropy of
    the logits under that Softmax, not of its probabilities taken as logits."""
    torch = pytest.importorskip(
        "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
    )
    tail = [
        helper.make_node("GlobalAveragePool", ["scores"], ["p"]),
        helper.make_node("Flatten", ["p"], ["flat"]),
        helper.make_node("Softmax", ["flat"], ["probabilities"], axis=1),
        helper.make_node("Reshape", ["probabilities", "shape"], ["y"]),
    ]
    shape = numpy_helper.from_array(np.array([-1, CLASSES, 1, 1], np.int64), "shape")
    path, weights = _conv_head(tmp_path, "zoo_style", tail, ["N", CLASSES, 1, 1], extra=[shape])
    sess = et.TrainingSession(
        et.convert(path, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=LR), batch_size=2)
    )
    rng = np.random.default_rng(2)
    x, y = _f32(rng, 2, 3, 4, 4) * 4, np.array([1, 3])
    logits = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(weights["w"]), torch.from_numpy(weights["b"])
    )
    want = float(torch.nn.functional.cross_entropy(logits.mean(dim=(2, 3)), torch.from_numpy(y)))
    assert sess.train_step(x, y.reshape(2, 1, 1)) == pytest.approx(want, rel=1e-5)


class _OldCrossEntropy(et.CrossEntropyLoss):
    """CrossEntropyLoss as convert built it for a [N, C, 1, 1] output before it read such scores as [N, C]: the
    target [N, 1, 1], a log-softmax over axis 1."""

    def target_info(self, prediction: TensorInfo) -> TensorInfo:
        return TensorInfo(np.dtype("int64"), (prediction.shape[0], *prediction.shape[2:]))

    def build(self, g, prediction: str, target: str) -> str:
        return cross_entropy_graph(g, g.op("LogSoftmax", prediction, axis=1), target, "mean", 0.0, None)

    def config(self):
        return {**super().config(), "type": "CrossEntropyLoss"}


def test_an_artifact_converted_before_takes_labels_of_either_shape(tmp_path):
    path = _pooled(tmp_path)
    old = et.TrainingSession(
        et.convert(path, loss=_OldCrossEntropy(), optimizer=et.SGD(lr=LR), batch_size=BATCH)
    )
    new = et.TrainingSession(
        et.convert(path, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=LR), batch_size=BATCH)
    )
    assert old.artifact.program.values[old.artifact.io.target].shape == (BATCH, 1, 1)
    assert new.artifact.program.values[new.artifact.io.target].shape == (BATCH,)
    rng = np.random.default_rng(3)
    x, y = _f32(rng, BATCH, 3, 4, 4), rng.integers(0, CLASSES, BATCH)
    for labels in (y, y.reshape(BATCH, 1, 1)):
        assert old.evaluate(x, labels)[0] == pytest.approx(new.evaluate(x, labels)[0], rel=1e-6)
    with pytest.raises(
        et.FeedError, match=r"must have shape \[4\] \(one class index per sample\), got \[4, 2\]"
    ):
        new.train_step(x, np.stack([y, y], axis=1))


# ---- SqueezeNet's head, exported by PyTorch, trained and evaluated from the command line ----------------------------
def _torch():
    return pytest.importorskip(
        "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
    )


def _squeeze_head(flatten: bool):
    """torchvision's SqueezeNet in small: a conv body, then Conv(.., classes, 1) -> ReLU -> AdaptiveAvgPool2d(1),
    with no flatten (its output [N, C, 1, 1]), or with one (a [N, C] classifier)."""
    nn = _torch().nn
    _torch().manual_seed(0)
    layers = [
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, CLASSES, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
    ]
    return nn.Sequential(*layers, *([nn.Flatten()] if flatten else [])).eval()


_EXPORTS: dict = {}


def _export(tmp_path_factory, exporter: str, flatten: bool):
    torch = _torch()
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    import exports  # needs torch, checked above

    key = (exporter, flatten)
    if key not in _EXPORTS:
        module = _squeeze_head(flatten)
        path = tmp_path_factory.mktemp("squeeze") / f"squeeze-{exporter}-{flatten}.onnx"
        x = torch.zeros(2, 3, 8, 8)
        exports.export_module(module, x, path, exporter=exporter, mode="eval", symbolic=True)
        _EXPORTS[key] = (module, str(path), exports.map_parameters(module, onnx.load(str(path))))
    return _EXPORTS[key]


def _pytorch_steps(module, x: np.ndarray, y: np.ndarray):
    """The module after one epoch of SGD-momentum steps of BATCH samples in order, on CrossEntropyLoss of the
    flattened logits."""
    torch = _torch()
    m = copy.deepcopy(module).train()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    labels = torch.from_numpy(y.reshape(len(y)))
    for start in range(0, len(x), BATCH):
        opt.zero_grad()
        out = m(torch.from_numpy(x[start : start + BATCH])).flatten(1)
        torch.nn.functional.cross_entropy(out, labels[start : start + BATCH]).backward()
        opt.step()
    return m.eval()


EXPORTERS = ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("label_shape", ["[N]", "[N,1,1]"])
@pytest.mark.parametrize("head", ["pooled [N,C,1,1]", "flattened [N,C]"])
def test_squeezenet_head_trains_from_the_command_line_as_pytorch(
    tmp_path_factory, exporter, label_shape, head, capsys
):
    torch = _torch()
    module, path, names = _export(tmp_path_factory, exporter, flatten=head.startswith("flat"))
    work = tmp_path_factory.mktemp("cli")
    art, ckpt, data = (str(work / n) for n in ("m.etrain", "m.etck", "data.npz"))
    rng = np.random.default_rng(4)
    x, y = _f32(rng, SAMPLES, 3, 8, 8) * 2, rng.integers(0, CLASSES, SAMPLES)
    np.savez(data, x=x, y=y if label_shape == "[N]" else y.reshape(SAMPLES, 1, 1))
    convert = [
        "convert",
        path,
        "-o",
        art,
        "--batch-size",
        str(BATCH),
        "--lr",
        str(LR),
        "--momentum",
        str(MOMENTUM),
    ]
    assert main(convert) == 0
    said = capsys.readouterr().out
    assert f"labels      one class index 0..{CLASSES - 1} per sample, shape [N] (" in said
    assert main(["train", art, "--data", data, "--epochs", "1", "--no-shuffle", "--checkpoint", ckpt]) == 0
    capsys.readouterr()
    sess = et.TrainingSession(art)
    sess.load_checkpoint(ckpt)
    assert sess.step == SAMPLES // BATCH
    reference = _pytorch_steps(module, x, y)
    trained = dict(reference.named_parameters())
    assert sorted(names.values()) == sorted(sess.parameter_names)
    for torch_name, onnx_name in names.items():
        want = trained[torch_name].detach().numpy()
        np.testing.assert_allclose(
            sess.parameters()[onnx_name], want, rtol=1e-5, atol=1e-5, err_msg=onnx_name
        )
        assert not np.allclose(want, dict(module.named_parameters())[torch_name].detach().numpy())

    # eval: the accuracy and the per-class line are those of the trained PyTorch model
    with torch.no_grad():
        predicted = reference(torch.from_numpy(x)).flatten(1).argmax(1).numpy()
    assert main(["eval", art, "--data", data, "--checkpoint", ckpt]) == 0
    out = capsys.readouterr().out
    right = int(np.sum(predicted == y))
    assert f"({right} of {SAMPLES})" in out, out
    per_class = dict(re.findall(r"(\d+): ([\d.]+)%", out.split("per class", 1)[1]))
    for k in np.unique(y):
        assert float(per_class[str(k)]) == pytest.approx(100 * np.mean(predicted[y == k] == k), abs=0.05)
    # and from Python, labels of either shape
    for labels in (y, y.reshape(SAMPLES, 1, 1)):
        _, accuracy = evaluate(sess, DataLoader(ArrayDataView(x, labels, num_classes=CLASSES), BATCH))
        assert accuracy == pytest.approx(right / SAMPLES)


def test_a_flat_classifier_converts_as_before(tmp_path):
    """A [N, C] output: the fused softmax cross-entropy reads the model's output itself, as it always did."""
    art = et.convert(
        _classifier(tmp_path), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=LR), batch_size=BATCH
    )
    (loss,) = [n for n in art.graph.nodes if n.op_type == "SoftmaxCrossEntropy"]
    assert loss.inputs == (art.outputs[0], art.target)
    assert art.graph.values[art.target].shape == (BATCH,)


# ---- convert's notes: re-batched nodes summarized; check's frozen count is convert's -----------------------------
def _fixed_batch_reshapes(tmp_path, pairs: int = 4) -> str:
    """x [1, 8] -> (Reshape to [1, 2, 4] -> Reshape to [1, 8]) x pairs -> Slice of the first sample -> Gemm: a
    model exported with a fixed batch of 1, whose shape constants name the batch."""
    rng = np.random.default_rng(0)
    nodes, value = [], "x"
    for i in range(2 * pairs):
        out = f"r{i}_out"
        nodes.append(
            helper.make_node("Reshape", [value, "wide" if i % 2 == 0 else "flat"], [out], name=f"r{i}")
        )
        value = out
    nodes.append(helper.make_node("Slice", [value, "starts", "ends"], ["cut"], name="cut"))
    nodes.append(helper.make_node("Gemm", ["cut", "w", "b"], ["y"], name="fc"))
    inits = [
        numpy_helper.from_array(np.array([1, 2, 4], np.int64), "wide"),
        numpy_helper.from_array(np.array([1, 8], np.int64), "flat"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([1], np.int64), "ends"),
        numpy_helper.from_array(_f32(rng, 8, 3), "w"),
        numpy_helper.from_array(_f32(rng, 3), "b"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    return _save(tmp_path, "fixed_batch", nodes, [x], [y], inits)


def test_rebatching_notes_summarize_the_rewritten_nodes_by_op(tmp_path, capsys):
    path = _fixed_batch_reshapes(tmp_path)
    art = et.convert(path, loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=LR), batch_size=BATCH)
    rewrote = [n for n in art.notes if "rewrote" in n]
    assert rewrote == [
        "  rewrote 8 Reshape nodes: 'r0', 'r1', 'r2' and 5 more (`edgetrain convert --debug` lists them all); "
        "e.g. 'r0': [1, 2, 4] -> [4, 2, 4]",
        "  rewrote node 'cut' (Slice): [1] -> [end]",
    ], art.notes
    out = str(tmp_path / "m.etrain")
    assert main(["convert", path, "-o", out, "--batch-size", str(BATCH)]) == 0
    assert capsys.readouterr().out.count("rewrote") == 2
    assert main(["convert", "--debug", path, "-o", out, "--batch-size", str(BATCH)]) == 0
    listed = capsys.readouterr().out.split("  every rewritten node:\n", 1)[1].splitlines()[:10]
    assert listed == [
        f"    node 'r{i}' (Reshape): {'[1, 2, 4] -> [4, 2, 4]' if i % 2 == 0 else '[1, 8] -> [4, 8]'}"
        for i in range(8)
    ] + [
        "    node 'cut' (Slice): [1] -> [end]",
        "  loss        CrossEntropyLoss (reduction mean, label_smoothing 0)",
    ]


def _computed_statistics(tmp_path) -> str:
    """Conv -> BatchNorm whose running mean and variance ConstantOfShape makes (as the onnx zoo's light models
    store them) -> Conv -> BatchNorm with stored statistics -> GlobalAveragePool -> Flatten: [N, 4]."""
    rng = np.random.default_rng(0)
    fill = {"mean": 0.0, "var": 1.0}
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["channels"], [f"bn1_{k}"], value=helper.make_tensor("v", 1, [1], [v])
        )
        for k, v in fill.items()
    ]
    nodes += [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "s1", "b1", "bn1_mean", "bn1_var"], ["n1"], name="bn1"),
        helper.make_node("Conv", ["n1", "w2"], ["c2"], name="conv2"),
        helper.make_node("BatchNormalization", ["c2", "s2", "b2", "bn2_mean", "bn2_var"], ["n2"], name="bn2"),
        helper.make_node("GlobalAveragePool", ["n2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    arrays = {
        "channels": np.array([4], np.int64),
        "w1": _f32(rng, 4, 3, 1, 1),
        "w2": _f32(rng, 4, 4, 1, 1),
        "bn2_mean": _f32(rng, 4),
        "bn2_var": np.abs(_f32(rng, 4)) + 1,
        **{f"{k}{i}": _f32(rng, 4) for k in "sb" for i in (1, 2)},
    }
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    return _save(tmp_path, "statistics", nodes, [x], [y], inits)


def test_check_counts_every_statistic_as_frozen_as_convert_does(tmp_path, capsys):
    path = _computed_statistics(tmp_path)
    out = _check(capsys, path)
    assert (
        "6 trainable by default (44 values), 4 frozen: 4 statistics and shape values never train, 0 float"
        in out
    )
    for name, role in (
        ("bn1_mean", "running mean"),
        ("bn1_var", "running variance"),
        ("bn2_mean", "running mean"),
    ):
        assert re.search(rf"{name} +\[4\] +{role} of BatchNormalization +bn\d", out), out
    assert main(["convert", path, "-o", str(tmp_path / "m.etrain"), "--batch-size", str(BATCH)]) == 0
    assert "6 trainable (44 values), 4 frozen (16 values)" in capsys.readouterr().out
