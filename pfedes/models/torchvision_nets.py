"""Torchvision architectures adapted to small inputs (32x32 and other sizes from 16 up; their pooling
before the classifier is adaptive) and to any channel count; no pretrained weights: nothing is
downloaded."""

from torch import nn


class TorchvisionBackbone(nn.Module):
    """A torchvision classifier with its classifier replaced by a linear map to `feature_dim`."""

    def __init__(self, name: str, feature_dim: int = 256, in_channels: int = 3) -> None:
        super().__init__()
        # Imported here: torchvision.models costs seconds of start-up (it pulls in torch._dynamo),
        # which every ClientApp process of a deployment would pay even for the other architectures.
        from torchvision import models as tvm

        if name == "resnet18":
            net = tvm.resnet18(weights=None)
            # 32x32 inputs: 3x3 stride-1 stem and no max-pooling, as in the CIFAR ResNets.
            net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
            net.maxpool = nn.Identity()
            width = net.fc.in_features
            net.fc = nn.Identity()
        elif name == "mobilenet_v3_small":
            net = tvm.mobilenet_v3_small(weights=None)
            # 32x32 inputs: stride 1 in the stem keeps an 8x8 map before pooling instead of 1x1.
            stem = net.features[0][0]
            net.features[0][0] = nn.Conv2d(in_channels, stem.out_channels, 3, 1, 1, bias=False)
            width = net.classifier[0].in_features
            net.classifier = nn.Identity()
        else:
            raise ValueError(f"unknown torchvision architecture {name!r}")
        self.net = net
        self.fc = nn.Sequential(nn.Linear(width, feature_dim), nn.ReLU(inplace=True))
        self.out_dim = feature_dim

    def forward(self, x):
        return self.fc(self.net(x))
