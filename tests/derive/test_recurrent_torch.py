"""Recurrent classifiers exported from PyTorch 2.13 (embedding + nn.LSTM / nn.GRU / nn.RNN + linear head; 1 and 2
layers; uni- and bidirectional; batch_first both ways; both exporters) train as PyTorch trains them: 3 SGD steps
(momentum, weight decay) give PyTorch's float64 losses and parameters to 1e-4; onnxruntime running the emitted
training step gives the same loss; the personalized export keeps the compact recurrent nodes, and onnxruntime
running it reproduces sess.run. Head-only fine-tuning builds no recurrent backward at all."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnx
import pytest

import edgetrain as et

torch = pytest.importorskip("torch", reason="the PyTorch references need torch: pip install torch==2.13.0")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is optional: pip install onnxruntime")
import exports  # noqa: E402  (needs torch, checked above)
from torch import nn  # noqa: E402

VOCAB, EMBED, HIDDEN, CLASSES, STEPS_T = 20, 8, 6, 3, 5
BATCH = 4
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4
CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
# ONNX gate order from torch's: LSTM torch (i, f, g, o) -> ONNX (i, o, f, c); GRU torch (r, z, n) -> ONNX (z, r, h)
GATE_ORDER = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2), "rnn": (0,)}
RECURRENT_OPS = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}


class SeqClassifier(nn.Module):
    """tokens [N, T] -> logits [N, classes], from the last step's output ("last") or the final states ("state")."""

    def __init__(self, cell: str, layers: int, bidirectional: bool, batch_first: bool, head: str = "last"):
        super().__init__()
        self.cell, self.batch_first, self.head = cell, batch_first, head
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.rnn = CELLS[cell](
            EMBED, HIDDEN, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first
        )
        self.dirs = 2 if bidirectional else 1
        self.fc = nn.Linear(HIDDEN * self.dirs, CLASSES)

    def forward(self, tokens):
        e = self.emb(tokens)
        if not self.batch_first:
            e = e.transpose(0, 1)
        y, state = self.rnn(e)
        if self.head == "last":
            last = y[:, -1] if self.batch_first else y[-1]
        else:
            h = state[0] if self.cell == "lstm" else state
            last = h[-self.dirs :].transpose(0, 1).reshape(tokens.shape[0], -1)
        return self.fc(last)


def _case_id(case) -> str:
    cell, layers, bi, bf, head, exporter = case
    return f"{cell}-{layers}l-{'bi' if bi else 'uni'}-{'bf' if bf else 'tf'}-{head}-{exporter}"


CASES = [
    (cell, layers, bi, bf, "last", exporter)
    for cell in CELLS
    for layers in (1, 2)
    for bi in (False, True)
    for bf in (True, False)
    for exporter in ("torchscript", "dynamo")
] + [(cell, 1, True, True, "state", exporter) for cell in CELLS for exporter in ("torchscript", "dynamo")]
QUICK = {("lstm", 2, True, True, "last", "torchscript"), ("gru", 1, False, False, "state", "torchscript")}
QUICK |= {("rnn", 1, True, True, "state", "torchscript")}


def _params(cases):
    return [
        pytest.param(*c, id=_case_id(c), marks=() if c in QUICK else pytest.mark.slow)
        for c in cases + [q for q in sorted(QUICK) if q not in cases]
    ]


def _build(cell, layers, bi, bf, head, seed=0) -> SeqClassifier:
    torch.manual_seed(seed)
    m = SeqClassifier(cell, layers, bi, bf, head).eval()
    with torch.no_grad():  # biases away from torch's uniform init so that no two tensors hold equal values
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return m


def _export(tmp_path, module, exporter: str) -> tuple[str, int | None]:
    """The model exported as users do: TorchScript with a symbolic batch, dynamo with the example's batch."""
    path = tmp_path / f"model-{exporter}.onnx"
    example = torch.randint(0, VOCAB, (BATCH, STEPS_T), generator=torch.Generator().manual_seed(0))
    exports.export_module(
        module, example, path, exporter=exporter, mode="eval", symbolic=exporter == "torchscript"
    )
    return str(path), None if exporter == "torchscript" else BATCH


def _data(seed: int, batch: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (batch, STEPS_T)).astype(np.int64), rng.integers(0, CLASSES, batch)


# ---- torch parameters -> the ONNX tensors that hold them ---------------------------------------------------------
Packer = Callable[[dict[str, np.ndarray]], np.ndarray]


def _gates(w: np.ndarray, cell: str) -> np.ndarray:
    """torch's gate blocks (rows) in ONNX's order."""
    blocks = np.split(w, len(GATE_ORDER[cell]), axis=0)
    return np.concatenate([blocks[k] for k in GATE_ORDER[cell]], axis=0)


def _candidates(module: SeqClassifier) -> dict[str, Packer]:
    """Every way an exporter holds torch's parameters: each one as it is or transposed, and per recurrent layer
    the ONNX W, R and B (directions stacked, gates reordered, B = [b_ih, b_hh])."""
    cell = module.cell
    out: dict[str, Packer] = {}
    for name, p in module.named_parameters():
        out[name] = lambda t, n=name: t[n]
        if p.dim() == 2:
            out[f"{name}^T"] = lambda t, n=name: t[n].T
    sfx = [""] + (["_reverse"] if module.dirs == 2 else [])
    for k in range(module.rnn.num_layers):
        for part, src in (("W", "weight_ih"), ("R", "weight_hh")):
            out[f"rnn.{part}_l{k}"] = lambda t, k=k, src=src: np.stack(
                [_gates(t[f"rnn.{src}_l{k}{s}"], cell) for s in sfx]
            )
        out[f"rnn.B_l{k}"] = lambda t, k=k: np.stack(
            [
                np.concatenate(
                    [_gates(t[f"rnn.bias_ih_l{k}{s}"], cell), _gates(t[f"rnn.bias_hh_l{k}{s}"], cell)]
                )
                for s in sfx
            ]
        )
    return out


def _torch_values(module: nn.Module) -> dict[str, np.ndarray]:
    return {n: p.detach().numpy() for n, p in module.named_parameters()}


def _map(module: SeqClassifier, proto: onnx.ModelProto) -> dict[str, Packer]:
    """ONNX float initializer -> how to compute it from torch's parameters (by value: names differ by exporter)."""
    inits = exports.initializers(proto)
    values = _torch_values(module)
    found: dict[str, Packer] = {}
    for pack in _candidates(module).values():
        v = pack(values).astype(np.float32)
        for name, init in inits.items():
            if init.shape == v.shape and init.dtype == np.float32 and np.array_equal(init, v):
                found[name] = pack
    n_torch = sum(p.numel() for p in module.parameters())
    n_found = sum(int(inits[n].size) for n in found)
    assert n_found == n_torch, f"mapped {n_found} of {n_torch} torch parameter values: {sorted(found)}"
    return found


# ---- the cases ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell,layers,bi,bf,head,exporter", _params(CASES))
def test_three_steps_follow_pytorch(tmp_path, report, cell, layers, bi, bf, head, exporter):
    module = _build(cell, layers, bi, bf, head)
    path, _ = _export(tmp_path, module, exporter)
    proto = onnx.load(path)
    packers = _map(module, proto)
    art = et.convert(
        path,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
        trainable=sorted(packers),
        batch_size=BATCH,
    )
    assert set(art.parameters) == set(packers)
    x, y = _data(1)

    # onnxruntime runs the emitted training step (the fused backward ops as ONNX functions in standard ops)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    rt = ort.InferenceSession(art.training_onnx().SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {proto.graph.input[0].name: x, art.target: y, art.lr: np.asarray(LR, np.float32)}
    (ort_loss,) = rt.run([art.loss], feeds)

    art.save(tmp_path / "model.etrain")
    sess = et.TrainingSession(tmp_path / "model.etrain")
    ref = _build(cell, layers, bi, bf, head).double()
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    worst, seconds, t_torch = 0.0, 0.0, 0.0
    for step in range(3):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(xt), yt)
        loss.backward()
        opt.step()
        t_torch += time.perf_counter() - t0
        t0 = time.perf_counter()
        ours = sess.train_step(x, y)
        seconds += time.perf_counter() - t0
        assert ours == pytest.approx(loss.item(), rel=1e-4), f"loss at step {step}"
        if step == 0:
            assert float(ort_loss) == pytest.approx(ours, rel=1e-5), "onnxruntime's training step"
        after, want_all = sess.parameters(), _torch_values(ref)
        for name, pack in packers.items():
            want = pack(want_all)
            np.testing.assert_allclose(
                after[name], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"{name} step {step}"
            )
            worst = max(worst, float(np.max(np.abs(after[name] - want) / (np.abs(want) + 1e-3))))
    report(
        "recurrent models against PyTorch (3 SGD steps, batch 4, T 5)",
        f"{_case_id((cell, layers, bi, bf, head, exporter)):36s} worst rel diff {worst:.1e}   "
        f"step {1e3 * seconds / 3:6.2f} ms (PyTorch {1e3 * t_torch / 3:6.2f} ms)",
    )

    # the personalized export: onnxruntime reproduces sess.run; the recurrent nodes stay compact
    sess.export_onnx(tmp_path / "personalized.onnx")
    out = onnx.load(str(tmp_path / "personalized.onnx"))
    ops = [n.op_type for n in out.graph.node]
    assert ops.count(RECURRENT_OPS[cell]) == [n.op_type for n in proto.graph.node].count(RECURRENT_OPS[cell])
    inits = exports.initializers(out)
    for name, value in sess.parameters().items():
        np.testing.assert_array_equal(inits[name], value, err_msg=name)
    rt = ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x2, _ = _data(2)
    (got,) = rt.run(None, {out.graph.input[0].name: x2})
    want = sess.run(x2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("cell", list(CELLS))
def test_head_only_builds_no_recurrent_backward(tmp_path, cell):
    """Only the classifier after the recurrence trains: the step holds no LSTMGrad/GRUGrad/RNNGrad (nor any
    gradient of the embedding), the recurrent weights stay as exported, and the head follows PyTorch."""
    module = _build(cell, 2, True, True, "last")
    path, _ = _export(tmp_path, module, "torchscript")
    art = et.convert(
        path,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
        trainable=["fc.*"],
        batch_size=BATCH,
    )
    assert sorted(art.parameters) == ["fc.bias", "fc.weight"]
    ops = {n.op_type for n in art.graph.nodes}
    assert not ops & {"LSTMGrad", "GRUGrad", "RNNGrad", "ScatterND", "ScatterElements"}, ops
    art.save(tmp_path / "head.etrain")
    sess = et.TrainingSession(tmp_path / "head.etrain")
    ref = _build(cell, 2, True, True, "last").double()
    opt = torch.optim.SGD(ref.fc.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    x, y = _data(3)
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        assert sess.train_step(x, y) == pytest.approx(loss.item(), rel=1e-4)
    np.testing.assert_allclose(
        sess.parameters()["fc.weight"], ref.fc.weight.detach().numpy(), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize(
    "cell", [pytest.param(c, marks=() if c == "rnn" else pytest.mark.slow) for c in CELLS]
)
def test_fixed_batch_dynamo_export_trains_at_another_batch(tmp_path, cell):
    """The dynamo exporter fixes the example's batch into the recurrent nodes' zero initial states ([D, 4, H]
    constants) and, for nn.RNN, which it unrolls, folds the first step's b_hh into a [1, 4, H] constant. Converted
    at batch 8, the states are made for the batch, the folded constant reads b_hh again (so it trains there too),
    and 3 steps at batch 8 follow PyTorch."""
    module = _build(cell, 2, True, True, "last")
    path, fixed = _export(tmp_path, module, "dynamo")
    assert fixed == BATCH
    packers = _map(module, onnx.load(path))
    art = et.convert(
        path,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
        trainable=sorted(packers),
        batch_size=2 * BATCH,
    )
    said = "\n".join(art.notes)
    assert "re-batched" in said
    undone = "broadcast" if cell == "rnn" else "initial state"
    assert undone in said and (cell != "rnn" or "rnn.bias_hh_l0" in said), said
    from edgetrain.derive.check import check

    checked = "\n".join(check(path).notes)  # `edgetrain check` reads the model as convert does, and says so
    assert undone in checked, checked
    art.save(tmp_path / "b8.etrain")
    sess = et.TrainingSession(tmp_path / "b8.etrain")
    ref = _build(cell, 2, True, True, "last").double()
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    x, y = _data(4, batch=2 * BATCH)
    for step in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        assert sess.train_step(x, y) == pytest.approx(loss.item(), rel=1e-4), f"step {step}"
    want_all = _torch_values(ref)
    for name, pack in packers.items():
        want = pack(want_all)
        np.testing.assert_allclose(sess.parameters()[name], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_constant_equal_to_a_one_valued_parameter_is_not_refolded():
    """Only a parameter with at least two distinct values identifies a folded copy: zeros stay zeros even when a
    bias is all zeros."""
    from edgetrain.core.ir import Graph, Node, TensorInfo
    from edgetrain.derive.params import find_roles
    from edgetrain.derive.ties import refold_copies

    f32 = np.float32
    inits = {
        "w": np.ones((3, 2), f32),
        "b": np.zeros(2, f32),  # one value: zeros elsewhere are not its copies
        "w2": np.eye(2, dtype=f32),
        "b2": np.array([0.5, -1.0], f32),
        "zeros": np.zeros((4, 2), f32),
        "copy": np.tile(np.array([0.5, -1.0], f32), (4, 1)),
    }
    nodes = [
        Node("Gemm", ("x", "w", "b"), ("h",), name="fc"),
        Node("MatMul", ("h", "w2"), ("h1",), name="fc2"),
        Node("Add", ("h1", "b2"), ("h2",), name="fc2_bias"),
        Node("Add", ("h2", "zeros"), ("h3",), name="add_zeros"),
        Node("Add", ("h3", "copy"), ("y",), name="add_copy"),
    ]
    values = {"x": TensorInfo(np.dtype(f32), (4, 3))}
    g = Graph(nodes, ["x"], ["y"], inits, values, opset=18)
    roles = find_roles(g)
    assert {"w", "b", "b2"} <= set(roles.parameters), roles.parameters
    out, notes = refold_copies(g, roles)
    assert "zeros" in out.initializers and "copy" not in out.initializers
    (refold,) = [n for n in out.nodes if n.outputs == ("copy",)]
    assert refold.op_type == "Expand" and refold.inputs[0] == "b2"
    assert len(notes) == 1 and "'copy'" in notes[0] and "'b2'" in notes[0]
