"""The benchmark's workloads and issue 12's targets: configuration names -> Config records and target ratios.

Plain data with no imports beyond the standard library: the parent (tools/bench.py), the report and the tests all
read it, and so could a worker in onnxruntime-training's own virtual environment."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

TORCHVISION = ("mobilenet_v2", "mobilenet_v3_small", "resnet18", "efficientnet_b0")
# sequence classifiers (tools/bench/seqmodels.py): Embedding -> LSTM / GRU / 2-layer bidirectional LSTM -> Linear
RECURRENT = ("lstm", "gru", "bilstm2")
SEQ_LEN = 32  # tokens per sample (seqmodels.SEQ_LEN; this module imports nothing but the standard library)
RUNTIMES = ("edgetrain", "ort", "torch")
RUNTIME_NAMES = {"edgetrain": "edgetrain", "ort": "onnxruntime-training", "torch": "PyTorch eager"}

# SGD as the issue sets it; onnxruntime-training 1.19.2 has no momentum or weight decay (plain SGD there)
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
EPOCH_SAMPLES = 256  # the personalization epoch: samples per epoch (at the configuration's batch)
BUDGET_S = 20.0  # a worker stops timing after this many seconds once it has MIN_STEPS steps
MIN_STEPS = 5


@dataclass(frozen=True)
class Config:
    name: str
    model: str  # "mlp", "lenet", a torchvision classifier or a RECURRENT sequence classifier
    batch: int
    head_only: bool = False  # train the classifier only (the rest frozen)
    epoch: bool = False  # the head-only epoch comparison (Trainer vs PyTorch) instead of per-step timing
    warmup: int = 30
    steps: int = 300

    @property
    def family(self) -> str:
        if self.model in ("mlp", "lenet"):
            return self.model
        return "recurrent" if self.model in RECURRENT else "torchvision"

    @property
    def issue12(self) -> bool:
        """One of issue 12's workloads (its targets apply, the default run measures it); the recurrent ones are
        measured beside the peers for information, in their own document."""
        return self.family != "recurrent"

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
        if self.family == "recurrent":
            cell = {"lstm": "LSTM", "gru": "GRU", "bilstm2": "2-layer bidirectional LSTM"}[self.model]
            return f"{cell} 128, T {SEQ_LEN}, {'head-only' if self.head_only else 'full'}, batch {self.batch}"
        if self.epoch:
            return f"{self.model} head-only epoch ({EPOCH_SAMPLES} samples, batch {self.batch})"
        return f"{self.model} {'head-only' if self.head_only else 'full'}, batch {self.batch}"


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
    configs += [
        Config("lstm-b32-full", "lstm", 32, **seq),
        Config("lstm-b32-head", "lstm", 32, head_only=True, **seq),
        Config("lstm-b1-full", "lstm", 1, **seq),
        Config("gru-b32-full", "gru", 32, **seq),
        Config("bilstm2-b32-full", "bilstm2", 32, **seq),
    ]
    return configs


CONFIGS = _all()
QUICK = ("mlp-b32", "lenet-b32")


def select(patterns: list[str] | None, *, quick: bool) -> list[Config]:
    """The configurations named by patterns (names or globs), in CONFIGS order; when None, issue 12's (the
    recurrent ones run when named, e.g. 'lstm*'). --quick: a few steps of the QUICK ones (unless patterns say
    otherwise)."""
    if patterns is None:
        patterns = list(QUICK) if quick else [c.name for c in CONFIGS if c.issue12]
    chosen = [c for c in CONFIGS if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in CONFIGS)]
    if unknown:
        raise SystemExit(f"bench: no configuration matches {unknown}; they are: {[c.name for c in CONFIGS]}")
    if quick:
        chosen = [replace(c, warmup=min(c.warmup, 3), steps=min(c.steps, 20)) for c in chosen]
    return chosen


def output_stem(chosen: list[Config]) -> str:
    """The results' file name without extension: benchmarks-recurrent when only recurrent configurations run (so
    that they never replace issue 12's docs/benchmarks.*), else benchmarks."""
    return "benchmarks-recurrent" if chosen and all(c.family == "recurrent" for c in chosen) else "benchmarks"


# ---- issue 12's targets -------------------------------------------------------------------------------------------
def ratio_targets(c: Config) -> dict[str, float]:
    """{"edgetrain/ort" or "edgetrain/torch": the largest ratio that meets the target} for configuration c."""
    if not c.issue12:
        return {}  # measured for information: issue 12 sets no target for the recurrent models
    if c.epoch:
        return {"edgetrain/torch": 0.1}  # an epoch after the first at least 10x faster than PyTorch's
    if c.family == "mlp" and c.batch == 1:
        return {"edgetrain/ort": 1.5, "edgetrain/torch": 0.7}
    if c.family in ("mlp", "lenet"):
        return {"edgetrain/ort": 1.0, "edgetrain/torch": 0.7}
    return {} if c.head_only else {"edgetrain/torch": 1.0}


RSS_TARGET = 0.6  # edgetrain's peak RSS / onnxruntime-training's
IMPORT_TARGET_S = 0.15  # `import edgetrain`, numpy already imported
