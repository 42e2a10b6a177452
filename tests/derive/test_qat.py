"""Quantization-aware training of int8 models (edgetrain.graph.quantized), against independent references:
onnxruntime runs QuantizeLinear -> DequantizeLinear for the FakeQuantize kernel, PyTorch's fake_quantize autograd
gives the straight-through gradient, onnxruntime runs the standard-op training step (the FakeQuantize bodies) and
every export. The models are the shipped digits LeNet quantized in the test by onnxruntime.quantization (QDQ, per
tensor and per channel), calibrated on images in the model's input range. The parity of whole training runs with
PyTorch QAT is tests/derive/test_qat_torch.py's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.core.kernels.quantized import fake_quantize, fake_quantize_grad

DATA = Path(et.__file__).parent / "data"
HAS_TORCH = importlib.util.find_spec("torch") is not None
FORMS = ["qdq", "qdq_per_channel"]


def _ort(path, feeds, optimized=False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


class _Images:
    """onnxruntime's CalibrationDataReader protocol: seeded images in [0, 1] (the model's input after its /255)."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self._it = iter([{"image": rng.random((4, 1, 28, 28), dtype=np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self._it, None)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    """{form: the digits LeNet quantized by onnxruntime in that form}."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folder = tmp_path_factory.mktemp("qat")
    pre = folder / "lenet_pre.onnx"
    quant_pre_process(str(DATA / "digits_lenet.onnx"), str(pre))
    out = {"qoperator": folder / "lenet_qoperator.onnx", "dynamic": folder / "lenet_dynamic.onnx"}
    # uint8 activations with 7-bit weights, uint8 dynamic weights: onnxruntime on x86 without VNNI saturates pairs
    # of uint8 x int8 products otherwise (tests/derive/test_quantized_models.py), and it is the reference here
    quantize_static(
        str(pre),
        str(out["qoperator"]),
        _Images(),
        quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        reduce_range=True,
    )
    quantize_dynamic(str(pre), str(out["dynamic"]), weight_type=QuantType.QUInt8)
    for form in FORMS:
        out[form] = folder / f"lenet_{form}.onnx"
        quantize_static(
            str(pre),
            str(out[form]),
            _Images(),
            quant_format=QuantFormat.QDQ,
            per_channel=form.endswith("per_channel"),
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
    return out


def _batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 1, 28, 28)).astype(np.uint8), rng.integers(0, 10, n)


def _convert(path, **kw):
    kw.setdefault("batch_size", 8)
    return et.convert(str(path), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.02, momentum=0.9), **kw)


# ------------------------------------------------------------------------------------------------ the op itself


def _pair_model(x, scale, zp, axis):
    """QuantizeLinear -> DequantizeLinear in ONNX, with scale and zero point as initializers."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis),
    ]
    g = helper.make_graph(
        nodes,
        "pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


CASES = [  # (zero point dtype, per channel axis or None)
    (np.int8, None),
    (np.uint8, None),
    (np.int8, 0),
    (np.int8, 1),
    (np.uint8, 1),
]


def _case(dtype, axis, rng):
    x = (rng.standard_normal((3, 4, 5)) * 3).astype(np.float32)
    if axis is None:
        scale, zp = np.float32(0.0625), np.asarray(3 if dtype == np.int8 else 128, dtype)
    else:
        n = x.shape[axis]
        scale = (rng.random(n) * 0.1 + 0.01).astype(np.float32)
        zp = (
            rng.integers(-5, 5, n).astype(dtype)
            if dtype == np.int8
            else rng.integers(120, 136, n).astype(dtype)
        )
    s = np.asarray(scale, np.float32)
    flat = x.reshape(-1)  # rounding ties (k + 0.5) * scale, exact in float32 for a power-of-two scale
    if axis is None:
        flat[:6] = (np.arange(-3, 3) + 0.5) * s
        flat[6:10] = [1e4, -1e4, 127.5 * s, -128.5 * s]  # saturation, and ties at the ends of the range
    return x, s, np.asarray(zp)


@pytest.mark.parametrize("dtype,axis", CASES)
def test_fake_quantize_equals_onnxruntime_quantize_then_dequantize(tmp_path, dtype, axis):
    rng = np.random.default_rng(1)
    x, s, zp = _case(dtype, axis, rng)
    path = tmp_path / "pair.onnx"
    onnx.save(_pair_model(x, s, zp, 1 if axis is None else axis), str(path))
    (ref,) = _ort(path, {"x": x})
    got = fake_quantize(x, s, zp, axis=1 if axis is None else axis)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed: PyTorch's fake_quantize is the reference")
@pytest.mark.parametrize("dtype,axis", CASES)
def test_straight_through_gradient_equals_torch_fake_quantize(dtype, axis):
    import torch

    rng = np.random.default_rng(2)
    x, s, zp = _case(dtype, axis, rng)
    info = np.iinfo(dtype)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t = torch.tensor(x, requires_grad=True)
    if axis is None:
        y = torch.fake_quantize_per_tensor_affine(t, float(s), int(zp), int(info.min), int(info.max))
    else:
        y = torch.fake_quantize_per_channel_affine(
            t, torch.tensor(s), torch.tensor(zp.astype(np.int32)), axis, int(info.min), int(info.max)
        )
    y.backward(torch.tensor(dy))
    ax = 1 if axis is None else axis
    np.testing.assert_array_equal(fake_quantize(x, s, zp, axis=ax), y.detach().numpy())
    got = fake_quantize_grad(dy, x, s, zp, axis=ax)
    np.testing.assert_array_equal(got, t.grad.numpy())
    assert 0 < np.count_nonzero(got) < got.size or axis is not None  # some saturate, some pass


# ------------------------------------------------------------------------------------------------ whole models


@pytest.mark.parametrize("form", FORMS)
def test_an_int8_model_trains_its_float_masters_and_exports_in_its_own_form(lenet, form, tmp_path):
    src = lenet[form]
    art = _convert(src)
    assert sorted(art.parameters) == sorted(
        f"{layer}.{kind}" for layer in ("conv1", "conv2", "fc1", "fc2", "fc3") for kind in ("weight", "bias")
    )
    model = onnx.load(str(src))
    ints = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    sess = et.TrainingSession(art)
    x, y = _batch()
    start = {k: v.copy() for k, v in sess.parameters().items()}
    # the masters start at the int8 weights' values
    w = ints["conv1.weight_quantized"].astype(np.float32) - ints["conv1.weight_zero_point"].reshape(
        -1, 1, 1, 1
    )
    np.testing.assert_array_equal(start["conv1.weight"], w * ints["conv1.weight_scale"].reshape(-1, 1, 1, 1))
    losses = [sess.train_step(x, y) for _ in range(4)]
    assert losses[-1] < losses[0]
    out = tmp_path / "personal.onnx"
    sess.export_onnx(out)
    exported = onnx.load(str(out))
    onnx.checker.check_model(exported)
    ops = lambda m: sorted(n.op_type for n in m.graph.node if not n.name.startswith("preprocessing"))  # noqa: E731
    assert ops(exported) == ops(model)  # the same form, node for node
    new = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    assert new["conv1.weight_quantized"].dtype == np.int8
    assert not np.array_equal(new["fc3.weight_quantized"], ints["fc3.weight_quantized"])  # it trained
    assert new["fc3.weight_scale"].tobytes() == ints["fc3.weight_scale"].tobytes()  # with the model's scales
    # the exported int8 model in onnxruntime is sess.run, to the bit, as written (its ops as the spec defines
    # them); onnxruntime's own fusions (QLinearConv on x86 without VNNI saturates pairs of int8 products) move its
    # outputs by as much as they move the model as quantized
    (ref,) = _ort(out, {"image": x})
    np.testing.assert_array_equal(ref, sess.run(x))
    (fused,) = _ort(out, {"image": x}, optimized=True)
    (orig, orig_fused) = (
        _ort(src, {"image": x.astype(np.float32) / 255}, optimized=o)[0] for o in (False, True)
    )
    assert np.max(np.abs(fused - ref)) <= 2 * np.max(np.abs(orig_fused - orig)) + 4 / 255


@pytest.mark.parametrize("form", FORMS)
def test_head_only_keeps_every_frozen_weight_int8_bit_for_bit(lenet, form, tmp_path):
    src = lenet[form]
    art = _convert(src, trainable="fc3*")
    assert sorted(art.parameters) == ["fc3.bias", "fc3.weight"]
    frozen = [n for n, v in art.base.initializers.items() if v.dtype == np.int8 and v.ndim >= 2]
    assert sorted(frozen) == sorted(f"{n}.weight_quantized" for n in ("conv1", "conv2", "fc1", "fc2"))
    sess = et.TrainingSession(art)
    x, y = _batch(1)
    for _ in range(3):
        sess.train_step(x, y)
    out = tmp_path / "head.onnx"
    sess.export_onnx(out)
    before = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    for name in frozen:
        assert after[name].dtype == before[name].dtype and after[name].tobytes() == before[name].tobytes(), (
            name
        )
    assert not np.array_equal(after["fc3.weight_quantized"], before["fc3.weight_quantized"])
    (ref,) = _ort(out, {"image": x})
    np.testing.assert_array_equal(ref, sess.run(x))


def test_head_only_int8_artifact_is_a_fraction_of_the_float_ones(lenet, tmp_path):
    """The frozen weights stay int8 in the file: the head-only artifact of the int8 model against the float
    model's (the issue expects about 4x smaller for the frozen part)."""
    int8 = _convert(lenet["qdq"], trainable="fc3*").save(tmp_path / "int8.etrain")
    flt = _convert(DATA / "digits_lenet.onnx", trainable="fc3*").save(tmp_path / "float.etrain")
    assert int8 < 0.4 * flt, (int8, flt)


def _step_both_ways(art, x, y, folder):
    """({output: value} of one step run by edgetrain's interpreter, the same by onnxruntime on training_onnx())."""
    from edgetrain.core.interpreter import Interpreter

    path = folder / "step.onnx"
    onnx.save(art.training_onnx(), str(path))
    feeds = art.feeds({"image": x.astype(np.float32) / np.float32(255)}, y)
    names = [n for n in art.graph.inputs if n in feeds and n not in art.parameters + art.state]
    ref = dict(zip(art.graph.outputs, _ort(path, {n: feeds[n] for n in names})))
    return dict(zip(art.graph.outputs, Interpreter(art.graph).run(feeds))), ref


def test_the_training_step_as_onnx_runs_in_onnxruntime_as_edgetrain_runs_it(lenet, tmp_path):
    """training_onnx() writes FakeQuantize and its gradient as ONNX functions in standard ops: onnxruntime's step
    equals edgetrain's (loss and every updated parameter)."""
    art = _convert(lenet["qdq_per_channel"])
    got, ref = _step_both_ways(art, *_batch(2), tmp_path)
    np.testing.assert_allclose(got[art.loss], ref[art.loss], rtol=1e-6)
    for p, out in art.updates.items():
        np.testing.assert_allclose(got[out], ref[out], rtol=1e-5, atol=1e-7, err_msg=p)


def test_requantize_fits_new_scales_and_float_gives_the_float_model(lenet, tmp_path):
    src = lenet["qdq_per_channel"]
    sess = et.TrainingSession(_convert(src, trainable="fc*"))
    x, y = _batch(3)
    (float_ref,) = _ort(DATA / "digits_lenet.onnx", {"image": x.astype(np.float32) / np.float32(255)})
    sess.export_onnx(tmp_path / "float0.onnx", float_model=True)
    (float0,) = _ort(tmp_path / "float0.onnx", {"image": x})
    assert np.max(np.abs(float0 - float_ref)) < 0.05  # the float model, its weights on the int8 grid
    assert all(
        i.data_type == TensorProto.FLOAT for i in onnx.load(str(tmp_path / "float0.onnx")).graph.initializer
    )
    for _ in range(3):
        sess.train_step(x, y)
    sess.export_onnx(tmp_path / "re.onnx", requantize=True)
    before = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "re.onnx")).graph.initializer}
    assert not np.array_equal(after["fc1.weight_scale"], before["fc1.weight_scale"])  # fitted again
    assert (
        after["conv1.weight_scale"].tobytes() == before["conv1.weight_scale"].tobytes()
    )  # frozen: as it was
    w = sess.parameters()["fc1.weight"]
    np.testing.assert_allclose(after["fc1.weight_scale"], np.abs(w).max(axis=1) / 127, rtol=1e-6)
    np.testing.assert_allclose(  # the bias scale follows: input scale x the new weight scale
        after["fc1.bias_quantized_scale"], after["fc1.weight_scale"] * before["relu2_scale"], rtol=1e-6
    )
    (re,) = _ort(tmp_path / "re.onnx", {"image": x})
    assert (re.argmax(1) == sess.run(x).argmax(1)).mean() >= 0.75


def test_a_saved_int8_artifact_and_its_checkpoint_export_the_same_model(lenet, tmp_path):
    art = _convert(lenet["qdq"], trainable="fc*")
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(str(tmp_path / "m.etrain"))
    x, y = _batch(4)
    for _ in range(2):
        sess.train_step(x, y)
    sess.save_checkpoint(tmp_path / "m.etck")
    sess.export_onnx(tmp_path / "a.onnx")
    again = et.TrainingSession(str(tmp_path / "m.etrain"))
    again.load_checkpoint(tmp_path / "m.etck")
    again.export_onnx(tmp_path / "b.onnx")
    a, b = (onnx.load(str(tmp_path / f"{k}.onnx")).graph.initializer for k in "ab")
    assert {i.name: i.raw_data for i in a} == {i.name: i.raw_data for i in b}


@pytest.mark.parametrize("form", ["qoperator", "dynamic"])
def test_qoperator_and_dynamic_models_train_as_qdq_and_export_in_their_own_form(lenet, form, tmp_path):
    """QLinearConv/QGemm/QLinearSoftmax and MatMulInteger/ConvInteger train through their QDQ rewriting
    (edgetrain.graph.qdecompose); the export is the model as it came, node for node, its weights requantized, and
    onnxruntime runs it as sess.run does; head-only keeps the frozen integer weights bit for bit."""
    src = lenet[form]
    model = onnx.load(str(src))
    before = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for trainable in (None, "fc3*"):
        art = _convert(src, trainable=trainable)
        if (
            trainable is None
        ):  # the float model's tensors, names and shapes (a Gemm weight stored transposed too)
            floats = {
                i.name: tuple(i.dims) for i in onnx.load(str(DATA / "digits_lenet.onnx")).graph.initializer
            }
            assert {p: art.initial[p].shape for p in art.parameters} == floats
        assert len(art.parameters) == (10 if trainable is None else 2)
        assert any("QDQ" in n or "qdq" in n or "DequantizeLinear" in n for n in art.notes), art.notes
        sess = et.TrainingSession(art)
        x, y = _batch(6)
        losses = [sess.train_step(x, y) for _ in range(4)]
        assert losses[-1] < losses[0]
        out = tmp_path / f"{form}-{trainable}.onnx"
        sess.export_onnx(out)
        exported = onnx.load(str(out))
        onnx.checker.check_model(exported)
        ops = lambda m: sorted(n.op_type for n in m.graph.node if not n.name.startswith("preprocessing"))  # noqa: E731
        assert ops(exported) == ops(model)
        (ref,) = _ort(out, {"image": x})
        np.testing.assert_allclose(ref, sess.run(x), rtol=0, atol=1e-6)  # dynamic: float products' order
        after = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
        changed = [
            k
            for k, v in before.items()
            if v.dtype.kind in "iu" and v.ndim >= 1 and v.tobytes() != after[k].tobytes()
        ]
        assert changed and (trainable is None or all(k.startswith("fc3") for k in changed)), changed


def test_the_frozen_int8_prefix_is_cached_bit_for_bit(lenet, tmp_path):
    """Head-only on an int8 model: the frozen int8 prefix (its fake quantizations keep samples apart) is cut and
    cached as a float model's is; training with the cache equals training without, bit for bit."""
    path = tmp_path / "head.etrain"
    _convert(lenet["qdq_per_channel"], trainable="fc3*").save(path)
    x, y = _batch(5, n=32)

    def train(cache):
        sess = et.TrainingSession(str(path))
        if cache:
            sess.enable_feature_cache()
        losses = []
        for epoch in range(3):
            order = np.random.default_rng(epoch).permutation(len(x))
            for i in range(0, len(x), 8):
                losses.append(sess.train_step(x[order[i : i + 8]], y[order[i : i + 8]]))
        return losses, sess.parameters(), sess.feature_cache_info()

    (la, pa, info), (lb, pb, _) = train(True), train(False)
    assert info["enabled"] and info["hits"] == 64, info
    assert la == lb and all(np.array_equal(pa[k], pb[k]) for k in pb)


def test_reduce_range_weights_keep_to_their_7_bits(tmp_path):
    """A model quantized with onnxruntime's reduce_range (int8 weights in -64..64, so that its x86 kernels cannot
    saturate) keeps its weights in that range while training and in the export, however far training pushes them;
    the step as ONNX (the narrowed FakeQuantize's standard-op body) runs in onnxruntime as edgetrain runs it."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src = tmp_path / "reduced.onnx"
    quantize_static(
        str(DATA / "digits_lenet.onnx"),
        str(src),
        _Images(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        reduce_range=True,
    )
    art = et.convert(
        str(src), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=2.0, momentum=0.9), batch_size=8
    )
    assert any("reduce_range" in n for n in art.notes), art.notes
    x, y = _batch(7)
    got, ref = _step_both_ways(art, x, y, tmp_path)
    for p, out in art.updates.items():
        np.testing.assert_allclose(got[out], ref[out], rtol=1e-5, atol=1e-6, err_msg=p)
    sess = et.TrainingSession(art)
    for _ in range(5):
        sess.train_step(x, y)
    sess.export_onnx(tmp_path / "out.onnx")
    for i in onnx.load(str(tmp_path / "out.onnx")).graph.initializer:
        if i.name.endswith("weight_quantized"):
            q = numpy_helper.to_array(i)
            assert q.min() >= -64 and q.max() <= 64, (i.name, q.min(), q.max())
    (ref_out,) = _ort(tmp_path / "out.onnx", {"image": x})
    np.testing.assert_array_equal(ref_out, sess.run(x))


def test_head_only_int8_plans_no_more_memory_than_the_float_model(lenet, tmp_path):
    """The quantizer writes every weight's DequantizeLinear first; the frozen weights are dequantized just before
    their op instead, so the head-only int8 step's planned arena is the float step's and at most one dequantized
    weight (the float model maps its weights outside the arena), not all float weights at once."""
    from edgetrain.core.container import inspect_container

    arenas = []
    for model in (DATA / "digits_lenet.onnx", lenet["qdq_per_channel"]):
        _convert(model, trainable="fc3*").save(tmp_path / "m.etrain")
        arenas.append(inspect_container(tmp_path / "m.etrain")["header"]["plan"]["arena_size"])
    largest = 120 * 400 * 4  # fc1's weight, dequantized
    assert arenas[1] <= arenas[0] + largest, arenas
