"""The gpu-host profile: a small Vision Transformer for small images (32x32 by default)."""

import math

import torch
from torch import nn
from torch.nn import functional as F


def patch_size_for(image_size: tuple[int, int], grid: int = 8) -> int:
    """The patch side that cuts the shorter image side into about `grid` patches: ceil(min / grid)
    (4 for 32x32 and 28x28, 8 for 64x64, 2 for 16x16)."""
    return max(1, math.ceil(min(image_size) / grid))


class SmallViT(nn.Module):
    """Patches (4x4 on 32x32: 64 tokens) + class token, pre-norm encoder, class-token features.

    The patch grid follows the image size: the patch side is `patch_size_for(image_size)`, and
    an image whose sides it does not divide is zero-padded at the bottom and right to the next
    multiple (28x28 with 4x4 patches: a 7x7 grid, no padding; 30x45: 32x48, an 8x12 grid)."""

    def __init__(self, feature_dim: int = 256, dim: int = 96, depth: int = 4, heads: int = 4,
                 patch: int | None = None, image_size: int | tuple[int, int] = 32, in_channels: int = 3) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.patch = patch or patch_size_for((height, width))
        self.pad_h, self.pad_w = -height % self.patch, -width % self.patch
        self.patch_embed = nn.Conv2d(in_channels, dim, self.patch, self.patch)
        num_patches = ((height + self.pad_h) // self.patch) * ((width + self.pad_w) // self.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, feature_dim)
        self.out_dim = feature_dim

    def forward(self, x):
        if self.pad_h or self.pad_w:
            x = F.pad(x, (0, self.pad_w, 0, self.pad_h))
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + self.pos_embed
        return torch.relu(self.fc(self.norm(self.encoder(tokens)[:, 0])))
