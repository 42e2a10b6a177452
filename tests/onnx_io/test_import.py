"""ONNX import: older opsets are rewritten into the newest op forms with the same results as onnxruntime gives
on the original model; constants fold; shapes become static; the IR builder is deterministic."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgetrain as et
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo

F = TensorProto.FLOAT


def _model(node, in_shapes, opset, n_out=1, inits=()):
    ins = [helper.make_tensor_value_info(f"x{k}", F, s) for k, s in enumerate(in_shapes)]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output[:n_out]]
    m = helper.make_model(
        helper.make_graph([node], "m", ins, outs, list(inits)), opset_imports=[helper.make_opsetid("", opset)]
    )
    m.ir_version = 7
    return m


def _compare(model, shapes, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {f"x{k}": rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = et.InferenceSession(model).run(None, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


OLD_FORMS = [
    (
        "Slice-1",
        9,
        helper.make_node("Slice", ["x0"], ["y"], starts=[1, 0], ends=[3, -1], axes=[0, 2]),
        [(4, 3, 5)],
    ),
    ("Slice-1 no axes", 9, helper.make_node("Slice", ["x0"], ["y"], starts=[1], ends=[1000]), [(4, 3)]),
    ("Squeeze-1", 11, helper.make_node("Squeeze", ["x0"], ["y"], axes=[1, -1]), [(2, 1, 3, 1)]),
    ("Squeeze-1 all", 9, helper.make_node("Squeeze", ["x0"], ["y"]), [(1, 3, 1)]),
    ("Unsqueeze-1", 11, helper.make_node("Unsqueeze", ["x0"], ["y"], axes=[0, -1]), [(2, 3)]),
    ("Softmax-1 axis=1 on 4-D", 9, helper.make_node("Softmax", ["x0"], ["y"]), [(2, 3, 4, 5)]),
    ("LogSoftmax-11 axis=-2", 11, helper.make_node("LogSoftmax", ["x0"], ["y"], axis=-2), [(2, 3, 4)]),
    ("Softmax-11 2-D", 11, helper.make_node("Softmax", ["x0"], ["y"]), [(4, 10)]),
    ("Hardmax-11", 11, helper.make_node("Hardmax", ["x0"], ["y"], axis=1), [(2, 3, 4)]),
    ("Pad-2", 9, helper.make_node("Pad", ["x0"], ["y"], pads=[0, 1, 2, 0, 2, 1], value=1.5), [(2, 3, 4)]),
    (
        "Pad-2 reflect",
        9,
        helper.make_node("Pad", ["x0"], ["y"], mode="reflect", pads=[0, 0, 1, 2, 0, 0, 2, 1]),
        [(1, 2, 4, 5)],
    ),
    ("Clip-6", 9, helper.make_node("Clip", ["x0"], ["y"], min=-0.5, max=0.3), [(3, 4)]),
    ("Clip-6 max only", 9, helper.make_node("Clip", ["x0"], ["y"], max=0.1), [(3, 4)]),
    ("ReduceMean-1", 11, helper.make_node("ReduceMean", ["x0"], ["y"], axes=[1, 2], keepdims=0), [(2, 3, 4)]),
    ("ReduceSum-11", 11, helper.make_node("ReduceSum", ["x0"], ["y"], axes=[-1]), [(2, 3, 4)]),
    ("ReduceMax-13 all", 13, helper.make_node("ReduceMax", ["x0"], ["y"], keepdims=1), [(2, 3)]),
    ("Dropout-7", 9, helper.make_node("Dropout", ["x0"], ["y"], ratio=0.3), [(2, 3)]),
    (
        "BatchNormalization-7",
        7,
        helper.make_node("BatchNormalization", ["x0", "s", "b", "m", "v"], ["y"], epsilon=1e-3),
        [(2, 3, 4, 4)],
    ),
]


@pytest.mark.parametrize("name,opset,node,shapes", OLD_FORMS, ids=[o[0] for o in OLD_FORMS])
def test_old_op_forms_match_onnxruntime(name, opset, node, shapes):
    inits = []
    if node.op_type == "BatchNormalization":
        rng = np.random.default_rng(1)
        for nm, lo in (("s", -1), ("b", -1), ("m", -1), ("v", 0.2)):
            inits.append(helper.make_tensor(nm, F, [3], rng.uniform(lo, 1, 3).astype(np.float32).tolist()))
    _compare(_model(node, shapes, opset, inits=inits), shapes)


def test_split_and_topk_old_forms():
    _compare(
        _model(helper.make_node("Split", ["x0"], ["a", "b"], axis=1, split=[1, 3]), [(2, 4)], 11, 2), [(2, 4)]
    )
    _compare(_model(helper.make_node("Split", ["x0"], ["a", "b", "c"], axis=0), [(6, 2)], 13, 3), [(6, 2)])
    _compare(_model(helper.make_node("TopK", ["x0"], ["v", "i"], k=2, axis=1), [(3, 5)], 9, 2), [(3, 5)])


def test_constant_subgraphs_fold_into_initializers():
    # weight = ConstantOfShape(shape) * 2, reshape target computed from Shape(x): all of it folds away
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w0"], value=helper.make_tensor("v", F, [1], [0.5])),
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Mul", ["w0", "two"], ["w"]),
        helper.make_node("MatMul", ["x0", "w"], ["h"]),
        helper.make_node("Shape", ["x0"], ["s"]),
        helper.make_node("Reshape", ["h", "s"], ["y"]),
    ]
    inits = [helper.make_tensor("wshape", TensorProto.INT64, [2], [4, 4])]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x0", F, ["N", 4])],
        [helper.make_empty_tensor_value_info("y")],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = et.import_model(m, batch_size=3)
    assert [n.op_type for n in graph.nodes] == ["MatMul"]  # the Reshape to its own shape is gone too
    (w,) = [v for k, v in graph.initializers.items()]
    np.testing.assert_array_equal(w, np.ones((4, 4), np.float32))
    assert graph.values["y"].shape == (3, 4) and graph.outputs == ["y"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(et.InferenceSession(graph).run(None, {"x0": x})[0], x @ np.ones((4, 4)))


def test_every_value_gets_a_static_shape():
    node = helper.make_node("Conv", ["x0", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    w = helper.make_tensor("w", F, [4, 3, 3, 3], [0.1] * 108)
    graph = et.import_model(_model(node, [("B", 3, 9, 9)], 11, inits=[w]), batch_size=2)
    graph.verify(static=True)
    assert graph.values["y"] == TensorInfo(np.dtype("float32"), (2, 4, 5, 5))


def test_builder_names_are_fresh_and_deterministic():
    def build():
        g = Graph(
            nodes=[],
            inputs=["x"],
            outputs=[],
            initializers={},
            opset=18,
            values={"x": TensorInfo(np.dtype("float32"), (2,))},
        )
        b = GraphBuilder(g)
        b.reserve(["Relu_out"])
        a = b.add1("Relu", "x")
        c = b.add1("Relu", a)
        k = b.initializer("x", np.ones(2, np.float32))
        return b.finish(outputs=[c]), (a, c, k)

    (g1, names1), (g2, names2) = build(), build()
    assert names1 == names2 == ("Relu_out_1", "Relu_out_2", "x_1")
    assert [n.name for n in g1.nodes] == [n.name for n in g2.nodes] == ["Relu", "Relu_1"]
    g1.verify()


def test_toposort_and_verify():
    n1 = Node("Relu", ("a",), ("b",), name="n1")
    n2 = Node("Neg", ("b",), ("c",), name="n2")
    g = Graph(
        nodes=[n2, n1],
        inputs=["a"],
        outputs=["c"],
        initializers={},
        opset=18,
        values={"a": TensorInfo(np.dtype("float32"), (1,))},
    )
    with pytest.raises(et.ModelError, match="'n2'.*reads 'b'.*not defined before"):
        g.verify()
    assert [n.name for n in g.toposorted().nodes] == ["n1", "n2"]
    cyc = g.copy(nodes=[Node("Relu", ("c",), ("b",), name="x1"), Node("Neg", ("b",), ("c",), name="x2")])
    with pytest.raises(et.ModelError, match="cycle"):
        cyc.toposorted()


def test_round_trip_to_onnx_keeps_results_and_shapes():
    """import -> static Graph -> to_onnx passes onnx.checker (full check, with our value shapes declared) and
    onnxruntime, which validates every declared shape against its own inference, gives the original results."""
    import os

    import onnx

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_squeezenet.onnx"
    )
    graph = et.import_model(path)
    from edgetrain.onnx_io.writer import to_onnx

    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"data_0": x})
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"data_0": x}
    )
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-8)
