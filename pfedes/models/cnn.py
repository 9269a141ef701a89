"""The phone profile: a 3-layer CNN."""

from torch import nn


class CNN3(nn.Module):
    """Three conv layers (32-64-64 channels, 2x2 max-pooling after the first two, max-pooling to
    a 4x4 grid after the third) and a linear layer. On 32x32 inputs the last pooling is 2x2 as
    well; other sizes (16 and more) reach the same 4x4 grid, so the linear layer keeps its shape."""

    def __init__(self, feature_dim: int = 256, in_channels: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveMaxPool2d(4),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, feature_dim), nn.ReLU(inplace=True),
        )
        self.out_dim = feature_dim

    def forward(self, x):
        return self.features(x)
