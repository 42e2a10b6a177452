"""The benchmark's workloads and issue 25's targets: configuration names -> Config records and target ratios.

Plain data with no imports beyond the standard library: the parent (tools/bench.py), the report and the tests all
read it, and so could a worker in onnxruntime-training's own virtual environment."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

TORCHVISION = ("mobilenet_v2", "mobilenet_v3_small", "resnet18", "efficientnet_b0")
# sequence classifiers (tools/bench/seqmodels.py): Embedding -> LSTM / GRU / 2-layer bidirectional LSTM -> Linear
RECURRENT = ("lstm", "gru", "bilstm2")
SEQ_LEN = 32  # tokens per sample (seqmodels.SEQ_LEN; this module imports nothing but the standard library)
# transformer-era image classifiers (tools/bench/imagemodels.py) on 3x32x32: a small ViT and a ConvNeXt-style net
IMAGE = ("vit", "convnext")
IMAGE_SIZE = 32  # imagemodels.IMAGE
# edgetrain runs twice: with the SGD (momentum, weight decay; PyTorch runs the same) and with plain SGD,
# the only optimizer onnxruntime-training 1.19.2 has, for the like-for-like ratio
RUNTIMES = ("edgetrain", "edgetrain_sgd", "ort", "torch")
RUNTIME_NAMES = {
    "edgetrain": "edgetrain (momentum)",
    "edgetrain_sgd": "edgetrain (plain SGD)",
    "ort": "onnxruntime-training (plain SGD)",
    "torch": "PyTorch eager",
}

# SGD as the issue sets it; onnxruntime-training 1.19.2 has no momentum or weight decay (plain SGD there)
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
EPOCH_SAMPLES = 256  # the personalization epoch: samples per epoch (at the configuration's batch)
BUDGET_S = 20.0  # a worker stops timing after this many seconds once it has MIN_STEPS steps
MIN_STEPS = 5


@dataclass(frozen=True)
class Config:
    name: str
    model: str  # "mlp", "lenet", a torchvision classifier, a RECURRENT or an IMAGE classifier
    batch: int
    head_only: bool = False  # train the classifier only (the rest frozen)
    epoch: bool = False  # the head-only epoch comparison (Trainer vs PyTorch) instead of per-step timing
    warmup: int = 30
    steps: int = 300
    default: bool = True  # in the default run (False: an extra measured when named)

    @property
    def family(self) -> str:
        if self.model in ("mlp", "lenet"):
            return self.model
        if self.model in RECURRENT:
            return "recurrent"
        return "image" if self.model in IMAGE else "torchvision"

    @property
    def runtimes(self) -> tuple[str, ...]:
        # onnxruntime-training has no data loading or epoch loop to compare the Trainer with
        return ("edgetrain", "torch") if self.epoch else RUNTIMES

    @property
    def describe(self) -> str:
        if self.family == "mlp":
            return f"MLP 784-128-10, batch {self.batch}"
        if self.family == "lenet":
            return f"LeNet, batch {self.batch}"
        how = "head-only" if self.head_only else "full"
        if self.family == "recurrent":
            cell = {"lstm": "LSTM", "gru": "GRU", "bilstm2": "2-layer biLSTM"}[self.model]
            return f"{cell} 128, T {SEQ_LEN}, {how}, batch {self.batch}"
        if self.family == "image":
            net = {"vit": "ViT", "convnext": "ConvNeXt-style"}[self.model]
            return f"{net} {IMAGE_SIZE}x{IMAGE_SIZE} {how}, batch {self.batch}"
        if self.epoch:
            return f"{self.model} head-only epoch ({EPOCH_SAMPLES} samples, batch {self.batch})"
        return f"{self.model} {how}, batch {self.batch}"


def _all() -> list[Config]:
    small = dict(warmup=30, steps=300)
    lenet = dict(warmup=20, steps=200)
    big = dict(warmup=3, steps=20)
    configs = [Config(f"mlp-b{b}", "mlp", b, **small) for b in (1, 32, 64)]
    configs += [Config(f"lenet-b{b}", "lenet", b, **lenet) for b in (32, 64)]
    for m in TORCHVISION:
        configs.append(Config(f"{m}-full", m, 8, **big))
        configs.append(Config(f"{m}-head", m, 8, head_only=True, **big))
    configs.append(
        Config("mobilenet_v2-epoch", "mobilenet_v2", 8, head_only=True, epoch=True, warmup=0, steps=0)
    )
    seq = dict(warmup=5, steps=100)  # tens to hundreds of ms a step: BUDGET_S bounds the slow ones
    for m in RECURRENT:
        configs.append(Config(f"{m}-b32-full", m, 32, **seq))
        configs.append(Config(f"{m}-b32-head", m, 32, head_only=True, **seq))
    configs.append(Config("lstm-b1-full", "lstm", 1, default=False, **seq))  # the keyboard's one sentence
    image = {"vit": 32, "convnext": 16}  # batches as issue 25 sets them (imagemodels.ARCHS)
    for m in IMAGE:
        configs.append(Config(f"{m}-full", m, image[m], **seq))
        configs.append(Config(f"{m}-head", m, image[m], head_only=True, **seq))
    return configs


CONFIGS = _all()
QUICK = ("mlp-b32", "lenet-b32")


def select(patterns: list[str] | None, *, quick: bool) -> list[Config]:
    """The configurations named by patterns (names or globs), in CONFIGS order; when None, the default run's (every
    row of issue 25's table; extras such as lstm-b1-full run when named). --quick: a few steps of the QUICK ones
    (unless patterns say otherwise)."""
    if patterns is None:
        patterns = list(QUICK) if quick else [c.name for c in CONFIGS if c.default]
    chosen = [c for c in CONFIGS if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in CONFIGS)]
    if unknown:
        raise SystemExit(f"bench: no configuration matches {unknown}; they are: {[c.name for c in CONFIGS]}")
    if quick:
        chosen = [replace(c, warmup=min(c.warmup, 3), steps=min(c.steps, 20)) for c in chosen]
    return chosen


# ---- issue 25's targets -------------------------------------------------------------------------------------------
# Ratio keys: "edgetrain_sgd/ort" is the like-for-like one (both plain SGD); "edgetrain/torch" both run SGD with
# momentum and weight decay. "edgetrain/ort" (edgetrain with momentum against plain SGD) is reported, not judged.
LIKE_FOR_LIKE = "edgetrain_sgd/ort"


def ratio_targets(c: Config) -> dict[str, float]:
    """{ratio key: the largest ratio that meets issue 25's target} for configuration c (medians, 1 thread)."""
    if c.epoch:
        return {
            "edgetrain/torch": 0.1
        }  # issue 12's: an epoch after the first at least 10x faster than PyTorch's
    if c.family == "mlp":
        return {LIKE_FOR_LIKE: 1.5 if c.batch == 1 else 1.0, "edgetrain/torch": 0.6}
    if c.family == "lenet":
        return {LIKE_FOR_LIKE: 0.7, "edgetrain/torch": 0.6}
    if c.head_only:
        return {}  # issue 25 judges the head-only steps by their memory only
    if c.family == "torchvision":
        return {"edgetrain/torch": 0.8}
    if c.family == "recurrent":
        return {"edgetrain/torch": 1.2 if c.model == "bilstm2" else 1.0} if c.batch == 32 else {}
    return {"edgetrain/torch": 0.9}  # the ViT and the ConvNeXt-style net


def rss_target(c: Config) -> float | None:
    """The largest peak RSS edgetrain / onnxruntime-training that meets issue 25's target (edgetrain with momentum,
    whose state onnxruntime-training's plain SGD does not hold); None where onnxruntime-training runs no step."""
    if c.epoch:
        return None
    return 0.6 if c.head_only else 0.8


IMPORT_TARGET_S = 0.15  # `import edgetrain`, numpy already imported
