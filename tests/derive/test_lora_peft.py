"""LoRA inserted by edgetrain into an exported base model follows PEFT's LoRA on the PyTorch model: tiny Hugging Face
models from config (BERT with a sequence-classification head, adapters on query and value; GPT-2 with its LM head,
adapters on c_attn, a Conv1D whose weight is [in, out]), exported without adapters (TorchScript, and dynamo), adapted
by edgetrain at the same layers as peft.get_peft_model. Both start from PEFT's initial A (B is zero), train three
steps on the same batches (SGD with momentum; AdamW), and end with the same losses and adapters; the merged export
run in onnxruntime gives merge_and_unload()'s output. GPT-2's head is its token table (tied): adapted too, the
merged export gives it its own merged weight (PEFT's merge changes the table too, unless the weight is cloned
first, as PEFT advises)."""

from __future__ import annotations

import copy
import importlib.util
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest

import edgetrain as et
from edgetrain.graph.sections import AdaptersSection

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install torch==2.13.0 (tools/test.sh does)"
)
if importlib.util.find_spec("transformers") is None:  # importing it would import torchvision: see exports
    pytest.skip("transformers is optional: pip install transformers==4.57.6", allow_module_level=True)
import exports  # noqa: E402  (needs torch, checked above)

exports.declare_torchvision_ops()  # peft imports transformers, which imports torchvision
peft = pytest.importorskip("peft", reason="peft is optional: pip install peft==0.17.1 (tools/test.sh does)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is optional")

nn = torch.nn
RANK, ALPHA, BATCH, STEPS = 4, 8, 4, 3
# exports.py's tiny models, their weights drawn 10x wider than Hugging Face's default (std 0.02): at 0.02 the
# gradients that reach an adapter's A are so small that three steps leave the queries' A unchanged in float32
WIDE = 0.2
BERT = dict(
    vocab_size=exports.BERT_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=32, num_labels=3, initializer_range=WIDE,
)  # fmt: skip
GPT2 = dict(
    vocab_size=exports.GPT2_VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, attn_implementation="eager",
    initializer_range=WIDE,
)  # fmt: skip
OPTIMIZERS = {
    "sgd": (lambda: et.SGD(lr=0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    "adamw": (
        lambda: et.AdamW(lr=1e-2, weight_decay=0.01),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
    ),
}


# model: (the family built and exported, edgetrain's target patterns, PEFT's target_modules). GPT-2's c_attn is a
# Conv1D (weight [in, out], a Gemm without transB in the export); "gpt2+head" adapts its head too, the token table
# read as a head (tied): the merged export gives the head its own merged weight and keeps the table as it was
MODELS = {
    "bert": ("bert", ["*query*", "*value*"], ["query", "value"]),
    "gpt2": ("gpt2", ["*c_attn*"], ["c_attn"]),
    "gpt2+head": ("gpt2", ["*c_attn*", "*lm_head*"], ["c_attn", "lm_head"]),
}


class Case:
    """One model: the base as exported, how to adapt it (edgetrain's patterns, PEFT's target_modules), its loss and
    batches."""

    def __init__(self, name: str, module: nn.Module):
        self.family, self.targets, self.peft_targets = MODELS[name]
        self.module = module
        self.loss = et.CrossEntropyLoss if self.family == "bert" else et.NextTokenLoss

    @staticmethod
    def build(family: str) -> nn.Module:
        import transformers

        torch.manual_seed(0)
        if family == "bert":
            module = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
        else:
            module = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
        exports.perturb(module.eval(), 2)  # LayerNorm scales and biases as a trained model's: not all alike
        return module

    def export(self, path: str, exporter: str) -> None:
        """The base model exported as test_trained_set and test_real_exports export it."""
        ids = torch.from_numpy(self.batch(99)[0])
        if self.family == "bert":
            opset = 17 if exporter == "torchscript" else None
            exports.export_module(
                self.module, ids, path, exporter=exporter, mode="eval", symbolic=True, input_name="input_ids",
                opset=opset,
            )  # fmt: skip
        else:
            exports.export_lm(self.module, ids, path, exporter=exporter)

    def batch(self, seed: int, n: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
        """Token ids >= 1 (0 is BERT's padding index) and the labels the loss takes."""
        rng = np.random.default_rng(seed)
        if self.family == "bert":
            x = rng.integers(1, exports.BERT_VOCAB, (n, exports.BERT_SEQ)).astype(np.int64)
            return x, rng.integers(0, 3, n).astype(np.int64)
        x = rng.integers(1, exports.GPT2_VOCAB, (n, exports.GPT2_SEQ)).astype(np.int64)
        return x, x

    def torch_loss(self, model: nn.Module, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        if self.family == "bert":
            logits = model(input_ids=torch.from_numpy(x)).logits
            return nn.functional.cross_entropy(logits, torch.from_numpy(y))
        return model(input_ids=torch.from_numpy(x), labels=torch.from_numpy(y)).loss

    def logits(self, model: nn.Module, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=torch.from_numpy(x)).logits.numpy()


_EXPORTS: dict[tuple[str, str], tuple[nn.Module, str]] = {}


def _base(tmp_path_factory, name: str, exporter: str) -> tuple[Case, str]:
    """The base model (no adapters) and its ONNX export, once per family and exporter in a session."""
    family = MODELS[name][0]
    if (family, exporter) not in _EXPORTS:
        case = Case(name, Case.build(family))
        path = str(tmp_path_factory.mktemp("peft") / f"{family}-{exporter}.onnx")
        case.export(path, exporter)
        _EXPORTS[family, exporter] = (case.module, path)
    module, path = _EXPORTS[family, exporter]
    return Case(name, module), path


def _peft_model(case: Case) -> nn.Module:
    """PEFT's LoRA on a copy of the base model, its A drawn from a seeded torch generator."""
    torch.manual_seed(7)
    config = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=case.peft_targets, lora_dropout=0.0, init_lora_weights=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Conv1D: "Setting fan_in_fan_out to True"
        return peft.get_peft_model(copy.deepcopy(case.module), config).eval()


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module path in the base model: PEFT's LoRA layer}."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    return {k.removeprefix(prefix): m for k, m in model.named_modules() if isinstance(m, LoraLayer)}


def _pair(art, layers: dict[str, nn.Module], prefix: str) -> dict[str, object]:
    """{PEFT module path: edgetrain's LoraModule}, matched by the base weight each adapts (its values, in either
    layout: a Linear's weight reaches the MatMul transposed, a Conv1D's as it is). The adapters are named after the
    layer's module path (prefix: the exported wrapper's), where the exporter named the weight onnx::MatMul_336 or
    val_58 too, and for the tied head, whose weight is the token table."""
    pairs = {}
    weights = art.inference.initializers
    for m in art.section(AdaptersSection).modules:
        w = weights[m.weight]
        hits = [
            path
            for path, layer in layers.items()
            if (v := layer.base_layer.weight.detach().numpy()).size == w.size
            and (np.array_equal(v, w) or np.array_equal(v.T, w))
        ]
        assert len(hits) == 1, (m.weight, hits)
        assert (m.A, m.B) == (f"{prefix}{hits[0]}.lora_A", f"{prefix}{hits[0]}.lora_B"), hits[0]
        pairs[hits[0]] = m
    return pairs


def _convert(case: Case, path: str, optimizer: str):
    return et.convert(
        path,
        loss=case.loss(),
        optimizer=OPTIMIZERS[optimizer][0](),
        batch_size=BATCH,
        adapters=et.LoRA(rank=RANK, alpha=ALPHA, targets=case.targets),
    )


CASES = [
    pytest.param(model, exporter, optimizer, id=f"{model}-{exporter}-{optimizer}", marks=marks)
    for model in MODELS
    for exporter, optimizer, marks in (
        ("torchscript", "sgd", ()),
        ("torchscript", "adamw", ()),
        ("dynamo", "sgd", pytest.mark.slow),
        ("dynamo", "adamw", pytest.mark.slow),
    )
    if model != "gpt2+head" or optimizer == "sgd"
]


@pytest.mark.parametrize("model,exporter,optimizer", CASES)
def test_lora_follows_peft(tmp_path_factory, report, model, exporter, optimizer):
    case, path = _base(tmp_path_factory, model, exporter)
    art = _convert(case, path, optimizer)
    theirs_model = _peft_model(case)
    layers = _lora_layers(theirs_model)
    pairs = _pair(art, layers, "" if case.family == "bert" else "lm.")  # exports.LogitsOf(lm)
    assert sorted(pairs) == sorted(layers), "edgetrain adapts other layers than PEFT"
    assert sorted(art.parameters) == sorted(p for m in pairs.values() for p in (m.A, m.B))
    initial = {}
    for p, m in pairs.items():  # PEFT's initial adapters: lora_A.weight is A^T, lora_B.weight (zero) B^T
        initial[m.A] = layers[p].lora_A["default"].weight.detach().numpy().T.copy()
        initial[m.B] = layers[p].lora_B["default"].weight.detach().numpy().T.copy()
        assert initial[m.A].shape == art.initial[m.A].shape and not np.any(initial[m.B])
        assert layers[p].scaling["default"] == m.scale == ALPHA / RANK
    saved = tmp_path_factory.mktemp("artifact") / "adapted.etrain"
    art.save(saved)  # the adapted layers as the device reads them back (a tied head's own merged weight too)
    sess = et.TrainingSession(str(saved))
    sess.set_parameters(initial)
    batches = [case.batch(seed) for seed in range(STEPS)]
    ours = [sess.train_step(x, y) for x, y in batches]
    opt = OPTIMIZERS[optimizer][1]([p for p in theirs_model.parameters() if p.requires_grad])
    theirs = []
    for x, y in batches:
        opt.zero_grad()
        loss = case.torch_loss(theirs_model, x, y)
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    worst, update = _adapters_agree(sess.parameters(), initial, pairs, layers)
    merged = _merged(sess, case, theirs_model, tmp_path_factory, path)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    report(
        "LoRA against PEFT, 3 steps: max differences (relative loss / adapter / relative update / merged output)",
        f"{model:9s} {exporter:11s} {optimizer:5s}: {loss_diff:.1e} / {worst:.1e} / {update:.1e} / {merged:.1e}",
    )


def _adapters_agree(got, initial, pairs, layers) -> tuple[float, float]:
    """Every trained A and B equals PEFT's (transposed), and so does its update from the common start: (the largest
    difference, the largest difference of an update relative to its size)."""
    worst = update = 0.0
    for p, m in pairs.items():
        for mine, module in ((m.A, layers[p].lora_A), (m.B, layers[p].lora_B)):
            want = module["default"].weight.detach().numpy().T
            np.testing.assert_allclose(got[mine], want, rtol=1e-4, atol=1e-6, err_msg=mine)
            worst = max(worst, float(np.abs(got[mine] - want).max()))
            # the updates themselves, not only the values they moved by a little
            theirs_update, ours_update = want - initial[mine], got[mine] - initial[mine]
            moved = float(np.abs(theirs_update).max())
            assert moved > 1e-5, f"{mine} hardly trained ({moved:.1e})"
            update = max(update, float(np.abs(ours_update - theirs_update).max()) / moved)
    assert update < 1e-3, f"the adapters' updates differ by {update:.1e} of their size"
    return worst, update


def _merged(sess, case: Case, peft_model: nn.Module, tmp_path_factory, source: str) -> float:
    """The merged export in onnxruntime against PEFT's merge_and_unload() and the unmerged model it trained; the
    largest difference. A tied weight (GPT-2's head, its token table) is cloned before PEFT merges, as PEFT advises:
    else its merge changes the token table too. The merged export keeps the table bit for bit."""
    path = tmp_path_factory.mktemp("merged") / "merged.onnx"
    sess.export_onnx(str(path))
    runner = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    xs = [case.batch(50 + n, n)[0] for n in (1, BATCH)]
    trained = [case.logits(peft_model, x) for x in xs]
    counts = Counter(id(t) for _, t in peft_model.named_parameters(remove_duplicate=False))
    for layer in _lora_layers(peft_model).values():
        if counts[id(layer.base_layer.weight)] > 1:
            layer.base_layer.weight = nn.Parameter(
                layer.base_layer.weight.detach().clone(), requires_grad=False
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged_model = peft_model.merge_and_unload().eval()
    worst = 0.0
    for x, unmerged in zip(xs, trained):
        (got,) = runner.run(None, {"input_ids": x})
        want = case.logits(merged_model, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"batch {len(x)}")
        np.testing.assert_allclose(got, unmerged, rtol=1e-4, atol=1e-4, err_msg=f"batch {len(x)}, unmerged")
        assert np.abs(want - case.logits(case.module, x)).max() > 1e-3  # the adapters changed the model
        worst = max(worst, float(np.abs(got - want).max()))
    written, base = (_initializers(p) for p in (path, source))
    modules = sess.artifact.record.section(AdaptersSection).modules
    assert [m.node for m in modules if m.own] == [
        m.node for m in modules if "lm_head" in m.A
    ]  # the tied head
    for m in modules:
        assert not m.own or written[m.weight].tobytes() == base[m.weight].tobytes(), m.weight
    return worst


def _initializers(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
