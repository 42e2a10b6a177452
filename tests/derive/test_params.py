"""Parameters by role, decided on the imported graph before any folding: which initializers train by default, which
are constants that train only when named, what `trainable=` selects (by name or by the node that reads a tensor),
and that folding never goes through a parameter (checked by the gradient that reaches it, against numpy)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.derive.check import check
from edgetrain.derive.params import find_roles
from edgetrain.onnx_io.reader import from_onnx

RNG = np.random.default_rng(0)


def model(nodes, inputs, output, inits, *, out_shape, opset=17) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "m",
        inputs,
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def f32(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def sgd(lr=0.1):
    return et.SGD(lr=lr)


def image_input(batch="N"):
    return [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])]


def normalized_cnn() -> onnx.ModelProto:
    """(x - pixel_mean) * pixel_inv_std -> Conv -> GlobalAveragePool -> Flatten -> Gemm: preprocessing as
    initializers, as a torch module with registered buffers exports it."""
    nodes = [
        helper.make_node("Sub", ["x", "pixel_mean"], ["centered"], name="/normalize/Sub"),
        helper.make_node("Mul", ["centered", "pixel_inv_std"], ["scaled"], name="/normalize/Mul"),
        helper.make_node(
            "Conv", ["scaled", "conv.weight", "conv.bias"], ["c"], name="/conv/Conv", pads=[1] * 4
        ),
        helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = {
        "pixel_mean": np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1),
        "pixel_inv_std": (1 / np.array([0.229, 0.224, 0.225], np.float32)).reshape(1, 3, 1, 1),
        "conv.weight": f32(4, 3, 3, 3),
        "conv.bias": f32(4),
        "fc.weight": f32(5, 4),
        "fc.bias": f32(5),
    }
    return model(nodes, image_input(), "y", inits, out_shape=["N", 5])


def test_input_normalization_constants_do_not_train_unless_named(tmp_path):
    m = normalized_cnn()
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=4)
    assert art.parameters == ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    x, y = RNG.random((4, 3, 6, 6)).astype(np.float32), np.array([0, 1, 2, 3])
    for _ in range(3):
        sess.train_step(x, y)
    sess.export_onnx(tmp_path / "p.onnx")
    exported = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "p.onnx").graph.initializer}
    mean = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "pixel_mean"))
    np.testing.assert_array_equal(
        exported["pixel_mean"], mean
    )  # preprocessing is what the model shipped with

    named = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=4, trainable=["pixel_mean"])
    assert named.parameters == ["pixel_mean"]
    report = check(m)
    consts = {p.name: p for p in report.parameters if p.kind == "constant"}
    assert consts["pixel_mean"].nodes == ["/normalize/Sub"]
    assert consts["pixel_inv_std"].nodes == ["/normalize/Mul"]
    text = report.text()
    assert "constants (train only when named" in text and "pixel_inv_std" in text


def linear3d(with_bias_add=True) -> onnx.ModelProto:
    """torch's Linear on a [N, T, D] input as exporters write it: MatMul by a (pre-transposed) weight, then Add of
    the bias; then a final MatMul + Add head and a mean over T."""
    nodes = [
        helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["h"], name="/encoder/dense/MatMul"),
        helper.make_node("Add", ["encoder.dense.bias", "h"], ["hb"], name="/encoder/dense/Add"),
        helper.make_node("Relu", ["hb"], ["r"], name="/encoder/act/Relu"),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], name="/pool/ReduceMean", keepdims=0),
        helper.make_node("Gemm", ["m", "head.weight", "head.bias"], ["g"], name="/head/Gemm", transB=1),
        helper.make_node("Add", ["g", "prior"], ["y"], name="/head/prior/Add"),
    ]
    inits = {
        "onnx::MatMul_7": f32(8, 16),
        "encoder.dense.bias": f32(16),
        "axes": np.array([1], np.int64),
        "head.weight": f32(3, 16),
        "head.bias": f32(3),
        "prior": f32(3),
    }
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 8])]
    return model(nodes, x, "y", inits, out_shape=["N", 3], opset=18)


def test_bias_after_a_linear_map_is_a_parameter_and_an_add_after_a_biased_one_a_learned_constant():
    roles = find_roles(from_onnx(linear3d()))
    assert roles.parameters == ["onnx::MatMul_7", "encoder.dense.bias", "head.weight", "head.bias", "prior"]
    assert roles.entries["encoder.dense.bias"].role == "bias of MatMul"
    # the Gemm has its own bias: this Add is not one, but a tensor added to an activation, which its author trains
    assert roles.entries["prior"].role == "learned constant (Add with an activation)"
    assert roles.entries["axes"].kind == "fixed"


def decomposed_layernorm() -> onnx.ModelProto:
    """LayerNorm as exporters below opset 17 write it, then its affine Mul/Add, then a head."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], name="/ln/ReduceMean", axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="/ln/Sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="/ln/ReduceMean_1", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Div", ["d", "sd"], ["n"], name="/ln/Div"),
        helper.make_node("Mul", ["n", "ln.weight"], ["s"], name="/ln/Mul"),
        helper.make_node("Add", ["s", "ln.bias"], ["a"], name="/ln/Add_1"),
        helper.make_node("Gemm", ["a", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = {
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "ln.weight": 1 + f32(6, scale=0.1),
        "ln.bias": f32(6, scale=0.1),
        "fc.weight": f32(4, 6),
        "fc.bias": f32(4),
    }
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])]
    return model(nodes, x, "y", inits, out_shape=["N", 4], opset=13)


def test_a_layernorm_written_out_trains_its_scale_and_bias():
    art = et.convert(decomposed_layernorm(), loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=3)
    assert art.parameters == ["ln.weight", "ln.bias", "fc.weight", "fc.bias"]
    roles = art.roles.entries
    assert roles["ln.weight"].role == "scale after a normalization" and roles["ln.bias"].role == "bias of Mul"
    assert roles["eps"].kind == roles["two"].kind == "constant"


# the sinusoidal position encoding of "Attention is all you need", T=4 positions of D=8: sin, cos, sin, cos, ...
_ANGLES = np.arange(4)[:, None] / 10000 ** (np.arange(0, 8, 2) / 8)
SINUSOID = np.stack([np.sin(_ANGLES), np.cos(_ANGLES)], axis=-1).reshape(4, 8).astype(np.float32)


def embedding_model() -> onnx.ModelProto:
    """Token and position embeddings, as BERT exports them: the position table is gathered at constant positions
    (a buffer), which constant folding would turn into a [T, D] constant that no longer trains the table; a
    sinusoidal encoding added as a constant stays a constant."""
    nodes = [
        helper.make_node("Gather", ["tok.weight", "ids"], ["te"], name="/emb/tok/Gather"),
        helper.make_node("Gather", ["pos.weight", "position_ids"], ["pe"], name="/emb/pos/Gather"),
        helper.make_node("Add", ["te", "pe"], ["e"], name="/emb/Add"),
        helper.make_node("Add", ["e", "sinusoid"], ["es"], name="/emb/Add_1"),
        helper.make_node("ReduceMean", ["es", "axes"], ["m"], name="/pool/ReduceMean", keepdims=0),
        helper.make_node("Gemm", ["m", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = {
        "tok.weight": f32(20, 8),
        "pos.weight": f32(10, 8),
        "position_ids": np.arange(4, dtype=np.int64),
        "sinusoid": SINUSOID,
        "axes": np.array([1], np.int64),
        "fc.weight": f32(3, 8),
        "fc.bias": f32(3),
    }
    ids = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])]
    return model(nodes, ids, "y", inits, out_shape=["N", 3], opset=18)


def test_tables_gathered_at_constant_positions_train_and_export_cleanly(tmp_path):
    m = embedding_model()
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(lr=1.0), batch_size=2)
    assert art.parameters == ["tok.weight", "pos.weight", "fc.weight", "fc.bias"]
    assert art.roles.entries["sinusoid"].kind == "constant"
    assert art.roles.entries["sinusoid"].role.startswith("a table of sines and cosines")
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    ids, y = np.array([[1, 2, 3, 4], [5, 6, 7, 1]]), np.array([0, 2])
    before = sess.parameters()
    sess.train_step(ids, y)
    after = sess.parameters()
    # the position table's gradient, in closed form: every row t gets the mean over the batch of the gradient of
    # the pooled embedding (1/T of the logits' gradient through fc), which is the same for every position
    w, b = before["fc.weight"].astype(np.float64), before["fc.bias"].astype(np.float64)
    emb = before["tok.weight"][ids] + before["pos.weight"][:4] + SINUSOID
    logits = emb.mean(1) @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(2), y] -= 1
    d_pooled = (p / 2) @ w  # mean over the batch of 2
    want = before["pos.weight"].astype(np.float64)
    want[:4] -= 1.0 * d_pooled.sum(0) / 4
    np.testing.assert_allclose(after["pos.weight"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after["pos.weight"][4:], before["pos.weight"][4:])  # rows never gathered
    sess.export_onnx(tmp_path / "p.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "p.onnx"), full_check=True)
    got = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, sess.run(ids), rtol=1e-5, atol=1e-6)


def test_a_weight_read_through_identity_and_transpose_is_the_initializer_under_them(tmp_path):
    """The TorchScript exporter ties identical initializers through Identity, and some exporters transpose a
    weight in the graph: the parameter is the initializer itself, and export keeps the graph's form."""
    nodes = [
        helper.make_node("Identity", ["shared"], ["layer2.weight"], name="/tie/Identity"),
        helper.make_node("Transpose", ["shared"], ["wt"], name="/layer1/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["h"], name="/layer1/MatMul"),
        helper.make_node("Tanh", ["h"], ["t"], name="/act/Tanh"),
        helper.make_node("MatMul", ["t", "layer2.weight"], ["y"], name="/layer2/MatMul"),
    ]
    inits = {"shared": f32(4, 4)}
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]
    m = model(nodes, x, "y", inits, out_shape=["N", 4])
    art = et.convert(m, loss=et.MSELoss(), optimizer=sgd(), batch_size=2)
    assert art.parameters == ["shared"]
    assert art.roles.entries["shared"].aliases == ["layer2.weight"]
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    x, t = f32(2, 4), f32(2, 4)
    sess.train_step(x, t)
    sess.export_onnx(tmp_path / "p.onnx")
    exported = onnx.load(tmp_path / "p.onnx")
    assert [i.name for i in exported.graph.initializer] == ["shared"]
    assert "Transpose" in [n.op_type for n in exported.graph.node]
    got = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"x": x})[0]
    w = sess.parameters()["shared"]
    np.testing.assert_allclose(got, np.tanh(x @ w.T) @ w, rtol=1e-5, atol=1e-6)


def test_weights_filled_by_constant_of_shape_are_parameters():
    """onnx's light model zoo stores weights as ConstantOfShape fills: computed from constants alone, they become
    initializers when folded, and parameters under their own name."""
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["wshape"],
            ["fc_w"],
            name="fill",
            value=numpy_helper.from_array(np.array([0.1], np.float32)),
        ),
        helper.make_node("Gemm", ["x", "fc_w"], ["y"], name="/fc/Gemm", transB=1),
    ]
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]
    m = model(nodes, x, "y", {"wshape": np.array([3, 4], np.int64)}, out_shape=["N", 3])
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2)
    assert art.parameters == ["fc_w"]
    np.testing.assert_array_equal(art.initial["fc_w"], np.full((3, 4), 0.1, np.float32))


def layered() -> onnx.ModelProto:
    """Conv layers whose initializers carry generated names, as a TorchScript export with BatchNorm folded into
    the convolutions names them; the node names carry the layers."""
    nodes, inits, x = [], {}, "x"
    for k, name in enumerate(["/layer1/layer1.0/conv1/Conv", "/layer2/layer2.0/conv1/Conv", "/fc/Gemm"]):
        w, b = f"onnx::Conv_{190 + 2 * k}", f"onnx::Conv_{191 + 2 * k}"
        if name == "/fc/Gemm":
            nodes.append(helper.make_node("GlobalAveragePool", [x], ["p"], name="/pool/GlobalAveragePool"))
            nodes.append(helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"))
            nodes.append(helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name=name, transB=1))
            inits.update({"fc.weight": f32(5, 3), "fc.bias": f32(5)})
            break
        nodes.append(helper.make_node("Conv", [x, w, b], [f"c{k}"], name=name, pads=[1] * 4))
        inits.update({w: f32(3, 3, 3, 3), b: f32(3)})
        x = f"c{k}"
    return model(nodes, image_input(), "y", inits, out_shape=["N", 5])


def test_select_by_layer_through_node_names():
    m = layered()
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2, trainable=["/layer2/*"])
    assert art.parameters == ["onnx::Conv_192", "onnx::Conv_193"]
    both = et.convert(
        m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2, trainable=["/layer2/*", "fc.*"]
    )
    assert both.parameters == ["onnx::Conv_192", "onnx::Conv_193", "fc.weight", "fc.bias"]
    with pytest.raises(et.UnsupportedError) as e:
        et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2, trainable=["layer2.*"])
    msg = str(e.value)
    assert "matches no parameter name and no node name" in msg
    assert "'/layer2/layer2.0/conv1/Conv'" in msg and "e.g. '/layer2/*'" in msg and "edgetrain check" in msg
    text = check(m).text()
    assert "onnx::Conv_192" in text and "/layer2/layer2.0/conv1/Conv" in text  # both names, side by side


def test_statistics_and_shape_values_cannot_be_named():
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["n"], name="/bn/BN"),
        helper.make_node("Reshape", ["n", "shape"], ["f"], name="/flat/Reshape"),
        helper.make_node("Gemm", ["f", "fc.weight"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = {
        "s": 1 + f32(3, scale=0.1),
        "b": f32(3),
        "mean": f32(3),
        "var": np.ones(3, np.float32),
        "shape": np.array([0, -1], np.int64),
        "fc.weight": f32(2, 3),
    }
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])]
    m = model(nodes, x, "y", inits, out_shape=["N", 2])
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2)
    assert art.parameters == ["s", "b", "fc.weight"]
    for name, what in (
        ("var", "running variance of BatchNormalization"),
        ("shape", "shape input of Reshape"),
    ):
        with pytest.raises(et.UnsupportedError, match=f"'{name}' cannot be trained: it is the {what}"):
            et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2, trainable=[name])


def test_a_statistic_and_a_parameter_merged_by_the_exporter_are_separated_again():
    """A fresh BatchNorm weight and a running variance are both all ones; the TorchScript exporter merges them into
    one initializer read through Identity nodes. Kept merged, the weight would be frozen as a statistic."""
    ones = np.ones(3, np.float32)
    nodes = [
        helper.make_node("Identity", ["merged"], ["bn.weight"], name="/Identity"),
        helper.make_node("Identity", ["merged"], ["bn.running_var"], name="/Identity_1"),
        helper.make_node(
            "BatchNormalization",
            ["x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["n"],
            name="/bn",
        ),
        helper.make_node("Gemm", ["n", "fc.weight"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = {"merged": ones, "bn.bias": f32(3), "bn.running_mean": f32(3), "fc.weight": f32(2, 3)}
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])]
    m = model(nodes, x, "y", inits, out_shape=["N", 2])
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2)
    assert art.parameters == ["bn.weight", "bn.bias", "fc.weight"]
    assert any("merged tensors with identical values into 'merged'" in n for n in art.notes)
    assert art.roles.entries["bn.running_var"].kind == "fixed"
    assert any("separate tensors" in n for n in check(m).notes)


def test_layers_are_selected_by_the_module_path_an_exporter_records():
    """torch's dynamo exporter names nodes node_Conv_340 and keeps the module path in metadata."""
    m = layered()
    for n in m.graph.node:
        layer = n.name.split("/")[1]
        entry = n.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", str(["", layer, f"{layer}.0", "conv2d"])
        n.name = f"node_{n.op_type}_{len(n.name)}"
    art = et.convert(m, loss=et.CrossEntropyLoss(), optimizer=sgd(), batch_size=2, trainable=["/layer2/*"])
    assert art.parameters == ["onnx::Conv_192", "onnx::Conv_193"]
    assert "/layer2/layer2.0/conv2d" in check(m).text()
