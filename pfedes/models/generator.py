"""G, the paper form of pFedES's shared part: a tiny convolutional generator in front of each
private model that maps an image to an image-shaped tensor (two 3x3 convolutions, C->8->C
channels, ReLU between them, same padding: 443 parameters for C = 3)."""

import torch
from torch import nn


class ConvGenerator(nn.Module):
    """x (N x C x H x W) -> G(x) of the same shape (C = `channels`, 3 by default). With 8 hidden channels G can represent the
    identity (ReLU(x) and ReLU(-x) per channel), so F(G(x)) can start out as F(x)."""

    def __init__(self, channels: int = 3, hidden: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 3, padding=1), nn.ReLU(),
            nn.Conv2d(hidden, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
