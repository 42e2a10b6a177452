"""Every failure a user can cause is an EdgeTrainError subclass whose message names the fault and the fix."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

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


SEE_OPS = "see the supported ops with `edgetrain check --ops` or `edgetrain.runtime.supported_ops()`"


def _short(msg: str) -> bool:
    """No dump of the op list: fewer than 15 supported op names, under 400 characters."""
    words = set(re.findall(r"[A-Za-z]+", msg))
    return len(words & set(et.runtime.supported_ops())) < 15 and len(msg) < 400


def test_unsupported_op_names_op_node_and_where_the_list_is():
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
    assert msg == f"node 'determinant' (Det): op 'Det' has no kernel in edgetrain; {SEE_OPS}."
    assert len(msg) < 300


def _with_op(op: str, domain: str = "", **attrs) -> onnx.ModelProto:
    """x -> MatMul(w) -> op -> y: a trainable model whose second node edgetrain cannot run."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    m = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node(op, ["h"], ["y"], name="blocker", domain=domain, **attrs),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, 1))
    return m


_BODY = helper.make_graph(
    [helper.make_node("Identity", ["s"], ["t"])],
    "body",
    [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])],
)

# (op, domain, attributes, what the message must suggest)
UNSUPPORTED = [
    ("relu", "", {}, "did you mean 'Relu'?"),  # a misspelled custom op: the close spelling
    ("Relu6", "", {}, "its standard form is Clip with min 0 and max 6"),
    (
        "Scan",
        "",
        {"body": _BODY, "num_scan_inputs": 1},
        "unrolled, or write the recurrence as LSTM, GRU or RNN",
    ),
    ("Loop", "", {"body": _BODY}, "unrolled, or write the recurrence as LSTM, GRU or RNN"),
    (
        "FastGelu",
        "com.microsoft",
        {},
        "its standard form is Gelu with approximate='tanh' (opset 20) or Tanh, Mul, Pow and Add: convert the "
        "plain torch.onnx.export output, before onnxruntime's optimizer fused it",
    ),
    ("SkipLayerNormalization", "com.microsoft", {}, "Add and LayerNormalization"),
    ("MaxUnpool", "", {}, ""),  # a real op: MaxPool is another op, so nothing is suggested
]


@pytest.mark.parametrize("op, domain, attrs, advice", UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
def test_unsupported_op_suggests_the_nearest_alternative(op, domain, attrs, advice):
    m = _with_op(op, domain, **attrs)
    for load in (
        lambda: et.InferenceSession(m),
        lambda: et.convert(m, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1)),
    ):
        with pytest.raises(et.UnsupportedError) as e:
            load()
        msg = str(e.value)
        assert msg.startswith(f"node 'blocker' ({op})"), msg
        why = f"is in domain '{domain}'" if domain else "subgraph" if "body" in attrs else "has no kernel"
        assert why in msg, msg
        if advice:
            assert advice in msg and SEE_OPS[1:] in msg, msg
        else:
            assert msg.endswith(f"; {SEE_OPS}.") and "MaxPool" not in msg and len(msg) < 300, msg
        assert _short(msg) and "Supported ops:" not in msg, msg


def test_the_alternatives_name_only_ops_edgetrain_has():
    """Every ONNX op an advice names runs in edgetrain (a gradient advice: has a rule), and no real ONNX op edgetrain
    lacks is answered with a look-alike name (MaxUnpool is not MaxPool, Acosh is not Cos)."""
    from edgetrain.core import alternatives as alt
    from edgetrain.core.ops import QUANTIZED_OPS
    from edgetrain.derive.autodiff import rules  # noqa: F401
    from edgetrain.derive.autodiff.registry import RULES

    onnx_ops = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    supported = set(et.runtime.supported_ops())
    for table in (alt.ADVICE, alt.STANDARD_FORM, alt.CONTRIB_FORM):
        for op, text in table.items():
            named = set(re.findall(r"[A-Za-z]+", text)) & onnx_ops
            assert named <= supported, (op, named - supported)
    for op, text in alt.RULE_ADVICE.items():
        if op in QUANTIZED_OPS:  # they run; convert lowers them to FakeQuantize before taking gradients
            assert op not in RULES and "fake quantization" in text, (op, text)
            continue
        assert op in supported and op not in RULES, op
        named = set(re.findall(r"[A-Za-z]+", text)) & onnx_ops
        assert named and named <= set(RULES), (op, named - set(RULES))
    for op in sorted(onnx_ops - supported):
        assert not alt.alternative(op).startswith("did you mean"), (op, alt.alternative(op))
    assert alt.alternative("Softmx") == "did you mean 'Softmax'?"
    assert alt.alternative("Conv2d") == ""  # not close enough to say


def test_missing_gradient_rule_suggests_ops_with_rules_not_the_list():
    rng = np.random.default_rng(0)
    m = _model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Mod", ["h", "three"], ["f"], name="modulo", fmod=1),
            helper.make_node("MatMul", ["f", "w2"], ["y"], name="mm2"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.full((1,), 3.0, np.float32), "three"),
        ],
        opset=17,
    )
    with pytest.raises(et.UnsupportedError) as e:
        et.convert(m, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1))
    msg = str(e.value)
    assert msg == (
        "node 'modulo' (Mod) has no gradient rule, and 1 trainable parameter(s) lie before it (e.g. 'w1'). "
        "To avoid it, freeze the parameters before it: train only the parameters after it, e.g. "
        "trainable=['w2']. Or, to train them too, write x mod y as x - y * Floor(x / y), with "
        "Sign(q) * Floor(Abs(q)) for Floor(q) when fmod=1. `edgetrain check --ops` lists the ops with gradient "
        "rules."
    )
    assert "Ops with gradient rules:" not in msg and _short(msg)


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


LENET = str(
    __import__("pathlib").Path(__file__).resolve().parents[2] / "edgetrain" / "data" / "digits_lenet.onnx"
)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The demo's LeNet through onnxruntime's quantizer, in its three forms."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Batches(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{"image": rng.random((1, 1, 28, 28), dtype=np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    d = tmp_path_factory.mktemp("quantized")
    quantize_dynamic(LENET, str(d / "dynamic.onnx"), weight_type=QuantType.QInt8)
    quantize_static(LENET, str(d / "qdq.onnx"), Batches(), quant_format=QuantFormat.QDQ)
    quantize_static(LENET, str(d / "qoperator.onnx"), Batches(), quant_format=QuantFormat.QOperator)
    return d


def test_an_int8_model_with_blocked_quantization_is_refused_by_its_node(quantized, tmp_path):
    """An int8 model trains (tests/derive/test_qat.py), but a weight quantized in blocks (block_size) has no fake
    quantization here: convert names the node and says what would work."""
    model = onnx.load(str(quantized / "qdq.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and "weight" in n.input[0])
    node.attribute.append(onnx.helper.make_attribute("block_size", 2))
    path = tmp_path / "blocked.onnx"
    onnx.save(model, str(path))
    with pytest.raises(et.EdgeTrainError) as e:
        et.convert(str(path), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert node.name in str(e.value) and ("block" in str(e.value)), str(e.value)
