"""The architectures mobile teams personalize today, as small PyTorch modules of our own: each holds the kind of
tensor a weight-role reading misses (a layer scale, a class token and position table, a written-out norm, a tied
head, a GroupNorm below opset 18, buffers of preprocessing and masks, low-rank adapters). Needs torch."""

from __future__ import annotations

import math

import numpy as np
import torch

nn = torch.nn


class ConvNeXtish(nn.Module):
    """A ConvNeXt block (depthwise conv, channels-last LayerNorm, MLP, layer scale `gamma` on the MLP's output)
    and a MobileNetV4-style layer scale after a pointwise conv (`x * scale.view(-1, 1, 1)`)."""

    def __init__(self, dim: int = 8, classes: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.gamma = nn.Parameter(1e-2 * torch.ones(dim))
        self.conv = nn.Conv2d(dim, dim, 1)
        self.scale = nn.Parameter(0.5 * torch.ones(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y))))
        x = x + (self.gamma * y).permute(0, 3, 1, 2)
        x = x + self.conv(x) * self.scale.view(-1, 1, 1)
        return self.head(x.mean((2, 3)))


class ViTish(nn.Module):
    """A vision transformer: patches, a class token joined by Concat, a learned position table added, one
    attention block, the class token's features to the head."""

    def __init__(self, dim: int = 16, classes: int = 5, patches: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, patches + 1, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.proj(att @ v)
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))
        return self.head(x[:, 0])


class NoNorm(nn.Module):
    """MobileBERT's NoNorm: x * weight + bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return x * self.weight + self.bias


class MobileBERTish(nn.Module):
    """Token and position embeddings, then bottlenecks normalized by NoNorm, a mean over positions, a head."""

    def __init__(self, vocab: int = 30, seq: int = 6, dim: int = 16, classes: int = 5):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.norm0 = NoNorm(dim)
        self.down, self.up = nn.Linear(dim, dim // 2), nn.Linear(dim // 2, dim)
        self.norm1 = NoNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.register_buffer("position_ids", torch.arange(seq)[None])

    def forward(self, ids):
        x = self.norm0(self.tokens(ids) + self.positions(self.position_ids))
        x = self.norm1(x + self.up(torch.relu(self.down(x))))
        return self.head(x.mean(1))


class AudioFrontEnd(nn.Module):
    """wav2vec2's feature encoder: strided Conv1d, a GroupNorm with one group per channel, GELU, more convs; then a
    mean over time and a head. Below opset 18 the GroupNorm exports as InstanceNormalization of ones and zeros
    followed by the real affine."""

    def __init__(self, channels: int = 8, classes: int = 5):
        super().__init__()
        self.conv0 = nn.Conv1d(1, channels, 10, stride=5, bias=False)
        self.norm = nn.GroupNorm(channels, channels)
        self.conv1 = nn.Conv1d(channels, channels, 3, stride=2, bias=False)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2)
        self.head = nn.Linear(channels, classes)

    def forward(self, wave):
        x = nn.functional.gelu(self.norm(self.conv0(wave)))
        x = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(x))))
        return self.head(x.mean(2))


class MaskedEncoder(nn.Module):
    """Input normalization held in buffers (mean, std) and a causal attention mask held in a buffer (-inf above
    the diagonal), around learned projections: only the projections train."""

    def __init__(self, features: int = 6, seq: int = 5, dim: int = 8, classes: int = 5):
        super().__init__()
        self.register_buffer("mean", torch.linspace(-1, 1, features))
        self.register_buffer("std", torch.linspace(0.5, 2, features))
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))
        self.inp, self.qk, self.out = (
            nn.Linear(features, dim),
            nn.Linear(dim, 2 * dim),
            nn.Linear(dim, classes),
        )

    def forward(self, x):
        h = self.inp((x - self.mean) / self.std)
        q, k = self.qk(h).chunk(2, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]) + self.mask, dim=-1)
        return self.out((att @ h).mean(1))


class LoRALinear(nn.Module):
    """A frozen Linear and its low-rank adapter, as peft writes it: y = base(x) + scale * lora_B(lora_A(x))."""

    def __init__(self, base: nn.Linear, rank: int = 2, alpha: float = 4.0):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


class LoRAClassifier(nn.Module):
    """A two-layer MLP whose layers carry LoRA adapters (base weights frozen, as peft leaves them)."""

    def __init__(self, features: int = 12, hidden: int = 16, classes: int = 5):
        super().__init__()
        self.fc1 = LoRALinear(nn.Linear(features, hidden))
        self.fc2 = LoRALinear(nn.Linear(hidden, classes))
        for layer in (self.fc1, self.fc2):
            layer.base.requires_grad_(False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


# name -> (class, the example input's shape without the batch, integer input's vocabulary or None)
FAMILIES = {
    "convnext": (ConvNeXtish, (3, 16, 16), None),
    "vit": (ViTish, (3, 8, 8), None),
    "mobilebert": (MobileBERTish, (6,), 30),
    "audio": (AudioFrontEnd, (1, 160), None),
    "masked": (MaskedEncoder, (5, 6), None),
    "lora": (LoRAClassifier, (12,), None),
}


def example(name: str, batch: int, seed: int = 0) -> np.ndarray:
    _, shape, vocab = FAMILIES[name]
    rng = np.random.default_rng(seed)
    if vocab is not None:
        return rng.integers(0, vocab, (batch, *shape))
    return rng.standard_normal((batch, *shape)).astype(np.float32)
