"""The benchmark's transformer-era image classifiers in PyTorch (needs torch): a small ViT and a ConvNeXt-style net,
both on 3x32x32 images and 10 classes, written as timm writes them (its own q/k/v attention, pre-LayerNorm blocks,
exact GELU; ConvNeXt's channels-last LayerNorm and layer scale) but small enough for a phone.

The parent (tools/bench/prepare.py) builds one under a fixed seed, exports it to ONNX and pickles that very module
for the PyTorch worker, so all three runtimes start from the same weights by construction. The worker unpickles it
with this folder on its path (it is the worker script's own folder): pickle imports this module by name, and this
module imports torch only."""

from __future__ import annotations

import torch

nn = torch.nn

IMAGE, CLASSES = 32, 10  # 3 x IMAGE x IMAGE inputs
HEAD = "head"  # the classifier: head-only fine-tuning trains head.weight and head.bias


# ---- ViT ----------------------------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head self-attention as timm writes it: one qkv Linear, softmax(q k^T / sqrt(d)) v, an output Linear."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        y = attn.softmax(dim=-1) @ v  # [b, heads, n, d]
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with exact GELU."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Patch 4 (64 patches + a class token), dim 128, depth 4, 4 heads, MLP 256; classifies the class token."""

    def __init__(self, patch: int = 4, dim: int = 128, depth: int = 4, heads: int = 4, hidden: int = 256):
        super().__init__()
        patches = (IMAGE // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        # timm's initialization of the learned tokens: normal with std 0.02
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [b, patches, dim]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# ---- ConvNeXt-style -----------------------------------------------------------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor, as timm's LayerNorm2d: permute to channels-last and back."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 -> channels-last LayerNorm -> Linear C->4C -> GELU -> Linear 4C->C -> layer scale -> residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))  # ConvNeXt's layer scale initialization

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC: the LayerNorm and Linears act on channels
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """Stem 4x4/4 to 64 + LayerNorm, 2 blocks at 64, LayerNorm + 2x2/2 conv to 128, 2 blocks at 128, global average
    pool, LayerNorm, Linear to 10."""

    def __init__(self, dims: tuple[int, int] = (64, 128), depths: tuple[int, int] = (2, 2)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0]))
        self.stage1 = nn.Sequential(*[ConvNeXtBlock(dims[0]) for _ in range(depths[0])])
        self.downsample = nn.Sequential(LayerNorm2d(dims[0]), nn.Conv2d(dims[0], dims[1], 2, stride=2))
        self.stage2 = nn.Sequential(*[ConvNeXtBlock(dims[1]) for _ in range(depths[1])])
        self.norm = nn.LayerNorm(dims[1])
        self.head = nn.Linear(dims[1], CLASSES)

    def forward(self, x):
        x = self.stage2(self.downsample(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean(dim=(2, 3))))


# configuration model name -> (class, batch the issue sets)
ARCHS = {"vit": (ViT, 32), "convnext": (ConvNeXt, 16)}


def build(model: str, seed: int = 0) -> nn.Module:
    """The classifier with torch's default initialization (and timm's for the learned tokens) under a fixed seed,
    in eval mode (it has no dropout or BatchNorm anyway)."""
    torch.manual_seed(seed)
    return ARCHS[model][0]().eval()


def describe(model: str) -> str:
    if model == "vit":
        return "ViT 3x32x32, patch 4, dim 128, depth 4, 4 heads, MLP 256"
    return "ConvNeXt-style 3x32x32, stem 4/4 to 64, 2 blocks at 64, 2 at 128, layer scale"
