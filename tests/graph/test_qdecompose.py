"""edgetrain.graph.qdecompose.to_qdq: int8 models in the QOperator and dynamic forms onnxruntime's quantizer writes,
brought into the canonical QDQ form, then run against the original.

- Real models quantized here by onnxruntime.quantization (the helpers of test_quantized_models): the shipped digits
  LeNet and, with torch, the MLP, CNN (grouped conv, LeakyReLU, global average pool) and transformer encoder layer;
  forms qoperator and qoperator_per_channel (reduce_range, as test_quantized_models explains), dynamic (uint8
  weights), dynamic_s8 (int8 weights, reduce_range), dynamic_fused (onnxruntime's optimizer fuses the dynamic
  pattern into com.microsoft DynamicQuantizeMatMul) and qdq, which must come back unchanged. Each rewritten graph
  is checked for the form by walking it with onnx's own type inference, passes onnx.checker, and runs in
  onnxruntime and in edgetrain; both are compared with onnxruntime running the original model, in steps of the
  output's quantization scale where the output is dequantized, relative to its range where it is float.
- One graph per QOperator op (onnx.helper): the rewritten node against the original in onnxruntime, within a step.
- Integer tensors through the ops that commute with quantization: equal to the bit.
- Graphs it cannot rewrite: the UnsupportedError names the node and says what works.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_quantized_models import DATA, HAS_TORCH, _ort, _quantize, _torch_models

import edgetrain as et
from edgetrain.core.errors import UnsupportedError
from edgetrain.graph.qdecompose import to_qdq
from edgetrain.onnx_io.reader import from_onnx, load_model
from edgetrain.onnx_io.writer import to_onnx

pytest.importorskip("onnxruntime.quantization")

MS = "com.microsoft"
INTEGER = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
NAMES = ["lenet", "mlp", "cnn", "encoder"]
FORMS = ["qdq", "qoperator", "qoperator_per_channel", "dynamic", "dynamic_s8", "dynamic_fused"]


# ---- the models ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qdecompose")
    found = {"lenet": (DATA / "digits_lenet.onnx", (3, 1, 28, 28))}
    if HAS_TORCH:
        found.update(_torch_models(folder))
    return folder, found


def _make(src: Path, shape, form: str, folder: Path) -> Path:
    """The model in one form. dynamic_s8 takes reduce_range (7-bit weights), so that onnxruntime's U8S8 products
    do not saturate and it stays an exact reference; dynamic_fused is the dynamic model as onnxruntime's extended
    optimizer rewrites it (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul fused into DynamicQuantizeMatMul)."""
    if form == "dynamic_s8":
        from onnxruntime.quantization import (
            QuantType,
            quantize_dynamic,
        )  # optional: only the dynamic forms need it

        _quantize(src, shape, "dynamic", folder)  # writes the pre-processed model
        out = folder / f"{src.stem}_dynamic_s8_rr.onnx"
        quantize_dynamic(
            str(folder / f"{src.stem}_pre.onnx"), str(out), weight_type=QuantType.QInt8, reduce_range=True
        )
        return out
    if form == "dynamic_fused":
        import onnxruntime as ort  # optional: as in test_quantized_models

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.log_severity_level = 3
        out = folder / f"{src.stem}_dynamic_fused.onnx"
        so.optimized_model_filepath = str(out)
        ort.InferenceSession(
            str(_quantize(src, shape, "dynamic", folder)), so, providers=["CPUExecutionProvider"]
        )
        return out
    return _quantize(src, shape, form, folder)


def _op_name(n) -> str:
    return (n.domain + ":" if n.domain else "") + n.op_type


def _assert_canonical(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """The canonical QDQ form, walked on the written model with onnx's type inference: every integer activation
    comes from QuantizeLinear or DynamicQuantizeLinear and is read only by DequantizeLinear; the integer weights of
    the original are still integer initializers, read only by DequantizeLinear (axis set when per channel)."""
    g = onnx.shape_inference.infer_shapes(model).graph
    elem = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        assert n.domain in ("", "ai.onnx"), f"{n.name} is {_op_name(n)}"
        assert n.op_type not in {"MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul"}, n.name
        for k, i in enumerate(n.input):
            readers.setdefault(i, []).append((n, k))
    for name, t in elem.items():
        if t not in INTEGER or name in inits or name not in producer:
            continue
        assert producer[name].op_type in ("QuantizeLinear", "DynamicQuantizeLinear"), (
            name,
            producer[name].op_type,
        )
        for n, _ in readers.get(name, []):
            assert n.op_type == "DequantizeLinear", (
                f"{n.name} ({n.op_type}) reads the integer tensor '{name}'"
            )
    for t in original.graph.initializer:
        w = numpy_helper.to_array(t)
        if w.dtype not in (np.int8, np.uint8) or w.size <= 16 or t.name not in readers:
            continue
        np.testing.assert_array_equal(inits[t.name], w)
        for n, k in readers[t.name]:
            assert n.op_type == "DequantizeLinear" and k in (0, 2), (
                f"{n.name} ({n.op_type}) reads the weight {t.name}"
            )
            if k == 0 and inits[n.input[1]].size > 1:
                assert any(a.name == "axis" for a in n.attribute), f"{n.name}: per-channel without an axis"


def _steps(got, ref, model: onnx.ModelProto, name: str):
    """(max difference, share of elements exact, unit): in steps of the output's scale when a DequantizeLinear of
    a constant scale produces it, else relative to the output's largest magnitude (a float output)."""
    node = next(n for n in model.graph.node if name in n.output)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    if node.op_type == "DequantizeLinear" and node.input[1] in inits:
        steps = diff / float(inits[node.input[1]])
        return float(steps.max()), float(np.mean(steps < 0.5)), "steps"
    scale = max(1.0, float(np.abs(ref).max()))
    return float(diff.max() / scale), float(np.mean(diff <= 1e-5 * scale)), "of range"


CASES = [(n, f) for n in NAMES for f in FORMS if (n, f) != ("encoder", "dynamic_fused")]


@pytest.mark.parametrize(("name", "form"), CASES)
def test_model_in_qdq_form_matches_original(models, name, form, report):
    folder, found = models
    if name not in found:
        pytest.skip("torch is not installed: the torch-exported models cannot be made")
    src, shape = found[name]
    path = _make(src, shape, form, folder)
    original = onnx.load(str(path))
    graph = from_onnx(load_model(path))
    before = [(n.op_type, n.inputs, n.outputs, dict(n.attrs)) for n in graph.nodes], dict(graph.initializers)
    out, notes = to_qdq(graph)
    assert [(n.op_type, n.inputs, n.outputs, dict(n.attrs)) for n in graph.nodes] == before[0]  # not mutated
    assert graph.initializers.keys() == before[1].keys()
    if form == "qdq":
        assert notes == [] and out is not graph
        assert [(n.op_type, n.inputs, n.outputs, n.attrs, n.name) for n in out.nodes] == [
            (n.op_type, n.inputs, n.outputs, n.attrs, n.name) for n in graph.nodes
        ]
        assert out.initializers.keys() == graph.initializers.keys() and out.values == graph.values
    else:
        assert notes and all(isinstance(s, str) for s in notes)
    model = to_onnx(out)
    onnx.checker.check_model(model, full_check=True)
    _assert_canonical(model, original)

    x = np.random.default_rng(99).standard_normal(shape).astype(np.float32)
    feeds = {original.graph.input[0].name: x}
    ref = _ort(path, feeds)
    rewritten = folder / f"{path.stem}_as_qdq.onnx"
    onnx.save(model, str(rewritten))
    for runner, got in (
        ("onnxruntime", _ort(rewritten, feeds)),
        ("edgetrain", et.InferenceSession(out).run(None, feeds)),
    ):
        for o, g, r in zip(original.graph.output, got, ref):
            assert g.shape == r.shape and g.dtype == r.dtype
            worst, exact, unit = _steps(g, r, model, o.name)
            report(
                "to_qdq: rewritten model vs the original in onnxruntime",
                f"{name:8s} {form:22s} {runner:11s} max {worst:.3g} {unit}, {exact:.1%} "
                + ("exact" if unit == "steps" else "within 1e-5 of range"),
            )
            if unit == "steps":
                assert worst <= 2 and exact >= 0.95, (worst, exact)
            else:
                assert worst <= 1e-3 and exact >= 0.95, (worst, exact)
    ops = {_op_name(n) for n in model.graph.node}
    assert not {op for op in ops if "Integer" in op or op.startswith(("QLinear", MS))}, ops


def test_float_model_comes_back_unchanged():
    graph = from_onnx(DATA / "digits_lenet.onnx")
    out, notes = to_qdq(graph)
    assert notes == [] and [n.op_type for n in out.nodes] == [n.op_type for n in graph.nodes]


def test_notes_say_what_changed(models):
    folder, found = models
    out, notes = to_qdq(from_onnx(_make(*found["lenet"], "qoperator", folder)))
    text = "\n".join(notes)
    assert "2 QLinearConv" in text and "3 QGemm" in text and "1 QLinearSoftmax" in text, text
    assert "2 MaxPool" in text and "1 Flatten" in text and "5 int32 biases" in text, text
    # the float ops keep their nodes' names; the bias scales are new initializers named after the bias
    assert {"Conv_0_quant", "Gemm_7_quant"} <= {n.name for n in out.nodes if n.op_type in ("Conv", "Gemm")}
    assert "conv1.bias_quantized_scale" in out.initializers
    assert out.initializers["conv1.bias_quantized_scale"].dtype == np.float32
    out, notes = to_qdq(from_onnx(_make(*found["lenet"], "dynamic", folder)))
    assert "2 ConvInteger" in notes[0] and "3 MatMulInteger" in notes[0] and "removed 5 Cast" in notes[0], (
        notes
    )
    assert not {"Cast", "MatMulInteger", "ConvInteger"} & {n.op_type for n in out.nodes}


# ---- one QOperator node at a time ---------------------------------------------------------------------------

RNG = np.random.default_rng(5)


def _u8(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _i8(*shape):
    """7-bit weights, as reduce_range makes them: onnxruntime's uint8 x int8 products on x86 without VNNI
    saturate pairs of full-range products to int16 (see test_quantized_models), which is not what the spec says."""
    return RNG.integers(-64, 64, shape).astype(np.int8)


def _f(v):
    return np.asarray(v, np.float32)


U, I = np.uint8, np.int8


def _node_model(op, inputs, attrs=None, *, domain="", feeds=(0,)):
    """A one-node model: inputs at the positions in `feeds` are graph inputs (activations), the others
    initializers; None stands for an omitted input."""
    names, vis, inits = [], [], []
    for k, v in enumerate(inputs):
        if v is None:
            names.append("")
            continue
        name = f"in{k}"
        names.append(name)
        v = np.asarray(v)
        if k in feeds:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
        else:
            inits.append(numpy_helper.from_array(v, name))
    node = helper.make_node(op, names, ["out"], name=f"the_{op}", domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "q", vis, [helper.make_empty_tensor_value_info("out")], inits)
    imports = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 9
    feed = {f"in{k}": np.asarray(inputs[k]) for k in feeds}
    return model, feed


def _conv(per_channel: bool, group: int = 1):
    c = 4 if group > 1 else 3
    w = _i8(4, c // group, 3, 3)
    ws = _f(RNG.uniform(0.005, 0.02, 4)) if per_channel else _f(0.01)
    wz = np.zeros(4, I) if per_channel else I(0)
    b = RNG.integers(-2000, 2000, 4).astype(np.int32)
    ins = [_u8(2, c, 6, 6), _f(0.02), U(128), w, ws, wz, _f(0.08), U(128), b]
    return ins, {"pads": [1, 1, 1, 1], "group": group, "strides": [1, 2] if per_channel else [1, 1]}


def _gemm(per_channel: bool, alpha: float = 1.0, float_out: bool = False):
    bs = _f(RNG.uniform(0.005, 0.02, 6)) if per_channel else _f(0.01)
    bz = np.zeros(6, I) if per_channel else I(0)
    tail = [None, None] if float_out else [_f(0.08 * alpha), U(128)]
    ins = [
        _u8(5, 8),
        _f(0.02),
        U(128),
        _i8(6, 8),
        bs,
        bz,
        RNG.integers(-2000, 2000, 6).astype(np.int32),
        *tail,
    ]
    return ins, {"transB": 1, "alpha": alpha}


def _binary(scale):
    return [_u8(4, 6, 8), _f(0.02), U(120), _u8(6, 8), _f(0.03), U(130), _f(scale), U(128)]


UNARY = [_u8(2, 3, 10), _f(0.05), U(128), _f(1 / 256), U(0)]
OPS = {
    "QLinearConv": (*_conv(False), "", (0,)),
    "QLinearConv per channel": (*_conv(True), "", (0,)),
    "QLinearConv grouped": (*_conv(True, group=2), "", (0,)),
    "QLinearMatMul": (
        [_u8(2, 5, 8), _f(0.02), U(128), _i8(8, 6), _f(0.01), I(0), _f(0.03), U(128)],
        {},
        "",
        (0,),
    ),
    "QLinearMatMul per channel": (
        [
            _u8(2, 5, 8),
            _f(0.02),
            U(128),
            _i8(8, 6),
            _f(RNG.uniform(0.005, 0.02, 6)),
            np.zeros(6, I),
            _f(0.03),
            U(128),
        ],
        {},
        "",
        (0,),
    ),
    "QLinearMatMul of activations": (
        [_u8(2, 5, 8), _f(0.02), U(128), _u8(2, 8, 6), _f(0.02), U(120), _f(0.06), U(128)],
        {},
        "",
        (0, 3),
    ),
    "QGemm": (*_gemm(False), MS, (0,)),
    "QGemm per channel": (*_gemm(True), MS, (0,)),
    "QGemm alpha": (*_gemm(False, alpha=0.5), MS, (0,)),
    "QGemm float output": (*_gemm(True, float_out=True), MS, (0,)),
    "QLinearAdd": (_binary(0.04), {}, MS, (0, 3)),
    "QLinearMul": (_binary(0.02), {}, MS, (0, 3)),
    "QLinearSigmoid": (UNARY, {}, MS, (0,)),
    "QLinearLeakyRelu": ([_u8(2, 3, 10), _f(0.05), U(128), _f(0.04), U(160)], {"alpha": 0.1}, MS, (0,)),
    "QLinearGlobalAveragePool": ([_u8(2, 8, 5, 5), _f(0.05), U(128), _f(0.01), U(128)], {}, MS, (0,)),
    "QLinearGlobalAveragePool channels_last": (
        [_u8(2, 5, 5, 8), _f(0.05), U(128), _f(0.01), U(128)],
        {"channels_last": 1},
        MS,
        (0,),
    ),
    "QLinearSoftmax": (UNARY, {"axis": -1, "opset": 13}, MS, (0,)),
    "QLinearSoftmax axis 1": (
        [_u8(2, 12, 5), _f(0.05), U(128), _f(1 / 256), U(0)],
        {"axis": 1, "opset": 13},
        MS,
        (0,),
    ),
    "QLinearConcat": (
        [_f(0.03), U(128), _u8(2, 3, 4), _f(0.02), U(120), _u8(2, 2, 4), _f(0.05), U(128)],
        {"axis": 1},
        MS,
        (2, 5),
    ),
}


@pytest.mark.parametrize("case", list(OPS))
def test_qoperator_node_matches_onnxruntime(case, report):
    inputs, attrs, domain, feeds = OPS[case]
    op = case.split()[0]
    model, ref = _typed(*_node_model(op, inputs, attrs, domain=domain, feeds=feeds))
    feed = {f"in{k}": np.asarray(inputs[k]) for k in feeds}
    ref = ref[0]
    out, notes = to_qdq(from_onnx(model))
    assert f"1 {op}" in notes[0]
    rewritten = to_onnx(out)
    onnx.checker.check_model(rewritten, full_check=True)
    _assert_canonical(rewritten, model)
    float_op = {n.op_type for n in out.nodes} - {"DequantizeLinear", "QuantizeLinear", "Transpose"}
    assert len(float_op) == 1 and next(iter(float_op)) in op, float_op
    assert next(n for n in out.nodes if n.op_type in float_op).name == f"the_{op}"
    for runner, got in (
        ("onnxruntime", _run(rewritten, feed)[0]),
        ("edgetrain", et.InferenceSession(out).run(None, feed)[0]),
    ):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        if ref.dtype == np.float32:  # QGemm without y_scale
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
            continue
        assert len(np.unique(ref)) > 5, "the case saturates: pick another output scale"
        d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
        report(
            "to_qdq: one QOperator node vs onnxruntime",
            f"{case:40s} {runner:11s} max {d.max()} steps, {np.mean(d == 0):.1%} exact",
        )
        assert d.max() <= 1 and np.mean(d == 0) >= 0.8, (d.max(), np.mean(d == 0))


def _run(model, feeds):
    import onnxruntime as ort  # optional: as in test_quantized_models

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _typed(model: onnx.ModelProto, feeds) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """The model with its outputs' types and shapes declared (as onnx.checker wants them), from a first run in
    onnxruntime, and that run's results (the reference)."""
    ref = _run(model, feeds)
    names = [o.name for o in model.graph.output]
    del model.graph.output[:]
    for name, r in zip(names, ref):
        model.graph.output.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(r.dtype), r.shape)
        )
    onnx.checker.check_model(model, full_check=True)
    return model, ref


# ---- integer tensors through ops that commute with quantization ---------------------------------------------

S4 = [1, 4, 4, 4]
COMMUTING = [
    ("MaxPool", {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [2, 2]}, [], S4, 1),
    ("ReduceMax", {"keepdims": 1}, [np.array([2, 3])], S4, 1),
    ("ReduceMin", {"keepdims": 0}, [np.array([1])], S4, 1),
    ("Flatten", {"axis": 2}, [], S4, 1),
    ("Reshape", {}, [np.array([4, -1])], S4, 1),
    ("Transpose", {"perm": [0, 2, 3, 1]}, [], S4, 1),
    ("Squeeze", {}, [np.array([0])], S4, 1),
    ("Unsqueeze", {}, [np.array([0])], S4, 1),
    ("Identity", {}, [], S4, 1),
    ("Slice", {}, [np.array([1]), np.array([3]), np.array([2])], S4, 1),
    ("Split", {"axis": 1}, [np.array([1, 3])], S4, 2),
    ("Gather", {"axis": 2}, [np.array([0, 3, 3])], S4, 1),
    ("GatherElements", {"axis": 3}, [np.array(RNG.integers(0, 4, S4))], S4, 1),
    ("GatherND", {}, [np.array([[0, 1]])], S4, 1),
    ("Expand", {}, [np.array([3, 4, 4, 4])], S4, 1),
    ("Tile", {}, [np.array([1, 2, 1, 1])], S4, 1),
    ("DepthToSpace", {"blocksize": 2}, [], S4, 1),
    ("SpaceToDepth", {"blocksize": 2}, [], S4, 1),
    ("Resize", {"mode": "nearest"}, [None, _f([1, 1, 2, 2])], S4, 1),
    ("Pad", {}, [np.array([0, 0, 1, 2, 0, 0, 1, 0])], S4, 1),  # pads with the integer 0: not the zero point
    ("Pad", {}, [np.array([0, 0, 1, 1, 0, 0, 1, 1]), U(7)], S4, 1),
    ("Pad", {"mode": "reflect"}, [np.array([0, 0, 1, 1, 0, 0, 1, 1])], S4, 1),
    ("Concat", {"axis": 1}, ["q"], S4, 1),
]


def _commuting_model(op, attrs, extra, shape, nout, *, mode_attrs=None):
    """x -> QuantizeLinear (scale 0.05, zero point 100) -> op on uint8 -> DequantizeLinear of each output."""
    inits = [numpy_helper.from_array(_f(0.05), "s"), numpy_helper.from_array(U(100), "z")]
    names = ["q"]
    for k, v in enumerate(extra):
        if v is None or isinstance(v, str):
            names.append(v or "")
            continue
        inits.append(numpy_helper.from_array(np.asarray(v), f"c{k}"))
        names.append(f"c{k}")
    outs = [f"o{k}" for k in range(nout)]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
        helper.make_node(op, names, outs, name=f"the_{op}", **attrs),
        *[helper.make_node("DequantizeLinear", [o, "s", "z"], [f"y{k}"]) for k, o in enumerate(outs)],
    ]
    vi = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)]
    graph = helper.make_graph(
        nodes, "c", vi, [helper.make_empty_tensor_value_info(f"y{k}") for k in range(nout)], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("case", COMMUTING, ids=[f"{c[0]}-{k}" for k, c in enumerate(COMMUTING)])
def test_commuting_op_is_exact(case):
    op, attrs, extra, shape, nout = case
    feeds = {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 3}
    model, ref = _typed(_commuting_model(op, attrs, extra, shape, nout), feeds)
    out, notes = to_qdq(from_onnx(model))
    assert f"1 {op}" in notes[0], notes
    rewritten = to_onnx(out)
    onnx.checker.check_model(rewritten, full_check=True)
    _assert_canonical(rewritten, model)
    for got in (_run(rewritten, feeds), et.InferenceSession(out).run(None, feeds)):
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r)  # the same integers: the op commutes with the quantization


# ---- what it refuses ----------------------------------------------------------------------------------------


def _refused(model, *words):
    with pytest.raises(UnsupportedError) as e:
        to_qdq(from_onnx(model))
    for w in (*words, "QuantFormat.QDQ"):
        assert w in str(e.value), str(e.value)


def test_refuses_integer_op_that_does_not_commute():
    _refused(
        _commuting_model("Resize", {"mode": "linear"}, [None, _f([1, 1, 2, 2])], S4, 1),
        "the_Resize",
        "nearest",
    )
    _refused(_commuting_model("Cast", {"to": onnx.TensorProto.FLOAT}, [], S4, 1), "the_Cast", "Cast", "'q'")


def test_refuses_integer_product_used_otherwise():
    """MatMulInteger whose int32 output is a graph output: not quantize_dynamic's pattern."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["out"], name="the_matmul"),
    ]
    inits = [numpy_helper.from_array(_u8(8, 3), "w"), numpy_helper.from_array(U(128), "wz")]
    graph = helper.make_graph(
        nodes,
        "d",
        [helper.make_tensor_value_info("x", 1, [2, 8])],
        [helper.make_empty_tensor_value_info("out")],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    _refused(model, "the_matmul", "MatMulInteger", "Cast")


def test_refuses_real_dynamic_model_with_an_integer_output(models):
    """The dynamic LeNet with its first MatMulInteger's int32 output made a graph output too."""
    folder, found = models
    model = onnx.load(str(_make(*found["lenet"], "dynamic", folder)))
    node = next(n for n in model.graph.node if n.op_type == "MatMulInteger")
    model.graph.output.append(helper.make_empty_tensor_value_info(node.output[0]))
    _refused(model, f"'{node.name}'", "MatMulInteger")


def test_refuses_bias_without_constant_scales():
    """QLinearConv's int32 bias needs x_scale * w_scale as a constant; a fed x_scale has none."""
    inputs, attrs = _conv(False)
    model, _ = _node_model("QLinearConv", inputs, attrs, feeds=(0, 1))
    _refused(model, "the_QLinearConv", "bias", "in1")


def test_matmul_integer_to_float_matches_onnxruntime():
    """com.microsoft MatMulIntegerToFloat (what onnxruntime fuses when the quantized A has other readers)."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node(
            "MatMulIntegerToFloat", ["xq", "w", "xs", "ws", "xz", "wz", "b"], ["out"], name="fused", domain=MS
        ),
    ]
    inits = [
        numpy_helper.from_array(_i8(8, 6), "w"),
        numpy_helper.from_array(_f(RNG.uniform(0.005, 0.02, 6)), "ws"),
        numpy_helper.from_array(np.zeros(6, I), "wz"),
        numpy_helper.from_array(_f(RNG.standard_normal(6)), "b"),
    ]
    vi = [helper.make_tensor_value_info("x", 1, [4, 8])]
    graph = helper.make_graph(nodes, "f", vi, [helper.make_empty_tensor_value_info("out")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)}
    model, (ref,) = _typed(model, feeds)
    out, notes = to_qdq(from_onnx(model))
    assert "1 MatMulIntegerToFloat" in notes[0]
    rewritten = to_onnx(out)
    onnx.checker.check_model(rewritten, full_check=True)
    _assert_canonical(rewritten, model)
    for got in (_run(rewritten, feeds)[0], et.InferenceSession(out).run(None, feeds)[0]):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
