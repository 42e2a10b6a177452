"""Models exported from PyTorch 2.13 the way users export them (torchvision classifiers, a tiny BERT, conv nets
with BatchNorm and stored input normalization; TorchScript and dynamo exporters; BatchNorm kept or folded; fixed
or symbolic batch) train exactly the tensors PyTorch trains, follow PyTorch's numbers, and export models that
onnxruntime runs."""

from __future__ import annotations

import fnmatch
import time

import numpy as np
import onnx
import pytest

import edgetrain as et

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is optional: pip install onnxruntime")
import exports  # noqa: E402  (needs torch, checked above)

nn = torch.nn
BATCH = 4
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
STEPS = 3
VARIANTS = [("torchscript", "preserve"), ("torchscript", "eval"), ("dynamo", "eval")]
# BERT has no BatchNorm, so PRESERVE exports the same graph as EVAL; the dynamo exporter ignores PRESERVE
CASES = [
    (m, e, mode)
    for m in exports.MODELS
    for e, mode in VARIANTS
    if not (m == exports.BERT and mode == "preserve")
]
REPORT = "real exports from PyTorch 2.13 (seconds)"


def _cases(cases, quick=(), name=lambda c: "-".join(map(str, c))):
    """pytest params named model-exporter-mode[-...]; all but the quick ones are marked slow."""
    return [pytest.param(*c, id=name(c), marks=() if c in quick else pytest.mark.slow) for c in cases]


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("real_exports")


_REPORTED: set[str] = set()


def _export(export_dir, report, model, exporter, mode, batch=None) -> exports.Export:
    """The cached export, or a skip when a package it needs is missing."""
    if model in exports.TORCHVISION or model == exports.BERT:
        exports.declare_torchvision_ops()  # transformers imports torchvision too
    if model in exports.TORCHVISION:
        pytest.importorskip("torchvision", reason="torchvision is optional: pip install torchvision==0.28.0")
    if model == exports.BERT:
        pytest.importorskip(
            "transformers", reason="transformers is optional: pip install transformers==4.57.6"
        )
    if exporter == "dynamo":
        pytest.importorskip(
            "onnxscript", reason="the dynamo exporter needs onnxscript: pip install onnxscript"
        )
    ex = exports.export(model, export_dir, exporter=exporter, mode=mode, batch=batch)
    if ex.path.name not in _REPORTED:
        _REPORTED.add(ex.path.name)
        proto = ex.onnx()
        report(
            REPORT,
            f"export  {ex.path.stem:45s} {ex.seconds:5.1f}  opset {proto.opset_import[0].version}, "
            f"{len(proto.graph.node)} nodes, {len(ex.names)} torch parameters{' (BN folded)' * ex.folded}",
        )
    return ex


def _convert(
    ex: exports.Export, *, trainable, batch: int | None = BATCH
) -> tuple[et.TrainingArtifact, float]:
    t0 = time.perf_counter()
    art = et.convert(
        str(ex.path),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
        trainable=trainable,
        batch_size=batch,
    )
    return art, time.perf_counter() - t0


def _session(art: et.TrainingArtifact, tmp_path) -> et.TrainingSession:
    path = tmp_path / "model.etrain"
    art.save(path)
    return et.TrainingSession(path)


def _all_torch_parameters(ex: exports.Export) -> list[str]:
    """trainable= naming exactly the initializers that hold torch parameters: the numeric tests must not depend
    on the default selection, which the trained-set tests check."""
    return sorted(ex.onnx_names())


def _assert_same_set(got, want, what: str) -> None:
    got, want = set(got), set(want)
    extra, missing = sorted(got - want), sorted(want - got)
    assert not extra and not missing, (
        f"{what}: {len(extra)} trained that should not be: {extra[:12]}; "
        f"{len(missing)} not trained that should be: {missing[:12]}"
    )


# ---- a) the trained set -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model,exporter,mode", _cases(CASES, quick={("resnet18", "torchscript", "preserve")})
)
def test_full_finetuning_trains_every_torch_parameter(export_dir, report, model, exporter, mode):
    """trainable=None trains the initializers holding torch's named_parameters(), and nothing else: no BatchNorm
    statistics, shape constants, input normalization or attention masks. Where the dynamo exporter folded BERT's
    position lookup into a constant (the table's first rows, added to the token embeddings), that constant trains:
    it is the rows of the table PyTorch trains."""
    ex = _export(export_dir, report, model, exporter, mode)
    art, seconds = _convert(ex, trainable=None)
    report(REPORT, f"convert {ex.path.stem:45s} {seconds:5.1f}  full fine-tuning")
    want = set(ex.onnx_names())
    if model == exports.BERT and exporter == "dynamo":
        table = dict(ex.reference.named_parameters())[exports.DYNAMO_FOLDED[0]].detach().numpy()
        rows = table[: exports.BERT_SEQ]
        want |= {
            n
            for n, a in exports.initializers(ex.onnx()).items()
            if a.size == rows.size and np.array_equal(a.reshape(rows.shape), rows)
        }
    _assert_same_set(art.parameters, want, "trainable=None")


@pytest.mark.parametrize("model,exporter,mode", _cases(CASES))
def test_head_only_trains_the_classifier(export_dir, report, model, exporter, mode):
    """A pattern on the head's initializer names trains exactly the head's torch parameters."""
    ex = _export(export_dir, report, model, exporter, mode)
    head = ex.head()
    art, _ = _convert(ex, trainable=[f"{head}.*"])
    _assert_same_set(art.parameters, ex.onnx_names(head), f"trainable=['{head}.*']")


LAYERS = [
    # TorchScript names nodes by module path; its BN-folded initializers are onnx::Conv_N, so only a node-name
    # pattern selects a layer there
    ("resnet18", "torchscript", "preserve", "/layer4/*", "layer4"),
    ("resnet18", "torchscript", "eval", "/layer4/*", "layer4"),
    ("mobilenet_v2", "torchscript", "eval", "/features/features.17/*", "features.17"),
    ("bert", "torchscript", "eval", "/bert/encoder/layer.1/*", "bert.encoder.layer.1"),
    # the dynamo exporter names nodes node_Conv_327, but keeps module paths in initializer names
    ("resnet18", "dynamo", "eval", "layer4.*", "layer4"),
]


@pytest.mark.parametrize(
    "model,exporter,mode,pattern,layer",
    _cases(LAYERS, quick={LAYERS[1]}, name=lambda c: "-".join((*c[:3], c[4]))),
)
def test_layer_pattern_trains_that_layer(export_dir, report, model, exporter, mode, pattern, layer):
    """A node-name (or initializer-name) pattern trains the layer's torch parameters: for a node-name pattern,
    exactly the float initializers the layer's nodes consume, less BatchNorm statistics."""
    ex = _export(export_dir, report, model, exporter, mode)
    want = ex.onnx_names(layer)
    if pattern.startswith("/"):  # the export itself: the layer's nodes consume exactly its parameters
        assert _consumed_by(ex.onnx(), pattern) == want
    art, _ = _convert(ex, trainable=[pattern])
    _assert_same_set(art.parameters, want, f"trainable=['{pattern}']")


def _consumed_by(proto: onnx.ModelProto, pattern: str) -> set[str]:
    floats = {t.name for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    out = set()
    for n in proto.graph.node:
        if fnmatch.fnmatchcase(n.name, pattern):
            inputs = n.input[:3] if n.op_type == "BatchNormalization" else n.input  # not the statistics
            out.update(i for i in inputs if i in floats)
    return out


@pytest.mark.parametrize("exporter,mode", _cases(VARIANTS, quick={VARIANTS[0]}))
def test_input_normalization_trains_when_named(export_dir, report, tmp_path, exporter, mode):
    """pixel_mean / pixel_inv_std (buffers, exported as initializers) train when named in trainable=, and then
    follow PyTorch's SGD with them as leaves; by default they stay constants (test_full_finetuning)."""
    ex = _export(export_dir, report, "normalized_cnn", exporter, mode)
    buffers = {n: b for n, b in ex.module.named_buffers() if n.startswith("pixel_")}
    stats, _ = exports.map_tensors(exports.float_tensors(buffers.items()), ex.onnx())
    art, _ = _convert(ex, trainable=[*stats.values(), "classifier.*"])
    _assert_same_set(art.parameters, {*stats.values(), *ex.onnx_names("classifier")}, "trainable=")

    ref = ex.torch_reference()
    tensors = dict(ref.named_parameters()) | dict(ref.named_buffers())
    trained = {o: tensors[t] for t, o in {**stats, **ex.names}.items() if o in art.parameters}
    _follow_pytorch(_session(art, tmp_path), ex, ref, trained, *ex.data(BATCH, seed=1))


# ---- b) PyTorch's numbers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model,exporter,mode", _cases(CASES, quick={("keyword_spotter", "torchscript", "eval")})
)
def test_three_steps_follow_pytorch(export_dir, report, tmp_path, model, exporter, mode):
    """Losses and parameters over 3 steps of SGD (momentum, weight decay) equal PyTorch's in float64 from the
    same initial weights (eval mode: BatchNorm running statistics, no dropout)."""
    ex = _export(export_dir, report, model, exporter, mode)
    art, t_convert = _convert(ex, trainable=_all_torch_parameters(ex))
    ref = ex.torch_reference()
    params = dict(ref.named_parameters())
    trained = {o: params[t] for t, o in ex.names.items()}
    seconds = _follow_pytorch(_session(art, tmp_path), ex, ref, trained, *ex.data(BATCH, seed=1))
    report(
        REPORT,
        f"train   {ex.path.stem:45s} {t_convert:5.1f}  convert; {seconds:.2f} s/step at batch {BATCH}",
    )


def _follow_pytorch(sess, ex: exports.Export, ref, trained: dict, x, y, steps: int = STEPS) -> float:
    """Runs steps of sess.train_step beside torch.optim.SGD on exactly the torch tensors in trained (ONNX name ->
    tensor of the float64 reference), comparing the loss and every trained tensor after each step; returns the
    seconds per edgetrain step. Before each later step torch takes edgetrain's parameters, and the momentum
    their last update implies (v = (w_prev - w) / lr): each step is compared from the same state. Run freely,
    float32 rounding flips a few ReLUs near zero and the flips grow over steps (squeezenet's updates then differ
    by 2% in single elements after 3 steps, although each step agrees to 1e-5)."""
    for p in ref.parameters():
        p.requires_grad_(False)
    for t in trained.values():
        t.requires_grad_(True)
    opt = torch.optim.SGD(list(trained.values()), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    xt = torch.from_numpy(x if x.dtype.kind == "i" else x.astype(np.float64))
    yt = torch.from_numpy(y)
    flip = {ex.names[t] for t in ex.transposed}.__contains__
    before, seconds = sess.parameters(), 0.0
    for step in range(steps):
        opt.zero_grad()
        start = {
            n: (t.detach().clone(), _copy(opt.state[t].get("momentum_buffer"))) for n, t in trained.items()
        }
        loss = nn.functional.cross_entropy(exports.logits(ref, xt), yt)
        loss.backward()
        opt.step()
        t0 = time.perf_counter()
        ours = sess.train_step(x, y)
        seconds += time.perf_counter() - t0
        # abs: float32 log-softmax (ours) against float64 (torch) once a loss nears 0
        assert ours == pytest.approx(loss.item(), rel=1e-4, abs=1e-6), f"{ex.path.stem} step {step}"
        after = sess.parameters()
        float32 = None
        for name, t in trained.items():
            want = t.detach().numpy().T if flip(name) else t.detach().numpy()
            tol = 1e-4 * np.abs(want).max()
            off = np.abs(after[name] - want) > tol + 1e-4 * np.abs(want)
            if off.any():  # where float32 itself flips a ReLU or a max, PyTorch in float32 is the reference
                float32 = float32 or _float32_step(ex, start, xt, yt)
                w32 = float32[name].T if flip(name) else float32[name]
                np.testing.assert_allclose(
                    after[name][off], w32[off], rtol=1e-4, atol=tol, err_msg=f"{name} step {step} (float32)"
                )
                assert np.abs(w32[off] - want[off]).max() > tol, f"{name} step {step}: not a float32 flip"
        _resync(opt, trained, flip, before, after)
        before = after
    return seconds / steps


def _copy(t):
    return None if t is None else t.clone()  # opt.step() updates the momentum buffer in place


def _float32_step(ex: exports.Export, start: dict, xt, yt) -> dict[str, np.ndarray]:
    """PyTorch's SGD step in float32 from the state in start (ONNX name -> (float64 tensor, momentum buffer or
    None)): the parameters after it, by ONNX name, in torch's layout."""
    ref = ex.torch_reference().float()
    params = dict(ref.named_parameters())
    by_onnx = {o: params[t] for t, o in ex.names.items() if o in start}
    with torch.no_grad():
        for o, p in by_onnx.items():
            p.copy_(start[o][0].float())
    nn.functional.cross_entropy(
        exports.logits(ref, xt.float() if xt.is_floating_point() else xt), yt
    ).backward()
    out = {}
    with torch.no_grad():
        for o, p in by_onnx.items():
            g = p.grad + WEIGHT_DECAY * p
            buf = start[o][1]
            v = g if buf is None else MOMENTUM * buf.float() + g
            out[o] = (p - LR * v).numpy()
    return out


def _resync(opt, trained: dict, flip, before: dict, after: dict) -> None:
    """Sets torch's tensors to edgetrain's values and momentum to the velocity of edgetrain's last update."""
    with torch.no_grad():
        for name, t in trained.items():
            w, v = after[name], (before[name].astype(np.float64) - after[name]) / LR
            t.copy_(torch.from_numpy((w.T if flip(name) else w).astype(np.float64)))
            opt.state[t]["momentum_buffer"] = torch.from_numpy(np.ascontiguousarray(v.T if flip(name) else v))


# ---- c) the personalized export ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model,exporter,mode", _cases(CASES))
def test_export_runs_in_onnxruntime(export_dir, report, tmp_path, model, exporter, mode):
    """After a step, sess.export_onnx writes a model onnxruntime loads, holding the trained values under their
    initializer names, that reproduces sess.run."""
    ex = _export(export_dir, report, model, exporter, mode)
    art, _ = _convert(ex, trainable=_all_torch_parameters(ex))
    sess = _session(art, tmp_path)
    sess.train_step(*ex.data(BATCH, seed=1))
    _check_export(sess, ex, tmp_path / "personalized.onnx", batch=BATCH)


def _check_export(sess, ex: exports.Export, path, *, batch: int) -> None:
    """Exports, runs the export in onnxruntime on a batch it accepts (its fixed batch, else batch) and compares
    with sess.run; the trained parameters are initializers of the same name and value."""
    sess.export_onnx(path)
    proto = onnx.load(str(path))
    inits = exports.initializers(proto)
    for name, value in sess.parameters().items():
        assert name in inits, f"trained parameter '{name}' is not an initializer of the export"
        np.testing.assert_array_equal(inits[name], value, err_msg=name)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    rt = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (feed,) = rt.get_inputs()
    n = feed.shape[0] if isinstance(feed.shape[0], int) else batch
    x, _ = ex.data(n, seed=2)
    (got,) = rt.run(None, {feed.name: x})
    want = sess.run(x)
    want = want[0] if isinstance(want, (list, tuple)) else want
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# ---- d) fixed-batch exports, re-batched ----------------------------------------------------------------------------
REBATCH = [
    # (model, exporter, mode, batch of the export, batch_size= of the conversion)
    ("resnet18", "torchscript", "preserve", 1, 8),
    ("mobilenet_v3_small", "torchscript", "eval", 32, 4),
    ("shufflenet_v2_x0_5", "torchscript", "eval", 1, 8),
    ("normalized_cnn", "torchscript", "preserve", 32, 4),
    ("bert", "torchscript", "eval", 1, 4),
    # the dynamo exporter bakes a fixed batch into Reshape shapes ([1, 512]) and shufflenet's channel shuffle
    ("resnet18", "dynamo", "eval", 1, 8),
    ("shufflenet_v2_x0_5", "dynamo", "eval", 32, 4),
    ("keyword_spotter", "dynamo", "eval", 32, 4),
    ("bert", "dynamo", "eval", 1, 4),
]


@pytest.mark.parametrize("model,exporter,mode,exported,batch", _cases(REBATCH))
def test_fixed_batch_export_rebatches(export_dir, report, tmp_path, model, exporter, mode, exported, batch):
    """An export made at a fixed batch converts with another batch_size, computes torch's logits at that batch,
    trains two steps with PyTorch's numbers, and exports a model onnxruntime runs."""
    ex = _export(export_dir, report, model, exporter, mode, batch=exported)
    art, _ = _convert(ex, trainable=_all_torch_parameters(ex), batch=batch)
    sess = _session(art, tmp_path)
    ref = ex.torch_reference()
    x, y = ex.data(batch, seed=1)
    with torch.no_grad():
        want = exports.logits(ref, torch.from_numpy(x if x.dtype.kind == "i" else x.astype(np.float64)))
    want = want.numpy()
    np.testing.assert_allclose(sess.run(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    params = dict(ref.named_parameters())
    _follow_pytorch(sess, ex, ref, {o: params[t] for t, o in ex.names.items()}, x, y, steps=2)
    _check_export(sess, ex, tmp_path / "personalized.onnx", batch=batch)


# ---- the parameter map the tests above trust ------------------------------------------------------------------------
def test_parameter_map_finds_transposed_weights_and_refuses_tied_ones(tmp_path):
    """A Linear over a 3-D input exports its weight transposed for MatMul (found by value); twin layers of
    identical value export as one initializer (TorchScript), which the map refuses rather than guess."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 5)).eval()
    names, transposed = _map(net, torch.randn(2, 3, 4), tmp_path / "mlp.onnx")
    assert set(names) == {"0.weight", "0.bias", "2.weight", "2.bias"} and "0.weight" in transposed

    twins = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()
    twins[2].load_state_dict(twins[0].state_dict())  # a cloned layer: identical values
    with pytest.raises(exports.MappingError, match="share|several"):
        _map(twins, torch.randn(2, 4), tmp_path / "twins.onnx")


def _map(net, x, path):
    exports.export_module(net, x, path, exporter="torchscript", mode="eval")
    return exports.map_tensors(exports.float_tensors(net.named_parameters()), onnx.load(str(path)))
