"""Device profile -> architecture, and the three-part client model (F_k, H_k, P_k)."""

from collections.abc import Callable, Mapping

import torch
from torch import nn

from .cnn import CNN3
from .resnet import ResNetBN
from .torchvision_nets import TorchvisionBackbone
from .vit import SmallViT

# name -> builder(feature_dim, in_channels, image_size (height, width))
ARCHITECTURES: dict[str, Callable[[int, int, tuple[int, int]], nn.Module]] = {
    "cnn3": lambda d, c, size: CNN3(d, in_channels=c),
    "resnet_bn": lambda d, c, size: ResNetBN(d, in_channels=c),
    "vit_small": lambda d, c, size: SmallViT(d, image_size=size, in_channels=c),
    "resnet18": lambda d, c, size: TorchvisionBackbone("resnet18", d, in_channels=c),
    "mobilenet_v3_small": lambda d, c, size: TorchvisionBackbone("mobilenet_v3_small", d, in_channels=c),
}


class ClientModel(nn.Module):
    """A private backbone F_k, a classification head H_k and a projection head P_k."""

    def __init__(self, backbone: nn.Module, num_classes: int, proxy_dim: int) -> None:
        super().__init__()
        width = backbone.out_dim
        self.backbone = backbone
        self.head = nn.Linear(width, num_classes)
        self.projection = nn.Sequential(nn.Linear(width, proxy_dim), nn.LayerNorm(proxy_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def resolve_architecture(device: str, profiles: Mapping[str, str]) -> str:
    """A device profile name (phone, gateway, gpu-host) or an architecture name -> architecture."""
    arch = profiles.get(device, device)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unknown device or architecture {device!r}: expected one of the profiles "
            f"{sorted(profiles)} or architectures {sorted(ARCHITECTURES)}"
        )
    return arch


def build_client_model(arch: str, num_classes: int, proxy_dim: int, feature_dim: int, in_channels: int = 3,
                       image_size: tuple[int, int] = (32, 32)) -> ClientModel:
    """The client model for images of `in_channels` x `image_size` (height, width)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}: expected one of {sorted(ARCHITECTURES)}")
    return ClientModel(ARCHITECTURES[arch](feature_dim, in_channels, tuple(image_size)), num_classes, proxy_dim)
