"""The gpu-host profile: a small Vision Transformer for 32x32 inputs."""

import torch
from torch import nn


class SmallViT(nn.Module):
    """4x4 patches (64 tokens) + class token, pre-norm encoder, class-token features."""

    def __init__(self, feature_dim: int = 256, dim: int = 96, depth: int = 4, heads: int = 4,
                 patch: int = 4, image_size: int = 32) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        num_patches = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, feature_dim)
        self.out_dim = feature_dim

    def forward(self, x):
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + self.pos_embed
        return torch.relu(self.fc(self.norm(self.encoder(tokens)[:, 0])))
