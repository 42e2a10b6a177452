"""The benchmark's small ViT and ConvNeXt-style net (tools/bench/imagemodels.py: the very definitions the harness
times) exported to ONNX as users export them, with either exporter and at a chosen opset, plus a seeded batch and
the map from each torch parameter to the ONNX initializer holding it. Needs torch (and onnxscript for dynamo)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "bench"))  # imagemodels lives with the benchmark that times it
import imagemodels  # noqa: E402  (on the path just above)
from exports import export_module, float_tensors, map_tensors, perturb  # noqa: E402

MODELS = tuple(imagemodels.ARCHS)  # ("vit", "convnext")
BATCHES = {m: b for m, (_, b) in imagemodels.ARCHS.items()}  # the batches: ViT 32, ConvNeXt 16


@dataclass(frozen=True, eq=False)
class Export:
    path: Path
    model: str
    exporter: str
    opset: int | None
    batch: int
    module: torch.nn.Module  # shared by every test: copy before changing it
    names: dict[str, str]  # torch parameter -> ONNX initializer
    transposed: frozenset[str]  # torch parameters the ONNX stores transposed (Linear -> MatMul)

    def data(self, batch: int | None = None, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        n = batch or self.batch
        x = rng.standard_normal((n, 3, imagemodels.IMAGE, imagemodels.IMAGE)).astype(np.float32)
        return x, rng.integers(0, imagemodels.CLASSES, n).astype(np.int64)

    def onnx(self) -> onnx.ModelProto:
        return onnx.load(str(self.path))


def build(model: str, seed: int = 0) -> torch.nn.Module:
    """The harness's module, every parameter perturbed (fresh all-ones LayerNorm scales would be stored once by the
    TorchScript exporter, tying what torch trains apart); ConvNeXt's layer scales (1e-6) get seeded values large
    enough that its blocks matter in a 3-step test."""
    module = imagemodels.build(model, seed)
    perturb(module, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("gamma"):
                p.copy_(0.1 + 0.05 * torch.rand(p.shape, generator=gen))
    return module


@functools.cache
def export(
    model: str, directory: str, *, exporter: str = "torchscript", opset: int | None = None, batch: int = 0
) -> Export:
    """The model exported into directory at a fixed batch (its benchmark batch when 0), cached per session."""
    batch = batch or BATCHES[model]
    module = build(model)
    path = Path(directory) / f"{model}-{exporter}-{opset or 'default'}-b{batch}.onnx"
    rng = np.random.default_rng(4)
    x = torch.from_numpy(
        rng.standard_normal((batch, 3, imagemodels.IMAGE, imagemodels.IMAGE)).astype(np.float32)
    )
    export_module(module, x, path, exporter=exporter, mode="eval", opset=opset)
    proto = onnx.load(str(path))
    # dynamo folds the class token's Expand to the fixed batch into a constant: it cannot train there
    absent = ("cls_token",) if exporter == "dynamo" else ()
    names, transposed = map_tensors(float_tensors(module.named_parameters()), proto, absent=absent)
    return Export(path, model, exporter, opset, batch, module, names, transposed)
