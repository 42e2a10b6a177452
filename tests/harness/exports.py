"""Real PyTorch models (torchvision classifiers, a tiny Hugging Face BERT, two small conv nets) -> ONNX files
exported the way users export them, plus the map from each torch parameter to the ONNX initializer holding it.
Needs torch; torchvision, transformers and onnxscript (the dynamo exporter) only for the models that use them."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

nn = torch.nn

TORCHVISION = (
    "mobilenet_v2",
    "mobilenet_v3_small",
    "resnet18",
    "squeezenet1_1",
    "shufflenet_v2_x0_5",
    "efficientnet_b0",
    "mnasnet0_5",
    "regnet_y_400mf",
)
CUSTOM = ("normalized_cnn", "keyword_spotter")
BERT = "bert"
MODELS = TORCHVISION + CUSTOM + (BERT,)
# the classifier head's module path; every other model calls it "classifier"
HEADS = {"resnet18": "fc", "shufflenet_v2_x0_5": "fc", "regnet_y_400mf": "fc"}
# the dynamo exporter's optimizer folds these BERT embedding lookups (a Gather at constant indices) into constants:
# the position table always, the token-type table at a fixed batch. No initializer holds them: they cannot train
DYNAMO_FOLDED = ("bert.embeddings.position_embeddings.weight", "bert.embeddings.token_type_embeddings.weight")
BERT_VOCAB, BERT_SEQ = 100, 16
_DYNAMIC_EXAMPLE_BATCH = 2  # torch.export specializes a batch of 1 to a constant


class MappingError(AssertionError):
    """A torch parameter is held by no ONNX initializer, or by several (tied by the exporter)."""


@dataclass(frozen=True, eq=False)
class Export:
    """One exported model. module and reference are shared by every test: copy before changing them."""

    path: Path
    model: str
    exporter: str  # "torchscript" (dynamo=False) or "dynamo"
    mode: str  # torch.onnx.TrainingMode asked for: "preserve" or "eval"
    batch: int | None  # the export's fixed batch, None when symbolic
    module: nn.Module  # the torch model as exported (float32, eval mode)
    reference: nn.Module  # the module whose parameters the ONNX holds: module, or its BatchNorm-folded copy
    names: dict[str, str]  # reference parameter -> ONNX initializer holding it
    transposed: frozenset[str]  # reference parameters the ONNX stores transposed (Linear -> MatMul)
    sample_shape: tuple[int, ...]
    num_classes: int
    seconds: float  # how long the export took

    @property
    def folded(self) -> bool:
        return self.reference is not self.module

    def onnx(self) -> onnx.ModelProto:
        return onnx.load(str(self.path))

    def onnx_names(self, prefix: str = "") -> set[str]:
        """ONNX names of the reference parameters under module path prefix ('' for all)."""
        return {o for t, o in self.names.items() if not prefix or t.startswith(prefix + ".")}

    def head(self) -> str:
        return HEADS.get(self.model, "classifier")

    def data(self, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """A seeded random batch: inputs (float32, or int64 tokens >= 1 since 0 is BERT's padding_idx, whose
        embedding row PyTorch never updates) and int64 labels."""
        rng = np.random.default_rng(seed)
        if self.model == BERT:
            x = rng.integers(1, BERT_VOCAB, (batch, *self.sample_shape)).astype(np.int64)
        else:
            x = rng.standard_normal((batch, *self.sample_shape)).astype(np.float32)
        return x, rng.integers(0, self.num_classes, batch).astype(np.int64)

    def torch_reference(self) -> nn.Module:
        """A float64 copy of reference in eval mode whose parameters are exactly the ONNX initial values
        (for a folded export, the exporter's folded values rather than torch's own fold)."""
        ref = copy.deepcopy(self.reference).double().eval()
        inits = initializers(self.onnx())
        params = dict(ref.named_parameters())
        with torch.no_grad():
            for t_name, o_name in self.names.items():
                value = inits[o_name].T if t_name in self.transposed else inits[o_name]
                params[t_name].copy_(torch.from_numpy(value.astype(np.float64)))
        return ref


def logits(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's logits (Hugging Face models return an output record)."""
    out = module(x)
    return out.logits if hasattr(out, "logits") else out


# ---- optional packages ----------------------------------------------------------------------------------------
_TORCHVISION_OPS: list = []  # keeps the op schemas declared for torchvision alive


def declare_torchvision_ops() -> None:
    """Makes `import torchvision` work against the CPU torch wheel: torchvision 0.28's compiled ops link
    libtorch_cuda, so registering their fake kernels fails unless the op schemas exist. Declaring the two it
    registers at import is enough for the model definitions (no torchvision op runs in a classifier). A
    missing torchvision is left for pytest.importorskip to report."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TORCHVISION_OPS.append(lib)
        import torchvision  # noqa: F401, F811


# ---- models ---------------------------------------------------------------------------------------------------
class NormalizedCNN(nn.Module):
    """Input normalization as stored constants ((x - mean) * inv_std, buffers exported as initializers), then a
    small conv net."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.register_buffer("pixel_mean", torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
        self.register_buffer("pixel_inv_std", 1 / torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(self.features((x - self.pixel_mean) * self.pixel_inv_std))


class KeywordSpotter(nn.Module):
    """A 1-D conv keyword spotter over [batch, 40 mel bands, 98 frames]: Conv1d/BatchNorm1d/ReLU blocks
    (strided, dilated), average pooling, a Linear head."""

    def __init__(self, bands: int = 40, classes: int = 12):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(bands, 32, 3, padding=1),
            nn.BatchNorm1d(32),
            nn.ReLU(),
            nn.Conv1d(32, 32, 3, stride=2, padding=1),
            nn.BatchNorm1d(32),
            nn.ReLU(),
            nn.Conv1d(32, 48, 3, padding=2, dilation=2),
            nn.BatchNorm1d(48),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(48, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def build(model: str, seed: int = 0) -> tuple[nn.Module, tuple[int, ...], int]:
    """(module in eval mode with seeded, perturbed weights, per-sample input shape, classes)."""
    torch.manual_seed(seed)
    if model in TORCHVISION:
        module, shape, classes = _torchvision(model), (3, 64, 64), 10
    elif model == "normalized_cnn":
        module, shape, classes = NormalizedCNN(), (3, 32, 32), 10
    elif model == "keyword_spotter":
        module, shape, classes = KeywordSpotter(), (40, 98), 12
    elif model == BERT:
        module, shape, classes = _bert(), (BERT_SEQ,), 3
    else:
        raise KeyError(model)
    perturb(module, seed)
    return module.eval(), shape, classes


def _torchvision(name: str) -> nn.Module:
    declare_torchvision_ops()
    import torchvision

    return getattr(torchvision.models, name)(weights=None, num_classes=10)


def _bert() -> nn.Module:
    declare_torchvision_ops()  # transformers imports torchvision when it is installed
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=BERT_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(config)


def perturb(module: nn.Module, seed: int) -> None:
    """Adds seeded noise (5% of the mean magnitude, 0.02 for zeros) to every float parameter and buffer. The
    TorchScript exporter stores initializers of identical value once (fresh all-ones BatchNorm scales, zero
    biases), which would tie parameters that torch trains separately."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not t.dtype.is_floating_point:
                continue
            scale = float(t.abs().mean()) * 0.05 or 0.02
            t.add_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * scale)
            if name.endswith("running_var"):
                t.abs_().clamp_(min=1e-2)


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """A copy with each BatchNorm folded into the conv before it (torch.fx), as the exporters fold them."""
    from torch.fx.experimental.optimization import fuse

    return fuse(copy.deepcopy(module), inplace=True).eval()


# ---- exporting ------------------------------------------------------------------------------------------------
@functools.cache
def export(
    model: str,
    directory: str | Path,
    *,
    exporter: str = "torchscript",
    mode: str = "eval",
    batch: int | None = 1,
) -> Export:
    """Builds model, exports it into directory (cached by arguments for the session) and maps its parameters.
    exporter: "torchscript" or "dynamo"; mode: "preserve" or "eval" (TrainingMode); batch: the fixed batch of
    the export, or None for a symbolic one (dynamic_axes / dynamic_shapes). BERT's TorchScript export is opset
    17; every other export takes the exporter's default opset."""
    assert exporter in ("torchscript", "dynamo") and mode in ("preserve", "eval"), (exporter, mode)
    module, shape, classes = build(model)
    tag = "sym" if batch is None else f"b{batch}"
    path = Path(directory) / f"{model}-{exporter}-{mode}-{tag}.onnx"
    example = _example(model, shape, _DYNAMIC_EXAMPLE_BATCH if batch is None else batch)
    t0 = time.perf_counter()
    bert = model == BERT
    export_module(
        module,
        example,
        path,
        exporter=exporter,
        mode=mode,
        symbolic=batch is None,
        input_name="input_ids" if bert else "input",
        opset=17 if bert and exporter == "torchscript" else None,
    )
    seconds = time.perf_counter() - t0
    proto = onnx.load(str(path))
    reference, rtol = _reference(module, proto)
    absent = DYNAMO_FOLDED if model == BERT and exporter == "dynamo" else ()
    names, transposed = map_tensors(
        float_tensors(reference.named_parameters()), proto, rtol=rtol, absent=absent
    )
    return Export(
        path, model, exporter, mode, batch, module, reference, names, transposed, shape, classes, seconds
    )


def _example(model: str, shape: tuple[int, ...], batch: int) -> torch.Tensor:
    if model == BERT:
        return torch.randint(1, BERT_VOCAB, (batch, *shape), generator=torch.Generator().manual_seed(0))
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))


def export_module(
    module: nn.Module,
    x: torch.Tensor,
    path: str | Path,
    *,
    exporter: str,
    mode: str,
    symbolic: bool = False,
    input_name: str = "input",
    opset: int | None = None,
) -> None:
    """torch.onnx.export as a user calls it: one input, output "logits", the exporter's default opset unless
    given; a symbolic batch through dynamic_axes (TorchScript) or dynamic_shapes (dynamo)."""
    kwargs = dict(
        input_names=[input_name],
        output_names=["logits"],
        opset_version=opset,
        training=torch.onnx.TrainingMode.PRESERVE if mode == "preserve" else torch.onnx.TrainingMode.EVAL,
    )
    if exporter == "torchscript":
        kwargs["dynamo"] = False
        if symbolic:
            kwargs["dynamic_axes"] = {input_name: {0: "batch"}, "logits": {0: "batch"}}
    else:
        kwargs.update(dynamo=True, verbose=False)
        if symbolic:
            kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch")},)
    # both exporters warn (deprecation, opset conversion) and the dynamo one prints its progress on stdout
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), **kwargs)


def _reference(module: nn.Module, proto: onnx.ModelProto) -> tuple[nn.Module, float]:
    """(the module whose parameters the export holds, the tolerance to find them by value). An export without
    BatchNormalization nodes folded them into the convs: its weights are torch's fold up to float32 rounding.
    The dynamo exporter folds them whatever TrainingMode says, and keeps the conv's torch name on the folded
    weight (its fused bias is '<conv>.weight_bias'): the map checks values, never names alone."""
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    if not has_bn or any(n.op_type == "BatchNormalization" for n in proto.graph.node):
        return module, 0.0
    return fold_batchnorm(module), 1e-5


# ---- torch parameter -> ONNX initializer ------------------------------------------------------------------------
def initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def float_tensors(named) -> dict[str, np.ndarray]:
    """{name: numpy value} of the float tensors among (name, tensor) pairs."""
    return {n: t.detach().cpu().numpy() for n, t in named if t.dtype.is_floating_point}


def map_parameters(module: nn.Module, proto: onnx.ModelProto, *, rtol: float = 0.0) -> dict[str, str]:
    """torch parameter name -> the ONNX initializer holding it (see map_tensors)."""
    return map_tensors(float_tensors(module.named_parameters()), proto, rtol=rtol)[0]


def map_tensors(
    tensors: dict[str, np.ndarray], proto: onnx.ModelProto, *, rtol: float = 0.0, absent=()
) -> tuple[dict[str, str], frozenset[str]]:
    """({torch name: ONNX initializer name}, torch names stored transposed). Each tensor is found by its own name
    when that initializer holds its value, else by value (exactly, or within rtol for folded exports; a 2-D
    tensor may be stored transposed, as Linear weights feeding MatMul are). Raises MappingError when a tensor is
    held by no initializer (unless listed in absent) or by several, or two tensors share one initializer."""
    inits = initializers(proto)
    names, transposed = {}, set()
    for name, value in tensors.items():
        hits = _holders(name, value, inits, rtol)
        if not hits and name in absent:
            continue
        if len(hits) != 1:
            raise MappingError(_mapping_message(name, value, hits, inits))
        names[name], flipped = hits[0]
        if flipped:
            transposed.add(name)
    shared = [o for o, k in Counter(names.values()).items() if k > 1]
    if shared:
        owners = {o: sorted(t for t, x in names.items() if x == o) for o in shared}
        raise MappingError(f"torch tensors share ONNX initializers (tied by the exporter?): {owners}")
    return names, frozenset(transposed)


def _same(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    if a.shape != b.shape:
        return False
    if rtol == 0:
        return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(a).max(initial=0.0))))


def _holders(
    name: str, value: np.ndarray, inits: dict[str, np.ndarray], rtol: float
) -> list[tuple[str, bool]]:
    if name in inits and _same(value, inits[name], rtol):
        return [(name, False)]
    hits = [(k, False) for k, v in inits.items() if v.dtype.kind == "f" and _same(value, v, rtol)]
    if value.ndim == 2:
        hits += [(k, True) for k, v in inits.items() if v.dtype.kind == "f" and _same(value.T, v, rtol)]
    return hits


def _mapping_message(name: str, value: np.ndarray, hits, inits: dict[str, np.ndarray]) -> str:
    where = f"torch tensor '{name}' {list(value.shape)}"
    if hits:
        return f"{where} is held by several ONNX initializers: {[h for h, _ in hits]}"
    note = f" (the initializer named '{name}' holds other values: folded?)" if name in inits else ""
    return f"{where} is held by no ONNX initializer{note}"


# ---- a causal language model (Hugging Face's GPT-2, from a tiny config) -----------------------------------------
GPT2_VOCAB, GPT2_SEQ = 40, 8


def gpt2(seed: int = 0, *, batch: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """(a tiny GPT2LMHeadModel with random weights, its lm_head tied to wte as in every GPT-2; token ids)."""
    declare_torchvision_ops()  # transformers imports torchvision
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=GPT2_VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, attn_implementation="eager"
    )
    torch.manual_seed(seed)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, GPT2_VOCAB, (batch, GPT2_SEQ), generator=torch.Generator().manual_seed(seed + 1))
    return lm, ids


class LogitsOf(nn.Module):
    """A causal LM as exported for on-device training: token ids [batch, positions] -> logits [batch, positions,
    vocabulary] (no cache; the attention mask and positions spelled out, which the TorchScript exporter needs)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1])[None].expand_as(input_ids)
        mask = torch.ones_like(input_ids)
        return self.lm(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).logits


@contextlib.contextmanager
def traceable_masks(exporter: str):
    """transformers 4.57 builds its attention masks with vmap, which the TorchScript exporter cannot trace: its
    older mask function stands in while such an export runs."""
    import transformers.masking_utils as masks

    recent = masks.sdpa_mask
    if exporter == "torchscript":
        masks.sdpa_mask = masks.sdpa_mask_older_torch
    try:
        yield
    finally:
        masks.sdpa_mask = recent


def export_lm(
    lm: nn.Module, ids: torch.Tensor, path: str | Path, *, exporter: str, symbolic: bool = True
) -> None:
    """LogitsOf(lm) exported with its input named input_ids (see traceable_masks)."""
    with traceable_masks(exporter):
        export_module(
            LogitsOf(lm).eval(),
            ids,
            path,
            exporter=exporter,
            mode="eval",
            symbolic=symbolic,
            input_name="input_ids",
        )
