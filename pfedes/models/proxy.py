"""E_proxy: the one small feature extractor that every client shares."""

import torch
from torch import nn
from torch.nn import functional as F


class InputNorm(nn.Module):
    """Standardises each input over (C, H, W), so [0, 1] and [0, 255] inputs look the same."""

    def forward(self, x):
        return F.layer_norm(x, x.shape[1:])


class ProxyExtractor(nn.Module):
    """Input normalisation, three conv layers (16-32-64), global pooling, linear map to d."""

    def __init__(self, proxy_dim: int = 128) -> None:
        super().__init__()
        self.norm = InputNorm()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.out = nn.Linear(64, proxy_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(self.norm(x)))
