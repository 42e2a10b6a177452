"""The transformer fast paths of a training step (edgetrain.graph.fuse; switches "gelu", "layernorm", "attention",
"gather_split", "matmul2d"): the fused kernels against onnxruntime and float64 finite differences, their ONNX
function bodies against the kernels in onnxruntime, the fused step against the plain one (1e-6 relative) on the
benchmark's ViT and ConvNeXt-style net (both exporters, and the decomposed ops of opset 16) and on tiny BERT and
GPT-2, training_onnx() in onnxruntime, and three steps against PyTorch."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import edgetrain as et
from edgetrain.core import fastpaths
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.kernels import KERNELS
from edgetrain.core.ops import PRIVATE_DOMAIN

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
ort = pytest.importorskip("onnxruntime")
import exports  # noqa: E402  (needs torch, checked above)
import transformer_models as tm  # noqa: E402

SWITCHES = ("gelu", "layernorm", "attention", "gather_split", "matmul2d")
FUSED = {  # the private ops each switch puts into a step
    "gelu": {"GeluTraining", "GeluGrad"},
    "layernorm": {"LayerNormGrad"},
    "attention": {"SoftmaxAttention", "SoftmaxAttentionGrad"},
    "gather_split": set(),
    "matmul2d": set(),
}
SGD = dict(lr=0.01, momentum=0.9, weight_decay=5e-4)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("transformer_exports"))


def _kernel(op: str):
    return KERNELS[op].fn


def _ort_run(nodes, inputs: dict[str, np.ndarray], outputs: list[str], opset: int = 20) -> list[np.ndarray]:
    """A standard-op graph (onnx.helper nodes) run by onnxruntime."""
    import onnx
    from onnx import helper

    vi = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in inputs.items()
    ]
    out = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs]
    model = helper.make_model(
        helper.make_graph(nodes, "g", vi, out), opset_imports=[helper.make_opsetid("", opset)]
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(outputs, inputs)


def _fd(f, x: np.ndarray, v: np.ndarray, eps: float = 1e-6) -> float:
    """The directional derivative of the scalar f at x along v, by float64 central differences."""
    return (f(x + eps * v) - f(x - eps * v)) / (2 * eps)


# ---- kernels -----------------------------------------------------------------------------------------------------
def test_gelu_training_is_the_gelu_kernel_bit_for_bit_and_onnxruntimes_gelu():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.float16):
        x = (rng.standard_normal((5, 40001)) * 3).astype(dtype)  # several of the kernel's chunks
        x.reshape(-1)[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 60000.0]
        y, cdf = _kernel("GeluTraining")(x)
        assert y.dtype == cdf.dtype == dtype
        np.testing.assert_array_equal(y, _kernel("Gelu")(x), err_msg=str(dtype))
    x = (rng.standard_normal((64, 1000)) * 3).astype(np.float32)
    y, cdf = _kernel("GeluTraining")(x)
    from onnx import helper

    (ref,) = _ort_run([helper.make_node("Gelu", ["x"], ["y"])], {"x": x}, ["y"])
    # in the left tail 1 + erf cancels in float32 (as in the Gelu kernel): errors there are absolute, ~1e-7
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=2e-7)
    phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.reshape(-1).astype(np.float64)])
    np.testing.assert_allclose(cdf.reshape(-1), phi, rtol=0, atol=2e-7)


def test_gelu_grad_against_finite_differences():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(2000) * 3
    dy = rng.standard_normal(2000)
    y, cdf = _kernel("GeluTraining")(x)
    dx = _kernel("GeluGrad")(dy, y, cdf)
    gelu = _kernel("Gelu")
    fd = (gelu(x + 1e-6) - gelu(x - 1e-6)) / 2e-6 * dy  # elementwise: each x_i moves its own y_i alone
    np.testing.assert_allclose(dx, fd, rtol=1e-7, atol=1e-8)
    y32, cdf32 = _kernel("GeluTraining")(x.astype(np.float32))
    np.testing.assert_allclose(
        _kernel("GeluGrad")(dy.astype(np.float32), y32, cdf32), dx, rtol=1e-6, atol=1e-6
    )
    # far left, where Phi(x) underflows to 0 (x < -13 in float32), the slope is 0 to float32
    x = np.array([-14.0, -20.0, 30.0], np.float32)
    y32, cdf32 = _kernel("GeluTraining")(x)
    assert list(_kernel("GeluGrad")(np.ones(3, np.float32), y32, cdf32)) == [0, 0, 1]


def _layer_norm64(x, scale, bias, axis, eps=1e-5):
    ax = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=ax, keepdims=True)
    istd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=ax, keepdims=True) + eps)
    return (x - mean) * istd * scale + bias, mean, istd


@pytest.mark.parametrize(
    "shape,axis,pshape", [((6, 7, 16), -1, (16,)), ((4, 3, 5, 6), 2, (5, 6)), ((4, 3, 5, 6), 1, (1, 6))]
)
def test_layer_norm_grad_against_finite_differences(shape, axis, pshape):
    rng = np.random.default_rng(2)
    x, r = rng.standard_normal(shape) * 2 + 0.5, rng.standard_normal(shape)
    scale, bias = rng.standard_normal(pshape), rng.standard_normal(pshape)
    _, mean, istd = _layer_norm64(x, scale, bias, axis)
    dx, dscale, db = _kernel("LayerNormGrad")(r, x, scale, mean, istd, axis=axis, noutputs=3)
    inner = shape[axis % len(shape) :]
    assert dx.shape == shape and dscale.shape == db.shape == inner

    def loss(x=x, scale=scale, bias=bias):
        return float(np.sum(_layer_norm64(x, scale, bias, axis)[0] * r))

    for name, value, grad in (("x", x, dx), ("scale", scale, dscale), ("bias", bias, db)):
        grad = (
            grad.reshape((-1,) + pshape).sum(axis=0) if name != "x" else grad
        )  # down to the parameter's shape
        for seed in range(3):
            v = np.random.default_rng(seed).standard_normal(value.shape)
            got = float(np.sum(grad * v))
            want = _fd(lambda t, name=name: loss(**{name: t}), value, v)
            assert got == pytest.approx(want, rel=1e-6, abs=1e-7), (name, seed)
    x32 = [a.astype(np.float32) for a in (r, x, scale, mean, istd)]
    for a, b in zip(_kernel("LayerNormGrad")(*x32, axis=axis, noutputs=3), (dx, dscale, db)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def _attention_inputs(dtype, seed=3, mask=True):
    rng = np.random.default_rng(seed)
    q, kt, v = (
        rng.standard_normal((2, 3, 5, 4)),
        rng.standard_normal((2, 3, 4, 6)),
        rng.standard_normal((2, 3, 6, 7)),
    )
    m = np.where(rng.random((2, 1, 5, 6)) < 0.2, -1e4, rng.standard_normal((2, 1, 5, 6))) if mask else None
    return [a if a is None else a.astype(dtype) for a in (q, kt, v, m)]


def test_attention_against_onnxruntime():
    from onnx import helper

    q, kt, v, m = _attention_inputs(np.float32)
    scale = np.array(0.5, np.float32)
    y, p = _kernel("SoftmaxAttention")(q, kt, v, m, scale=0.5, noutputs=2)
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["z0"]),
        helper.make_node("Add", ["z0", "m"], ["z"]),
        helper.make_node("Softmax", ["z"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    ref_y, ref_p = _ort_run(nodes, {"q": q, "kt": kt, "v": v, "m": m, "c": scale}, ["y", "p"])
    np.testing.assert_allclose(y, ref_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, ref_p, rtol=1e-6, atol=1e-7)


def test_attention_grad_against_finite_differences():
    q, kt, v, m = _attention_inputs(np.float64)
    r = np.random.default_rng(4).standard_normal((2, 3, 5, 7))
    y, p = _kernel("SoftmaxAttention")(q, kt, v, m, scale=0.7, noutputs=2)
    grads = _kernel("SoftmaxAttentionGrad")(r, q, kt, v, p, scale=0.7, noutputs=4)
    inputs = {"q": q, "kt": kt, "v": v, "m": m}
    for (name, value), grad in zip(inputs.items(), grads):
        grad = grad.sum(axis=1, keepdims=True) if name == "m" else grad  # the mask broadcasts over the heads

        def loss(t, name=name):
            args = {**inputs, name: t}
            return float(np.sum(_kernel("SoftmaxAttention")(*args.values(), scale=0.7, noutputs=1) * r))

        for seed in range(3):
            d = np.random.default_rng(seed).standard_normal(value.shape)
            assert float(np.sum(grad * d)) == pytest.approx(_fd(loss, value, d), rel=1e-6, abs=1e-8), name


# ---- the fused ops' ONNX function bodies ----------------------------------------------------------------------------
def _body_cases():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    s, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    mean, istd = (a.astype(np.float32) for a in _layer_norm64(x.astype(np.float64), s, b, -1)[1:])
    q, kt, v, m = _attention_inputs(np.float32)
    _, p = _kernel("SoftmaxAttention")(q, kt, v, m, scale=0.5, noutputs=2)
    dy = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    return [
        ("GeluTraining", [x * 3], {}, 2),
        ("GeluGrad", [x, *_kernel("GeluTraining")(x * 2)], {}, 1),
        ("LayerNormGrad", [x, x * 2 + 1, s, mean, istd], {"axis": 2}, 3),
        ("SoftmaxAttention", [q, kt, v, m], {"scale": 0.5}, 2),
        ("SoftmaxAttentionGrad", [dy, q, kt, v, p], {"scale": 0.5}, 4),
    ]


@pytest.mark.parametrize("op,inputs,attrs,n", _body_cases(), ids=[c[0] for c in _body_cases()])
def test_fused_ops_bodies_compute_their_kernels_in_onnxruntime(op, inputs, attrs, n):
    """Each private op written out as its ONNX function body (standard ops), run by onnxruntime, against edgetrain's
    kernel; and its shape function against what the kernel computes."""
    from edgetrain.core.ops import record
    from edgetrain.derive.autodiff import expand_body
    from edgetrain.onnx_io.writer import to_onnx

    names = [f"i{k}" for k in range(len(inputs))]
    node = Node(op, tuple(names), tuple(f"o{k}" for k in range(n)), attrs, "under_test", PRIVATE_DOMAIN)
    values = {k: TensorInfo(a.dtype, a.shape) for k, a in zip(names, inputs)}
    shapes = record(op).shape(node, list(values.values()))
    values.update({o: s for o, s in zip(node.outputs, shapes)})
    g = Graph([node], names, list(node.outputs), {}, values, opset=20, opsets={PRIVATE_DOMAIN: 1})
    feeds = dict(zip(names, inputs))
    ours = Interpreter(g, preallocate=False).run(feeds)
    for o, s in zip(ours, shapes):
        assert o.shape == tuple(s.shape) and o.dtype == s.dtype, (op, o.shape, s)
    sess = ort.InferenceSession(
        to_onnx(g, body=expand_body).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for a, b, name in zip(ours, sess.run(None, feeds), node.outputs):
        np.testing.assert_allclose(
            a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(b).max())), err_msg=name
        )


# ---- the fused step against the plain step ----------------------------------------------------------------------
BATCH = 4
CASES = [
    pytest.param("vit", "torchscript", None, id="vit-torchscript", marks=pytest.mark.slow),
    # decomposed LayerNorm and erf GELU
    pytest.param("vit", "torchscript", 16, id="vit-torchscript-opset16", marks=pytest.mark.slow),
    pytest.param("convnext", "torchscript", None, id="convnext-torchscript"),
    pytest.param("convnext", "torchscript", 16, id="convnext-torchscript-opset16"),
    pytest.param("vit", "dynamo", None, id="vit-dynamo", marks=pytest.mark.slow),
    pytest.param("convnext", "dynamo", None, id="convnext-dynamo", marks=pytest.mark.slow),
]
# the private ops each model's full fine-tuning step holds on the fast paths (ConvNeXt has no attention)
EXPECTED = {"vit": set().union(*FUSED.values()), "convnext": FUSED["gelu"] | FUSED["layernorm"]}


def _convert(model, batch: int, *, loss=None, trainable=None, plain: tuple[str, ...] | None = None):
    """The artifact of `model` (a path); plain: the fast paths turned off while converting (() for all)."""
    kw = dict(
        loss=loss or et.CrossEntropyLoss(), optimizer=et.SGD(**SGD), batch_size=batch, trainable=trainable
    )
    if plain is None:
        return et.convert(str(model), **kw)
    with fastpaths.plain(*plain):
        return et.convert(str(model), **kw)


def _train(art, folder, x, y, steps: int = 2) -> tuple[list[float], dict[str, np.ndarray]]:
    path = folder / f"{len(list(folder.iterdir()))}.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    return [sess.train_step(x, y) for _ in range(steps)], sess.parameters()


def _batched_linears(art) -> int:
    """MatMuls of a sequence of rows [..., n, k] by a matrix [k, m] in the step (matmul2d makes them 2-D)."""
    shape = lambda v: art.graph.values[v].shape  # noqa: E731
    return sum(
        n.op_type == "MatMul" and len(shape(n.inputs[0])) > 2 and len(shape(n.inputs[1])) == 2
        for n in art.graph.nodes
    )


def _private(art) -> set[str]:
    return {n.op_type for n in art.graph.nodes if n.domain == PRIVATE_DOMAIN}


def _assert_same_training(got, want, rtol: float = 1e-6) -> None:
    """Losses and every trained parameter within rtol (relative to each tensor's largest value)."""
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=0)
    assert got[1].keys() == want[1].keys()
    for k, ref in want[1].items():
        np.testing.assert_allclose(got[1][k], ref, rtol=rtol, atol=rtol * np.abs(ref).max(), err_msg=k)


@pytest.mark.parametrize("model,exporter,opset", CASES)
def test_fused_step_equals_the_plain_step(export_dir, tmp_path, model, exporter, opset):
    """Full fine-tuning with every fast path on: the fused ops are in the step, and two steps give the plain
    step's losses and parameters within 1e-6 relative."""
    e = tm.export(model, export_dir, exporter=exporter, opset=opset, batch=BATCH)
    x, y = e.data()
    fast, plain = _convert(e.path, BATCH), _convert(e.path, BATCH, plain=())
    assert EXPECTED[model] <= _private(fast), _private(fast)
    assert _batched_linears(fast) == 0 < _batched_linears(plain)
    assert not _private(plain) & set().union(*FUSED.values())
    _assert_same_training(_train(fast, tmp_path, x, y), _train(plain, tmp_path, x, y))


@pytest.mark.slow
@pytest.mark.parametrize("switch", SWITCHES)
def test_each_fast_path_alone_keeps_the_step(export_dir, tmp_path, switch):
    """The ViT converted with one fast path off: that path's ops are gone, the others' stay, and the step is the
    plain one within 1e-6."""
    e = tm.export("vit", export_dir, batch=BATCH)
    x, y = e.data()
    art = _convert(e.path, BATCH, plain=(switch,))
    ops = _private(art)
    assert not ops & FUSED[switch] and set().union(*(FUSED[s] for s in SWITCHES if s != switch)) <= ops
    gathers = sum(n.op_type == "Gather" for n in art.graph.nodes)  # 12 for q, k, v, 1 for the class token
    assert gathers == (13 if switch == "gather_split" else 1), gathers
    assert (_batched_linears(art) > 0) == (switch == "matmul2d")
    _assert_same_training(
        _train(art, tmp_path, x, y), _train(_convert(e.path, BATCH, plain=()), tmp_path, x, y)
    )


def _language_models(export_dir):
    """(name, ONNX path, loss, token batch, labels) of the tiny BERT classifier and GPT-2 LM the other tests use."""
    bert = exports.export(exports.BERT, export_dir, exporter="torchscript", batch=None)
    rng = np.random.default_rng(7)
    ids = rng.integers(1, exports.BERT_VOCAB, (BATCH, exports.BERT_SEQ)).astype(np.int64)
    yield (
        "bert",
        bert.path,
        et.CrossEntropyLoss(),
        ids,
        rng.integers(0, bert.num_classes, BATCH).astype(np.int64),
    )
    lm, tokens = exports.gpt2(batch=BATCH)
    path = f"{export_dir}/gpt2-torchscript.onnx"
    exports.export_lm(lm, tokens, path, exporter="torchscript")
    yield "gpt2", path, et.NextTokenLoss(), tokens.numpy(), tokens.numpy()


@pytest.mark.slow
def test_bert_and_gpt2_steps_equal_the_plain_steps(export_dir, tmp_path):
    """Tiny BERT (post-LayerNorm, erf GELU, a padding mask added to the scores) and GPT-2 (tanh GELU, a causal mask
    through Where): the fused steps equal the plain ones within 1e-6."""
    for name, path, loss, x, y in _language_models(export_dir):
        fast, plain = _convert(path, BATCH, loss=loss), _convert(path, BATCH, loss=loss, plain=())
        assert FUSED["layernorm"] <= _private(fast), (name, _private(fast))
        if name == "bert":
            assert FUSED["attention"] | FUSED["gelu"] <= _private(fast), _private(fast)
        _assert_same_training(_train(fast, tmp_path, x, y), _train(plain, tmp_path, x, y))


def test_training_onnx_runs_the_fused_step_in_onnxruntime(export_dir):
    """training_onnx() writes the fused ops as ONNX functions in standard ops: onnxruntime's step equals
    edgetrain's (loss and every updated parameter)."""
    e = tm.export("vit", export_dir, batch=2)
    art = _convert(e.path, 2)
    assert EXPECTED["vit"] <= _private(art)
    x, y = e.data()
    feeds = art.feeds({"input": x}, y)
    ours = dict(zip(art.graph.outputs, Interpreter(art.graph).run(feeds)))
    sess = ort.InferenceSession(art.training_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {n: feeds[n] for n in names})))
    np.testing.assert_allclose(ours[art.loss], theirs[art.loss], rtol=1e-6)
    for p, out in art.updates.items():
        np.testing.assert_allclose(
            ours[out], theirs[out], rtol=1e-5, atol=1e-5 * np.abs(theirs[out]).max(), err_msg=p
        )


@pytest.mark.parametrize("model", [pytest.param("vit", marks=pytest.mark.slow), "convnext"])
def test_three_steps_follow_pytorch(export_dir, tmp_path, model):
    """Full fine-tuning on the fast paths against PyTorch's autograd and SGD (momentum, weight decay) in float64
    from the same weights: losses and parameters within 1e-4 relative over 3 steps."""
    torch.set_num_threads(1)
    e = tm.export(model, export_dir, batch=BATCH)
    x, y = e.data()
    losses, params = _train(_convert(e.path, BATCH), tmp_path, x, y, steps=3)
    net = copy.deepcopy(e.module).double().train()
    opt = torch.optim.SGD(net.parameters(), **SGD)
    xt, yt = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y)
    for step in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        opt.step()
        assert losses[step] == pytest.approx(loss.item(), rel=1e-4), step
    for t_name, p in net.named_parameters():
        ref = p.detach().numpy()
        ours = params[e.names[t_name]]
        ours = ours.T if t_name in e.transposed else ours
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=t_name)


def test_export_and_run_keep_the_models_own_ops(export_dir, tmp_path):
    """The fused ops live in the training step alone: the personalized export holds the model's Gelu, LayerNorm,
    Softmax and Gather nodes, onnxruntime runs it as run() does, and head-only fine-tuning fuses nothing."""
    import onnx

    e = tm.export("vit", export_dir, batch=BATCH)
    x, y = e.data()
    art = _convert(e.path, BATCH)
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(tmp_path / "m.etrain")
    sess.train_step(x, y)
    sess.export_onnx(tmp_path / "p.onnx")
    proto = onnx.load(str(tmp_path / "p.onnx"))
    ops = {n.op_type for n in proto.graph.node}
    assert {"Gelu", "LayerNormalization", "Softmax", "Gather"} <= ops and not ops & set(EXPECTED["vit"])
    assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )
    np.testing.assert_allclose(sess.run(x), ref[0], rtol=1e-5, atol=1e-5)
    head = _convert(e.path, BATCH, trainable=["head.weight", "head.bias"])
    assert not _private(head) & set().union(*FUSED.values())


# ---- what the pass leaves alone ------------------------------------------------------------------------------------
def _fused_ops(nodes, values, params, initializers=None) -> list[str]:
    """The op types of a hand-built graph after fuse_for_training, differentiating with respect to params."""
    from edgetrain.core.ir import GraphBuilder
    from edgetrain.graph.fuse import fuse_for_training

    infos = {k: TensorInfo(np.dtype(np.float32), s) for k, s in values.items()}
    inits = initializers or {}
    infos.update({k: TensorInfo(v.dtype, v.shape) for k, v in inits.items()})
    g = Graph(
        list(nodes), [k for k in values if k not in inits], [nodes[-1].outputs[0]], inits, infos, opset=20
    )
    b = GraphBuilder(g)
    fuse_for_training(b, params)
    return [n.op_type for n in b.graph.nodes]


def test_the_pass_rewrites_only_what_a_gradient_crosses_and_what_it_can():
    i0, i1 = np.asarray(0, np.int64), np.asarray(1, np.int64)
    # two rows of an embedding table: a Split would make one output per row of it
    table = [
        Node("Gather", ("t", "i0"), ("a",)),
        Node("Gather", ("t", "i1"), ("b",)),
        Node("Add", ("a", "b"), ("y",)),
    ]
    values = {"t": (50, 4), "a": (4,), "b": (4,), "y": (4,)}
    assert _fused_ops(table, values, ["t"], {"i0": i0, "i1": i1}) == ["Gather", "Gather", "Add"]
    # a GELU no gradient crosses (its input depends on no parameter) stays a Gelu
    gelu = [Node("Gelu", ("x",), ("h",)), Node("Mul", ("h", "w"), ("y",))]
    values = {"x": (2, 3), "h": (2, 3), "w": (3,), "y": (2, 3)}
    assert _fused_ops(gelu, values, ["w"]) == ["Gelu", "Mul"]
    assert _fused_ops(gelu, values, ["x"]) == ["GeluTraining", "Mul"]
    # a LayerNorm whose statistics the model reads itself, and a Softmax that no MatMul reads
    ln = [Node("LayerNormalization", ("x", "s"), ("h", "m", "r")), Node("Add", ("h", "m"), ("y",))]
    values = {"x": (2, 3), "s": (3,), "h": (2, 3), "m": (2, 1), "r": (2, 1), "y": (2, 3)}
    assert _fused_ops(ln, values, ["s"]) == ["LayerNormalization", "Add"]
    sm = [
        Node("MatMul", ("q", "k"), ("z",)),
        Node("Softmax", ("z",), ("p",)),
        Node("Add", ("p", "q2"), ("y",)),
    ]
    values = {"q": (2, 4, 3), "k": (2, 3, 4), "z": (2, 4, 4), "p": (2, 4, 4), "q2": (2, 4, 4), "y": (2, 4, 4)}
    assert _fused_ops(sm, values, ["q"]) == ["MatMul", "Softmax", "Add"]
