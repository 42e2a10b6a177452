"""Losses in the model's own layout: CrossEntropyLoss over a class axis other than 1 (a language model's
[batch, positions, vocabulary]) and NextTokenLoss (position t predicts token t + 1, padding -100 ignored), checked
against PyTorch's cross-entropy on the flattened logits and Hugging Face's GPT-2 loss, on real exports; the class
axis "auto" reads the graph; out-of-range labels name the class axis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgetrain as et

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
import exports  # noqa: E402  (needs torch, checked above)

nn = torch.nn
ROOT = Path(__file__).resolve().parents[2]
B, T, V, D = 3, 6, 11, 8
LR, MOMENTUM = 0.1, 0.9


class TinyLM(nn.Module):
    """Embedding -> each position mixed with the one before (a causal shift) -> tanh -> a Linear head: logits
    [batch, positions, vocabulary], as a language model writes them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.mix = nn.Linear(2 * D, D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        h = self.embed(ids)
        before = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        h = torch.tanh(self.mix(torch.cat([h, before], dim=-1)))
        return self.head(h)


def _export(tmp_path, exporter: str) -> tuple[nn.Module, str]:
    torch.manual_seed(0)
    model = TinyLM().eval()
    path = str(tmp_path / f"lm-{exporter}.onnx")
    ids = torch.randint(0, V, (B, T))
    exports.export_module(model, ids, path, exporter=exporter, mode="eval", symbolic=True, input_name="ids")
    return model, path


def _ids(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (B, T))


def _sgd_steps(model: nn.Module, loss_of, steps: int) -> tuple[list[float], dict[str, np.ndarray]]:
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, {k: v.detach().numpy() for k, v in model.named_parameters()}


def _follow(tmp_path, exporter, loss, torch_loss, y):
    """edgetrain's 3 steps against PyTorch's, from the same weights: losses and every parameter."""
    model, path = _export(tmp_path, exporter)
    names = exports.map_parameters(model, __import__("onnx").load(path))
    art = et.convert(path, loss=loss, optimizer=et.SGD(lr=LR, momentum=MOMENTUM), batch_size=B)
    assert sorted(art.parameters) == sorted(names.values())
    sess = et.TrainingSession(art)
    ids = _ids()
    ours = [sess.train_step(ids, y) for _ in range(3)]
    theirs, params = _sgd_steps(model, lambda m: torch_loss(m(torch.from_numpy(ids))), 3)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    got = sess.parameters()
    for t, o in names.items():
        mine = got[o] if got[o].shape == params[t].shape else got[o].T  # a Linear's weight, stored for MatMul
        np.testing.assert_allclose(mine, params[t], rtol=1e-4, atol=1e-6, err_msg=t)
    return art


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_cross_entropy_over_the_last_axis_follows_pytorch(tmp_path, exporter):
    labels = np.random.default_rng(2).integers(0, V, (B, T))
    labels[0, 2] = -100  # ignored, as PyTorch's default ignore_index

    def torch_loss(logits):
        return nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(labels).reshape(-1))

    loss = et.CrossEntropyLoss(class_axis=-1, ignore_index=-100)
    art = _follow(tmp_path, exporter, loss, torch_loss, labels)
    assert art.loss_config["class_axis"] == -1


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_next_token_loss_follows_pytorch(tmp_path, exporter):
    ids = _ids()

    def torch_loss(logits):
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, V), torch.from_numpy(ids)[:, 1:].reshape(-1)
        )

    _follow(tmp_path, exporter, et.NextTokenLoss(), torch_loss, ids)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_next_token_loss_equals_hugging_faces_gpt2_loss(tmp_path, exporter):
    lm, ids = exports.gpt2()
    labels = ids.clone()
    labels[1, 5:] = -100  # padding
    path = str(tmp_path / "gpt2.onnx")
    exports.export_lm(lm, ids, path, exporter=exporter)
    art = et.convert(path, loss=et.NextTokenLoss(), optimizer=et.SGD(lr=0.0), batch_size=2)
    ours = et.TrainingSession(art).train_step(ids.numpy(), labels.numpy())
    with torch.no_grad():
        theirs = float(lm(input_ids=ids, labels=labels).loss)
    assert abs(ours - theirs) <= 1e-5 * abs(theirs), (ours, theirs)


def test_the_class_axis_auto_reads_the_graph(tmp_path):
    _, path = _export(tmp_path, "torchscript")
    loss = et.CrossEntropyLoss(class_axis="auto")
    art = et.convert(path, loss=loss, optimizer=et.SGD(lr=0.1), batch_size=B)
    assert art.loss_config["class_axis"] == 2
    assert any("class axis 2" in n and ("MatMul" in n or "Gemm" in n) for n in art.notes), art.notes
    cnn = et.convert(
        str(ROOT / "edgetrain" / "data" / "digits_lenet.onnx"),
        loss=et.CrossEntropyLoss(class_axis="auto"),
        optimizer=et.SGD(lr=0.1),
        batch_size=2,
    )
    assert "class_axis" not in cnn.loss_config and any("class axis 1" in n for n in cnn.notes), cnn.notes


def test_a_label_out_of_range_names_the_class_axis(tmp_path):
    _, path = _export(tmp_path, "torchscript")
    sess = et.TrainingSession(
        et.convert(path, loss=et.NextTokenLoss(), optimizer=et.SGD(lr=0.1), batch_size=B)
    )
    ids = _ids()
    bad = ids.copy()
    bad[1, 3] = V  # one past the vocabulary
    with pytest.raises(
        et.FeedError, match=rf"label {V} is out of range: the model has {V} classes .*axis 2 "
    ):
        sess.train_step(ids, bad)
    sess.train_step(ids, np.where(bad == V, -100, bad))  # the ignore index is allowed


def test_the_command_line_converts_with_next_token(tmp_path):
    _, path = _export(tmp_path, "torchscript")
    out = tmp_path / "lm.etrain"
    run = [sys.executable, "-m", "edgetrain.cli", "convert", path, "-o", str(out), "--batch-size", str(B)]
    proc = subprocess.run([*run, "--loss", "next-token"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert et.TrainingSession(str(out)).artifact.record.loss.type == "NextTokenLoss"
    proc = subprocess.run(
        [*run, "--loss", "mse", "--class-axis", "-1"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2 and "--class-axis applies to --loss cross-entropy only" in proc.stderr
