"""The gateway profile: a residual CNN with BatchNorm (ResNet-8 style, sized for CPUs)."""

from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetBN(nn.Module):
    """Stem + three residual stages (16, 32, 64 channels) + global average pooling + linear
    (any input size: the pooling is global)."""

    def __init__(self, feature_dim: int = 256, widths=(16, 32, 64), blocks=(1, 1, 1), in_channels: int = 3) -> None:
        super().__init__()
        layers = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                  nn.ReLU(inplace=True)]
        c_in = widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(c_in, width, 2 if (i > 0 and j == 0) else 1))
                c_in = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, feature_dim),
                   nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.out_dim = feature_dim

    def forward(self, x):
        return self.features(x)
