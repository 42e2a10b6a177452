"""When the author knows best: edgetrain.torch_export writes a parameter manifest into the model (each initializer
with its named_parameters() name, transposed, reshaped or tied copies included, and what the author froze), and
convert trains exactly the parameters that require grad, by their author's names; a manifest also comes as a file
(--parameters); a bad one is refused, naming what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import edgetrain as et

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
import exports  # noqa: E402  (needs torch, checked above)
import families  # noqa: E402

import edgetrain.torch_export as tx  # noqa: E402
from edgetrain.derive.manifest import MANIFEST_KEY  # noqa: E402

nn = torch.nn
ROOT = Path(__file__).resolve().parents[2]
BATCH = 4
EXPORTERS = ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]


def _convert(path, **kw):
    return et.convert(
        str(path), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.05, momentum=0.9), batch_size=BATCH, **kw
    )


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_author_froze_the_base_and_the_adapters_train_by_their_names(tmp_path, exporter):
    torch.manual_seed(0)
    model = families.LoRAClassifier().eval()  # peft's way: the base frozen
    x = families.example("lora", BATCH)
    manifest = tx.export(model, (torch.from_numpy(x),), tmp_path / "lora.onnx", exporter=exporter)
    assert sorted(manifest["parameters"].values()) == sorted(
        k for k, p in model.named_parameters() if p.requires_grad
    )
    assert sorted(manifest["frozen"].values()) == sorted(
        k for k, p in model.named_parameters() if not p.requires_grad
    )
    art = _convert(tmp_path / "lora.onnx")
    assert sorted(art.roles.entries[p].author for p in art.parameters) == sorted(
        manifest["parameters"].values()
    )
    # the saved model holds the real weights, not the probes
    inits = {
        t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(tmp_path / "lora.onnx").graph.initializer
    }
    for name, who in manifest["parameters"].items():
        real = dict(model.named_parameters())[who].detach().numpy()
        assert np.array_equal(inits[name].reshape(-1), real.reshape(-1)) or np.array_equal(
            inits[name].T, real
        ), who
    # three steps follow PyTorch training the adapters only
    y = np.random.default_rng(1).integers(0, 5, BATCH)
    sess = et.TrainingSession(art)
    ours = [sess.train_step(x, y) for _ in range(3)]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    theirs = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs.append(float(loss))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    # patterns match the author's names, which the exporter dropped from the initializers
    only_a = _convert(tmp_path / "lora.onnx", trainable="*lora_A*")
    assert sorted(only_a.roles.entries[p].author for p in only_a.parameters) == [
        "fc1.lora_A.weight",
        "fc2.lora_A.weight",
    ]


def test_a_tied_head_is_one_parameter_in_the_manifest(tmp_path):
    lm, ids = exports.gpt2()
    with exports.traceable_masks("torchscript"):
        manifest = tx.export(
            exports.LogitsOf(lm).eval(), (ids,), tmp_path / "gpt2.onnx", input_names=["input_ids"]
        )
    wte = [i for i, who in manifest["parameters"].items() if who == "lm.transformer.wte.weight"]
    assert len(wte) == 2  # the table and its transposed copy as the head
    art = et.convert(
        str(tmp_path / "gpt2.onnx"), loss=et.NextTokenLoss(), optimizer=et.SGD(lr=0.1), batch_size=2
    )
    assert len(art.parameters) == len(dict(lm.named_parameters()))
    assert any(n.startswith("tied:") for n in art.notes)


def test_batchnorm_stays_a_node_and_trains_its_weights(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    )
    model.eval()
    manifest = tx.export(model, (torch.randn(2, 3, 8, 8),), tmp_path / "bn.onnx")
    assert sorted(manifest["parameters"].values()) == sorted(dict(model.named_parameters()))
    art = _convert(tmp_path / "bn.onnx")
    assert {art.roles.entries[p].author for p in art.parameters} == set(dict(model.named_parameters()))
    assert any(n.op_type == "BatchNormalization" for n in art.inference.nodes)


def test_a_folded_batchnorm_is_refused_with_the_way_out(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()

    plain = tx._export

    def folded(
        module, args, **kw
    ):  # an exporter that folds BatchNorm into the Conv, as dynamo's optimizer can
        return plain(exports.fold_batchnorm(module), args, **kw)

    import unittest.mock as mock

    with (
        mock.patch.object(tx, "_export", folded),
        pytest.raises(et.ModelError, match="exporter='torchscript'"),
    ):
        tx.export(model, (torch.randn(2, 3, 8, 8),), tmp_path / "folded.onnx")


def test_a_manifest_file_says_what_trains(tmp_path):
    torch.manual_seed(0)
    model = families.ViTish().eval()
    x = torch.from_numpy(families.example("vit", BATCH))
    path = tmp_path / "vit.onnx"
    exports.export_module(model, x, path, exporter="torchscript", mode="eval", symbolic=True)
    head = {t.name: t.name for t in onnx.load(path).graph.initializer if t.name.startswith("head.")}
    (tmp_path / "head.json").write_text(json.dumps({"version": 1, "parameters": head}))
    art = _convert(path, parameters=tmp_path / "head.json")
    assert sorted(art.parameters) == ["head.bias", "head.weight"]
    assert art.roles.entries["pos_embed"].role.endswith("(not in the manifest)")
    out = tmp_path / "vit.etrain"
    cmd = [sys.executable, "-m", "edgetrain.cli", "convert", str(path), "-o", str(out), "--batch-size", "4"]
    proc = subprocess.run(
        [*cmd, "--parameters", str(tmp_path / "head.json")], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(et.TrainingSession(str(out)).parameter_names) == ["head.bias", "head.weight"]


@pytest.mark.parametrize(
    "content,message",
    [
        ("not json", "not JSON"),
        (json.dumps({"version": 1}), "is not a parameter manifest"),
        (
            json.dumps({"parameters": {"no.such.tensor": "x"}}),
            "names 'no.such.tensor', which the model holds no",
        ),
        (json.dumps({"parameters": {"head.weight": 3}}), "'parameters' must map ONNX initializer names"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_fault(tmp_path, content, message):
    model = families.LoRAClassifier().eval()
    path = tmp_path / "m.onnx"
    exports.export_module(model, torch.randn(2, 12), path, exporter="torchscript", mode="eval", symbolic=True)
    m = onnx.load(path)
    onnx.helper.set_model_props(m, {MANIFEST_KEY: content})
    onnx.save(m, path)
    with pytest.raises(et.EdgeTrainError, match=message):
        _convert(path)
