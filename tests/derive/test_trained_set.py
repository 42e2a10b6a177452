"""Full fine-tuning trains exactly the tensors the model's author trains (its named_parameters()), on the
architectures personalized today, exported both ways (TorchScript at opsets 14, 17 and 18, dynamo): layer scales, class
tokens and position tables, written-out norms, a GroupNorm below opset 18, buffers of preprocessing and masks, a
tied language-model head, low-rank adapters. Three SGD-momentum steps follow PyTorch's; patterns select what the
user meant (the head, '*lora*') through the module paths recovered from node names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import edgetrain as et

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
import exports  # noqa: E402  (needs torch, checked above)
import families  # noqa: E402

nn = torch.nn
BATCH, CLASSES = 4, 5
LR, MOMENTUM = 0.05, 0.9
VARIANTS = [("torchscript", 17), ("torchscript", 14), ("torchscript", 18), ("dynamo", 18)]
QUICK = {("torchscript", 17)}
CASES = [
    pytest.param(name, e, o, id=f"{name}-{e}-{o}", marks=() if (e, o) in QUICK else pytest.mark.slow)
    for name in families.FAMILIES
    for e, o in VARIANTS
]


def _module(name: str) -> nn.Module:
    torch.manual_seed(0)
    module = families.FAMILIES[name][0]().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # fresh fills (ones, zeros) would look alike; real weights do not (buffers stay)
        for t in module.parameters():
            t.add_(torch.randn(t.shape, generator=gen) * (float(t.abs().mean()) * 0.05 or 0.02))
    return module


_EXPORTS: dict[tuple, tuple[nn.Module, str]] = {}


def _export(tmp_path_factory, name: str, exporter: str, opset: int) -> tuple[nn.Module, str]:
    key = (name, exporter, opset)
    if key not in _EXPORTS:
        module = _module(name)
        path = str(tmp_path_factory.mktemp("families") / f"{name}-{exporter}-{opset}.onnx")
        x = torch.from_numpy(families.example(name, BATCH))
        exports.export_module(module, x, path, exporter=exporter, mode="eval", symbolic=True, opset=opset)
        _EXPORTS[key] = (module, path)
    return _EXPORTS[key]


def _holds(onnx_value: np.ndarray, torch_value: np.ndarray) -> np.ndarray | None:
    """onnx_value as torch_value's layout when it holds the same tensor (equal, transposed, reshaped), else None."""
    for view in (onnx_value, onnx_value.T if onnx_value.ndim == 2 else None):
        if view is not None and view.size == torch_value.size:
            v = view.reshape(torch_value.shape)
            if np.array_equal(v, torch_value):
                return v
    return None


def _trained(module: nn.Module, art) -> tuple[dict[str, str], list[str]]:
    """({torch parameter: the ONNX parameter that trains it}, ONNX parameters that are no torch parameter)."""
    found, extra = {}, []
    tensors = {k: v.detach().numpy() for k, v in module.named_parameters()}
    for p in art.parameters:
        hits = [t for t, v in tensors.items() if _holds(art.initial[p], v) is not None]
        if not hits:
            extra.append(p)
        for t in hits:
            found[t] = p
    return found, extra


def _as_torch(onnx_value: np.ndarray, initial: np.ndarray, torch_initial: np.ndarray) -> np.ndarray:
    """A trained ONNX parameter in its torch parameter's layout: the one that held the initial values."""
    if initial.ndim == 2 and not np.array_equal(initial.reshape(torch_initial.shape), torch_initial):
        return onnx_value.T.reshape(torch_initial.shape)
    return onnx_value.reshape(torch_initial.shape)


def _convert(path, trainable=None, **kw):
    return et.convert(
        path,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=MOMENTUM),
        trainable=trainable,
        batch_size=BATCH,
        **kw,
    )


@pytest.mark.parametrize("name,exporter,opset", CASES)
def test_full_fine_tuning_trains_named_parameters_and_follows_pytorch(
    tmp_path_factory, report, name, exporter, opset
):
    module, path = _export(tmp_path_factory, name, exporter, opset)
    art = _convert(path)
    expected = dict(module.named_parameters())
    found, extra = _trained(module, art)
    assert extra == [], f"trains tensors PyTorch does not: {extra}"
    assert sorted(found) == sorted(expected), f"misses {sorted(set(expected) - set(found))}"
    report(
        "trained / expected tensors, full fine-tuning",
        f"{name:10s} {exporter:11s} opset {opset}: {len(art.parameters)} / {len(expected)}",
    )
    x = families.example(name, BATCH)
    y = np.random.default_rng(3).integers(0, CLASSES, BATCH)
    sess = et.TrainingSession(art)
    ours = [sess.train_step(x, y) for _ in range(3)]
    reference = _module(name)
    for p in reference.parameters():
        p.requires_grad_(True)  # everything trains in full fine-tuning, the adapters' frozen base too
    opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    theirs = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs.append(float(loss))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    got = sess.parameters()
    initial = dict(_module(name).named_parameters())
    worst = 0.0
    for t, p in found.items():
        want = dict(reference.named_parameters())[t].detach().numpy()
        mine = _as_torch(got[p], art.initial[p], initial[t].detach().numpy())
        np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-6, err_msg=t)
        worst = max(worst, float(np.abs(mine - want).max() / (np.abs(want).max() + 1e-12)))
    # the personalized model keeps the export's signature: onnxruntime runs it at any batch
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is optional")
    exported = tmp_path_factory.mktemp("exported") / "p.onnx"
    sess.export_onnx(str(exported))
    runner = ort.InferenceSession(str(exported))
    for batch in (1, 2, BATCH):
        xb = families.example(name, batch, seed=5)
        (got_b,) = runner.run(None, {runner.get_inputs()[0].name: xb})
        np.testing.assert_allclose(got_b, sess.run(xb), rtol=1e-4, atol=1e-5, err_msg=f"batch {batch}")
    report(
        "3 SGD-momentum steps against PyTorch (max relative parameter difference)",
        f"{name} {exporter} {opset}: {worst:.1e}",
    )


@pytest.mark.parametrize(
    "exporter,opset", [("torchscript", 17), pytest.param("dynamo", 18, marks=pytest.mark.slow)]
)
def test_patterns_select_what_the_user_meant(tmp_path_factory, exporter, opset):
    module, path = _export(tmp_path_factory, "lora", exporter, opset)
    found, _ = _trained(module, _convert(path, trainable="*lora*"))
    assert sorted(found) == sorted(t for t in dict(module.named_parameters()) if "lora" in t)
    module, path = _export(tmp_path_factory, "vit", exporter, opset)
    found, _ = _trained(module, _convert(path, trainable="*head*"))
    assert sorted(found) == ["head.bias", "head.weight"]


def test_a_tied_head_trains_as_one_tensor_and_follows_pytorch(tmp_path, report):
    """GPT-2's lm_head is its token table: one tensor in PyTorch, written twice by both exporters."""
    for exporter in ("torchscript", "dynamo"):
        lm, ids = exports.gpt2()
        exports.perturb(lm, 2)
        path = str(tmp_path / f"gpt2-{exporter}.onnx")
        exports.export_lm(lm, ids, path, exporter=exporter)
        art = et.convert(
            path, loss=et.NextTokenLoss(), optimizer=et.SGD(lr=LR, momentum=MOMENTUM), batch_size=2
        )
        assert any(n.startswith("tied:") for n in art.notes), art.notes
        found, extra = _trained(lm, art)
        assert extra == [] and sorted(found) == sorted(dict(lm.named_parameters())), (extra, found)
        sess = et.TrainingSession(art)
        ours = [sess.train_step(ids.numpy(), ids.numpy()) for _ in range(3)]
        opt = torch.optim.SGD(lm.parameters(), lr=LR, momentum=MOMENTUM)
        theirs = []
        for _ in range(3):
            opt.zero_grad()
            loss = lm(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            theirs.append(float(loss))
        np.testing.assert_allclose(ours, theirs, rtol=1e-4)
        wte = dict(lm.named_parameters())["transformer.wte.weight"].detach().numpy()
        np.testing.assert_allclose(
            sess.parameters()[found["transformer.wte.weight"]], wte, rtol=1e-4, atol=1e-6
        )
        report(
            "a tied head (GPT-2)", f"{exporter}: {len(art.parameters)} / {len(found)} tensors, losses {ours}"
        )
        ort = pytest.importorskip("onnxruntime", reason="onnxruntime is optional")
        sess.export_onnx(str(tmp_path / f"p-{exporter}.onnx"))  # one token table, read in both places
        runner = ort.InferenceSession(str(tmp_path / f"p-{exporter}.onnx"))
        for batch in (1, 2, 3):
            xb = np.random.default_rng(batch).integers(1, exports.GPT2_VOCAB, (batch, exports.GPT2_SEQ))
            (got_b,) = runner.run(None, {"input_ids": xb})
            np.testing.assert_allclose(got_b, sess.run(xb), rtol=1e-4, atol=1e-5, err_msg=f"batch {batch}")
        untied = et.convert(path, loss=et.NextTokenLoss(), optimizer=et.SGD(lr=0.1), batch_size=2, untie=True)
        assert len(untied.parameters) == len(art.parameters) + 1


def test_what_stays_a_constant_says_why(tmp_path_factory):
    module, path = _export(tmp_path_factory, "masked", "torchscript", 17)
    roles = _convert(path).roles.entries
    by_value = {}
    proto = onnx.load(path)
    for t in proto.graph.initializer:
        a = onnx.numpy_helper.to_array(t)
        for buf in ("mean", "std", "mask"):
            if a.size == getattr(module, buf).numel() and np.array_equal(
                a.reshape(-1), getattr(module, buf).numpy().reshape(-1)
            ):
                by_value[buf] = roles[t.name]
    assert by_value["mean"].kind == by_value["std"].kind == "constant"
    assert by_value["mean"].role == "preprocessing of a graph input"
    assert by_value["mask"].kind == "constant" and by_value["mask"].role.startswith("a mask")
