"""The phone profile: a 3-layer CNN."""

from torch import nn


class CNN3(nn.Module):
    """Three conv layers (32-64-64 channels, each followed by 2x2 max-pooling) and a linear layer."""

    def __init__(self, feature_dim: int = 256) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, feature_dim), nn.ReLU(inplace=True),
        )
        self.out_dim = feature_dim

    def forward(self, x):
        return self.features(x)
