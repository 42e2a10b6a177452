"""Every failure a user can cause is an EdgeTrainError subclass whose message names the fault and the fix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgetrain as et


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _relu_model(shape=(2, 3), opset=18):
    return _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        opset=opset,
    )


def test_file_that_is_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is a text file, not a model\n" * 20)
    with pytest.raises(et.ModelError, match=r"notes\.onnx.*is not an ONNX model"):
        et.InferenceSession(str(p))


def test_empty_and_missing_files(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(et.ModelError, match="empty.onnx"):
        et.InferenceSession(p)
    with pytest.raises(et.ModelError, match="does not exist"):
        et.InferenceSession(tmp_path / "nope.onnx")
    with pytest.raises(et.ModelError, match="directory"):
        et.InferenceSession(tmp_path)


def test_unsupported_op_names_op_node_and_lists_supported():
    m = _model(
        [
            helper.make_node("Relu", ["x"], ["h"], name="first"),
            helper.make_node("Det", ["h"], ["y"], name="determinant"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    with pytest.raises(et.UnsupportedError) as e:
        et.InferenceSession(m)
    msg = str(e.value)
    assert "'determinant'" in msg and "Det" in msg and "Supported ops:" in msg and "Conv" in msg


def test_foreign_domain():
    m = _model(
        [helper.make_node("FusedConv", ["x"], ["y"], domain="com.microsoft", name="fc")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(et.UnsupportedError, match="com.microsoft"):
        et.InferenceSession(m)


def test_opset_too_old_and_too_new():
    # Relu means the same at opset 6 and 7: read as 7. Add changed at 7 (broadcasting): refused, named.
    assert (
        et.InferenceSession(_relu_model(opset=6)).run(None, {"x": -np.ones((2, 3), np.float32)})[0].max() == 0
    )
    add = _model(
        [helper.make_node("Add", ["x", "x"], ["y"], name="plus")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        opset=6,
    )
    with pytest.raises(
        et.UnsupportedError,
        match=r"opset 6.*'plus' \(Add\).*supports opsets 7 to \d+.*"
        r"version_converter",
    ):
        et.InferenceSession(add)
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(et.UnsupportedError, match=f"opset {newest + 1}.*upgrade the onnx package"):
        et.InferenceSession(_relu_model(opset=newest + 1))


def test_unsupported_attribute_name_and_value():
    m = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="r", flavour=3)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(et.UnsupportedError, match="'r'.*attribute 'flavour' is not supported by Relu"):
        et.InferenceSession(m)
    m = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="c", auto_pad="SOMETIMES")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 3, 3], [0.1] * 9)],
    )
    with pytest.raises(et.UnsupportedError, match=r"'c'.*auto_pad.*SOMETIMES.*SAME_UPPER"):
        et.InferenceSession(m)


def test_feeds_wrong_name_shape_dtype():
    sess = et.InferenceSession(_relu_model())
    x = np.ones((2, 3), np.float32)
    with pytest.raises(
        et.FeedError, match=r"'input' is not an input of the model; its inputs are: 'x' float32\[2x3\]"
    ):
        sess.run(None, {"input": x})
    with pytest.raises(et.FeedError, match=r"input 'x' is missing"):
        sess.run(None, {})
    with pytest.raises(et.FeedError, match=r"input 'x' must have shape \[2, 3\], got \[3, 2\]"):
        sess.run(None, {"x": x.T.copy()})
    with pytest.raises(et.FeedError, match=r"input 'x' must be float32, got float64.*astype\(np.float32\)"):
        sess.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(et.FeedError, match=r"'z' is not an output of the model; its outputs are: 'y'"):
        sess.run(["z"], {"x": x})


def test_symbolic_batch_needs_batch_size_or_feeds():
    m = _relu_model(shape=("N", 3))
    sess = et.InferenceSession(m)  # follows the feeds
    assert sess.run(None, {"x": -np.ones((5, 3), np.float32)})[0].shape == (5, 3)
    assert sess.run(None, {"x": np.ones((7, 3), np.float32)})[0].shape == (7, 3)
    fixed = et.InferenceSession(m, batch_size=4)
    assert fixed.get_inputs()[0].shape == [4, 3]
    with pytest.raises(et.FeedError, match=r"must have shape \[4, 3\]"):
        fixed.run(None, {"x": np.ones((5, 3), np.float32)})
    with pytest.raises(et.ShapeError, match=r"input 'x'.*dimension 0 is 'N'; pass batch_size=N"):
        et.import_model(m)
    m2 = _relu_model(shape=(2, "width"))
    with pytest.raises(et.ShapeError, match=r"dimension 1 is 'width'.*static"):
        et.import_model(m2, batch_size=2)


def test_data_dependent_shape_is_a_clear_error():
    m = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_data")],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(et.ShapeError, match=r"'reshape_by_data'.*input 's' decides the output shape"):
        et.import_model(m)


def test_kernel_failure_names_node_and_shapes():
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 2], [0.0] * 8)],
    )
    with pytest.raises(et.EdgeTrainError, match=r"'mm' \(MatMul\).*2, 3.*4, 2"):
        et.InferenceSession(m)


def test_control_flow_is_unsupported_clearly():
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
    )
    m = _model(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=then)],
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(et.UnsupportedError, match=r"'branch'.*subgraph.*If, Loop"):
        et.InferenceSession(m)
