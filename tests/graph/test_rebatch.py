"""Re-batching a model exported with a fixed batch: the shape constants that bake the batch in are found and
rewritten, the re-batched model trains exactly like the same model written batch-agnostic (an independent
reference), `run` takes any batch, the export keeps the original signature and runs in onnxruntime, and a model
that cannot be moved faithfully is refused, naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et
from edgetrain.graph.rebatch import apply_batch_plan, find_batch_plan
from edgetrain.graph.sections import BatchPlanSection
from edgetrain.onnx_io.reader import from_onnx

RNG = np.random.default_rng(1)


def f32(*shape):
    return (RNG.standard_normal(shape) * 0.4).astype(np.float32)


def build(nodes, x_shape, out_shape, inits) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


CONV = {"conv.weight": f32(4, 1, 3, 3), "conv.bias": f32(4), "fc.weight": f32(5, 144), "fc.bias": f32(5)}


def conv_net(batch) -> onnx.ModelProto:
    """Conv -> Relu -> flatten -> Gemm; with a fixed batch B the flatten is Reshape(h, [B, -1]) (what
    `x.view(x.size(0), -1)` exports to when the batch is fixed), else a batch-agnostic Flatten."""
    flatten = (
        helper.make_node("Reshape", ["r", "flat_shape"], ["f"], name="/Reshape")
        if isinstance(batch, int)
        else helper.make_node("Flatten", ["r"], ["f"], name="/Flatten")
    )
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], name="/conv/Conv", pads=[1] * 4),
        helper.make_node("Relu", ["c"], ["r"], name="/Relu"),
        flatten,
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1),
    ]
    inits = dict(CONV)
    if isinstance(batch, int):
        inits["flat_shape"] = np.array([batch, -1], np.int64)
    return build(nodes, [batch, 1, 6, 6], [batch, 5], inits)


PROJ = f32(6, 3)


def attention_like(batch) -> onnx.ModelProto:
    """A sequence-first block (torch's TransformerEncoder without batch_first): x [B, T, D] is transposed to
    [T, B, D], split into heads as [T, B*H, D/H] (a batch baked in at axis 1), mixed over heads, and put back."""
    b = batch if isinstance(batch, int) else 0
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="/Transpose", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["t", "heads_shape"], ["h"], name="/heads/Reshape"),
        helper.make_node("Tanh", ["h"], ["a"], name="/Tanh"),
        helper.make_node("Reshape", ["a", "back_shape"], ["m"], name="/merge/Reshape"),
        helper.make_node("Transpose", ["m"], ["u"], name="/Transpose_1", perm=[1, 0, 2]),
        helper.make_node("MatMul", ["u", "proj"], ["p"], name="/proj/MatMul"),
        helper.make_node("ReduceMean", ["p"], ["y"], name="/pool/ReduceMean", axes=[1], keepdims=0),
    ]
    inits = {
        "heads_shape": np.array([4, b * 2 if b else -1, 3], np.int64),
        "back_shape": np.array([4, b if b else -1, 6], np.int64),
        "proj": PROJ,
    }
    return build(nodes, [batch, 4, 6], [batch, 3], inits)


def train(model, batch, x, y, *, loss, tmp_path, name) -> tuple[list[float], dict, et.TrainingSession]:
    art = et.convert(model, loss=loss, optimizer=et.SGD(lr=0.1, momentum=0.9), batch_size=batch)
    art.save(tmp_path / f"{name}.etrain")
    sess = et.TrainingSession(tmp_path / f"{name}.etrain")
    losses = [sess.train_step(x, y) for _ in range(3)]
    return losses, sess.parameters(), sess, art


@pytest.mark.parametrize("exported_batch", [1, 32])
def test_fixed_batch_conv_net_trains_like_the_batch_agnostic_model(tmp_path, exported_batch):
    x, y = RNG.random((8, 1, 6, 6)).astype(np.float32), RNG.integers(0, 5, 8)
    ce = et.CrossEntropyLoss()
    ref_losses, ref_params, _, _ = train(conv_net("N"), 8, x, y, loss=ce, tmp_path=tmp_path, name="ref")
    losses, params, sess, art = train(
        conv_net(exported_batch), 8, x, y, loss=ce, tmp_path=tmp_path, name="fixed"
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for k in ref_params:
        np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-6, atol=1e-7, err_msg=k)
    assert any("re-batched" in n for n in art.notes)
    assert any(f"[{exported_batch}, -1] -> [8, -1]" in n for n in art.notes)
    assert art.section(BatchPlanSection).plan.edits[0].node == "/Reshape"

    np.testing.assert_allclose(sess.run(x[:3]), sess.evaluate(x, y)[1][:3], rtol=1e-5, atol=1e-6)  # any batch
    sess.export_onnx(tmp_path / "p.onnx")
    exported = onnx.load(tmp_path / "p.onnx")
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_value == exported_batch
    xb = RNG.random((exported_batch, 1, 6, 6)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"x": xb})[0]
    np.testing.assert_allclose(got, sess.run(xb), rtol=1e-5, atol=1e-6)


def test_a_batch_baked_into_a_middle_axis_is_found():
    fixed = from_onnx(attention_like(2))
    plan = find_batch_plan(fixed, 5)
    assert sorted((e.node, e.index, e.factor) for e in plan.edits) == [
        ("/heads/Reshape", 1, 2),
        ("/merge/Reshape", 1, 1),
    ]
    moved = apply_batch_plan(fixed, plan, 5)
    x = RNG.random((5, 4, 6)).astype(np.float32)
    want = et.InferenceSession(attention_like("N")).run(None, {"x": x})[0]
    got = et.InferenceSession(moved).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_constant_expanded_to_the_batch_is_rewritten():
    nodes = [
        helper.make_node("Expand", ["mask", "mask_shape"], ["m"], name="/mask/Expand"),
        helper.make_node("Mul", ["x", "m"], ["y"], name="/Mul"),
    ]
    inits = {"mask": f32(1, 3), "mask_shape": np.array([2, 3], np.int64)}
    fixed = from_onnx(build(nodes, [2, 3], [2, 3], inits))
    plan = find_batch_plan(fixed, 6)
    assert [(e.node, e.index, e.factor) for e in plan.edits] == [("/mask/Expand", 0, 1)]
    x = f32(6, 3)
    got = et.InferenceSession(apply_batch_plan(fixed, plan, 6)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x * inits["mask"], rtol=1e-6)


def test_a_reshape_that_mixes_the_batch_is_refused_naming_it():
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"], name="/mix/Reshape"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="/MatMul"),
    ]
    m = build(nodes, [2, 6], [3, 2], {"s": np.array([3, 4], np.int64), "w": f32(4, 2)})
    with pytest.raises(et.RebatchError, match=r"node '/mix/Reshape' \(Reshape\) reshapes to \[3, 4\]"):
        et.convert(m, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=8)
    art = et.convert(m, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1))  # at its own batch it is fine
    assert art.graph.values["x"].shape == (2, 6)


def test_a_model_that_mixes_samples_is_refused_by_the_sample_by_sample_check():
    """x - mean over the batch: the exported model's answer for a sample depends on the batch it came in, so no
    re-batching can keep it; the check against the exported model says so instead of training something else."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], name="/batch_mean/ReduceMean", axes=[0]),
        helper.make_node("Sub", ["x", "mu"], ["c"], name="/Sub"),
        helper.make_node("Gemm", ["c", "w"], ["y"], name="/fc/Gemm", transB=1),
    ]
    m = build(nodes, [4, 3], [4, 2], {"w": f32(2, 3)})
    with pytest.raises(et.RebatchError, match="changes its output 'y'.*dynamic_axes"):
        et.convert(m, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=8)


def test_run_at_another_batch_without_a_plan_says_what_to_do(tmp_path):
    art = et.convert(conv_net(4), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1))
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    assert sess.run(RNG.random((4, 1, 6, 6)).astype(np.float32)).shape == (4, 5)
    with pytest.raises(et.FeedError, match="fixed batch of 4.*batches of 4.*--batch-size"):
        sess.run(RNG.random((3, 1, 6, 6)).astype(np.float32))
